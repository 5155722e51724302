#pragma once
// A pinned host buffer a GPU instance keeps to stage a request's bytes between host memory
// and its GPU (instance_state::run_single): one copy each way on the run stream, never an
// allocation per request.
#include <torchloom/cuda/check.hpp>
#include <torchloom/detail/strings.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <string>

namespace torchloom::triton_backend {

class pinned_staging {
 public:
  pinned_staging() = default;
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  ~pinned_staging() {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
  }

  // At least `bytes` (twice what it had, where that is more, up to `cap`); what it held is
  // lost when it grows, so nothing may be queued on it then. Throws cuda_error naming `model`.
  char* reserve(std::size_t bytes, const std::string& model,
                std::size_t cap = std::size_t{8} << 20) {
    if (bytes <= size_) return data_;
    constexpr std::size_t step = std::size_t{64} << 10;
    const std::size_t size =
        (std::max(bytes, std::min(cap, 2 * size_)) + step - 1) / step * step;
    void* p = nullptr;
    cuda::check(cudaHostAlloc(&p, size, cudaHostAllocPortable), model,
                detail::concat("cudaHostAlloc of ", size, " bytes to stage a request"));
    if (data_ != nullptr) (void)cudaFreeHost(data_);
    data_ = static_cast<char*>(p);
    size_ = size;
    return data_;
  }

 private:
  char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace torchloom::triton_backend
