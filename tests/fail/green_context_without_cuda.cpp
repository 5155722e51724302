// Must not compile: green_context_stream in a build without CUDA (no torchloom::cuda).
#include <torchloom/torchloom.hpp>

#include <utility>

void make_green_runner(torchloom::model_spec spec) {
  torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook,
                          torchloom::green_context_stream>
      runner(std::move(spec), c10::Device(c10::kCUDA, 0));
}
