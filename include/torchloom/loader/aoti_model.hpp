#pragma once
// The model type of aoti_loader (torchloom/loader/aoti.hpp): a loaded AOTInductor package and
// what it declares. Needs LibTorch >= 2.6 (empty below).
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600
#include <torchloom/io_names.hpp>
#include <torchloom/loader/aoti_weights.hpp>
#include <torchloom/signature.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchloom {

//! A loaded AOTInductor package and what it declares.
struct aoti_model {
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package;
  //! Set when the package runs on torch's single-threaded runner (AOTI_NUM_RUNNERS=1, or CUDA
  //! graph capture): that runner takes no lock, so runs take this one, for the host's part of
  //! a call only (the launch; the GPU work of two calls on two streams still overlaps).
  std::unique_ptr<std::mutex> single_run;
  input_signature inputs;  //!< count and names from the package, dtype/shape where declared
  io_names names;  //!< Triton's forward-based names of its inputs and outputs (call spec)
  std::unordered_map<std::string, std::string> metadata;  //!< the package's metadata map
  c10::Device device{c10::kCPU};  //!< where it runs
  //! A package exported for streaming: its constants as installed (the weights on the
  //! device, or placeholders for streamed_weights; the package holds only their addresses)
  //! and its reads.
  std::vector<at::Tensor> weights;
  //! streamed_weights: the weights read from weights.pt, until the policy packs them.
  std::vector<at::Tensor> weights_on_host;
  std::unique_ptr<detail::package_reads> reads;
};

}  // namespace torchloom

#endif
