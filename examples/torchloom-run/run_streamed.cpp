// run_model for the runner types with streamed_weights.
#include "run_model.hpp"

template struct torchloom_run::runners_with<torchloom::residency_kind::streamed>;
