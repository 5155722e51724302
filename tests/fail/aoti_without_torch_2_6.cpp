// Must not compile: aoti_loader with a LibTorch older than 2.6 (no AOTInductor package loader).
#include <torchloom/torchloom.hpp>

#include <utility>

void make_aoti_runner(torchloom::model_spec spec) {
  torchloom::model_runner<torchloom::aoti_loader> runner(std::move(spec));
}
