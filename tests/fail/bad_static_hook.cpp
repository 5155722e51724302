// Must not compile: static_hook<T> with a T whose fini may throw.
#include <torchloom/torchloom.hpp>

struct throwing_fini {
  static int init(const torchloom::model_context&) { return 0; }
  static void fini(int) {}
};

using runner =
    torchloom::model_runner<torchloom::torchscript_loader, torchloom::static_hook<throwing_fini>>;
runner* make(torchloom::model_spec spec) { return new runner(std::move(spec)); }
