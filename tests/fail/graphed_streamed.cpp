// Must not compile: graphed<Stream> with streamed_weights, whose copies a graph cannot replay.
#include <torchloom/torchloom.hpp>

#include <utility>

void make_graphed_streamed_runner(torchloom::model_spec spec) {
  torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook,
                          torchloom::graphed<torchloom::caller_stream>,
                          torchloom::streamed_weights>
      runner(std::move(spec), c10::Device(c10::kCUDA, 0));
}
