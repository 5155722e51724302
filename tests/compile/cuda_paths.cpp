// The CUDA code paths, compiled where LibTorch was built without CUDA: with TORCHLOOM_HAS_CUDA
// forced on against the CUDA toolkit's headers and LibTorch's own c10/cuda headers, every
// member of a runner with each CUDA policy is instantiated. Nothing is linked or run; this
// keeps code that only a GPU build compiles from breaking unseen (the GPU script runs it).
#include <torchloom/torchloom.hpp>

namespace tl = torchloom;

template class tl::model_runner<tl::torchscript_loader, tl::no_hook, tl::pool_stream,
                                tl::streamed_weights>;
template class tl::model_runner<tl::torchscript_loader, tl::no_hook, tl::adaptive_stream,
                                tl::mapped_weights>;
template class tl::model_runner<tl::torchscript_loader, tl::no_hook, tl::green_context_stream,
                                tl::shared_weights>;
template class tl::model_runner<tl::torchscript_loader, tl::no_hook,
                                tl::graphed<tl::green_context_stream>, tl::mapped_weights>;
template class tl::model_runner<tl::torchscript_loader, tl::no_hook, tl::graphed<tl::pool_stream>,
                                tl::resident_weights>;
