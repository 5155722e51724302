// Must not compile: a type used as a loader that has no load/run/model_type.
#include <torchloom/torchloom.hpp>

struct not_a_loader {};

auto n = sizeof(torchloom::model_runner<not_a_loader>);
