// Must not compile: a hook that cannot be constructed from a model_context.
#include <torchloom/torchloom.hpp>

struct not_a_hook {
  int init();
};

torchloom::model_runner<torchloom::torchscript_loader, not_a_hook>* p = nullptr;
auto n = sizeof(torchloom::model_runner<torchloom::torchscript_loader, not_a_hook>);
