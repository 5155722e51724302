// The CUDA code paths, compiled where LibTorch was built without CUDA: with TORCHLOOM_HAS_CUDA
// forced on against the CUDA toolkit's headers and LibTorch's own c10/cuda headers, every
// member of a runner with each CUDA policy is instantiated. Nothing is linked or run; this
// keeps code that only a GPU build compiles from breaking unseen (the GPU script runs it).
#include <torchloom/torchloom.hpp>

namespace tl = torchloom;

// A loader with a tensor path (as aoti_loader, which this LibTorch may not have): its runners'
// run_tensors() lend tensors to the stream policy and get a tensor vector back.
struct tensor_path_loader {
  struct model_type {};
  static constexpr std::string_view default_filename = "model";
  model_type load(const tl::load_context&) const;
  tl::input_signature signature(const model_type&) const;
  c10::IValue run(model_type&, std::vector<c10::IValue>&&, const tl::run_context&) const;
  std::vector<at::Tensor> run_tensors(model_type&, const std::vector<at::Tensor>&,
                                      const tl::run_context&) const;
};

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
template class tl::model_runner<tensor_path_loader, tl::no_hook, tl::graphed<tl::pool_stream>>;
template class tl::model_runner<tensor_path_loader, tl::no_hook, tl::green_context_stream>;
template class tl::model_runner<tensor_path_loader, tl::no_hook, tl::adaptive_stream>;
