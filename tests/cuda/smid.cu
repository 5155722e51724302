// A kernel that reports the SM each of its blocks ran on, to check that green contexts
// really confine kernels to their partition. Built by nvcc, with no torch headers.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace {

// ~20 us at H100 clocks: long enough that the block scheduler has to spread the blocks over
// every SM it may use instead of reusing the first few.
constexpr long long spin_cycles = 40000;

__global__ void smid_kernel(unsigned* out) {
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  if (threadIdx.x == 0) {
    unsigned id = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    out[blockIdx.x] = id;
  }
}

}  // namespace

//! Launches `blocks` blocks of 256 threads on `stream`; block i writes its SM id to out[i].
//! Throws std::runtime_error when the launch fails.
void launch_smid_kernel(unsigned* out, int blocks, cudaStream_t stream) {
  smid_kernel<<<blocks, 256, 0, stream>>>(out);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("launch_smid_kernel: ") + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
  }
}
