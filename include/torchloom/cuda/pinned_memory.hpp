#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/pinned_memory.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/check.hpp>
#include <torchloom/detail/strings.hpp>

#include <c10/core/Device.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace torchloom::cuda {

//! Registers the host memory [data, data + bytes) with CUDA as pinned memory, mapped into the
//! device's address space and usable from every device (cudaHostRegister with `device`
//! current), and returns its device address. Throws cuda_error naming `model`; the memory is
//! then left unregistered. Undo with unpin_host_memory before freeing it.
inline void* pin_host_memory(void* data, std::size_t bytes, c10::Device device,
                             const std::string& model) {
  const c10::cuda::CUDAGuard on_device(device);
  check(cudaHostRegister(data, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable), model,
        detail::concat("cudaHostRegister of ", bytes, " bytes of weights"));
  void* mapped_address = nullptr;
  const cudaError_t mapped = cudaHostGetDevicePointer(&mapped_address, data, 0);
  if (mapped != cudaSuccess) (void)cudaHostUnregister(data);
  check(mapped, model, "cudaHostGetDevicePointer for the weights");
  return mapped_address;
}

//! Undoes pin_host_memory (before the memory is freed).
inline void unpin_host_memory(void* data) noexcept { (void)cudaHostUnregister(data); }

}  // namespace torchloom::cuda
