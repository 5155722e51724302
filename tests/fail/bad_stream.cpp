// Must not compile: a stream policy without execute().
#include <torchloom/torchloom.hpp>

struct not_a_stream {
  explicit not_a_stream(const torchloom::model_context&) {}
};

auto n = sizeof(torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook,
                                        not_a_stream>);
