// Must not compile: streamed_weights with a loader that gives no weight access (no
// torchloom::weight_access specialisation for it).
#include "plain_loader.hpp"

auto n = sizeof(torchloom::model_runner<plain_loader, torchloom::no_hook, torchloom::caller_stream,
                                        torchloom::streamed_weights>);
