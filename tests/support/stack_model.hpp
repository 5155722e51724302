#pragma once
// The residency tests' model: a stack of linear layers written as a Triton-layout directory,
// the runner types over each residency policy, and the offload options.
#include "fixtures.hpp"

#include <torchloom/torchloom.hpp>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace torchloom_test {

template <class Residency, class Stream = torchloom::caller_stream>
using runner_with =
    torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, Stream, Residency>;
using resident_runner = runner_with<torchloom::resident_weights>;
using streamed_runner = runner_with<torchloom::streamed_weights>;
using mapped_runner = runner_with<torchloom::mapped_weights>;

//! A stack of `layers` layers of `dim` x `dim` float weights, each a submodule, then a branch
//! that reads a buffer in both arms and a product that reads layer 0's weight again:
//!   layer i: relu(x @ W_i.T + b_i)   odd layers through torch.linear; even ones take the
//!                                    transposed view of W_i first and apply it after b_i's
//!                                    fetch, so W_i's bytes must stay until the view's use
//! Its fetches: W_i, b_i per layer (and b_i again in even layers), then `scale` (before the
//! branch), then W_0 again.
inline torch::jit::Module make_stack(int layers, std::int64_t dim) {
  torch::jit::Module top("stack");
  for (int i = 0; i < layers; ++i) {
    torch::jit::Module layer("layer");
    layer.register_parameter("weight", torch::randn({dim, dim}) / std::sqrt(double(dim)), false);
    layer.register_parameter("bias", torch::randn({dim}), false);
    layer.define(i % 2 == 0 ? R"(
def forward(self, x):
    wt = self.weight.t()
    h = x + self.bias
    return torch.relu(torch.matmul(h, wt) - torch.matmul(self.bias, wt))
)"
                            : R"(
def forward(self, x):
    return torch.relu(torch.linear(x, self.weight, self.bias))
)");
    top.register_module("l" + std::to_string(i), layer);
  }
  top.register_buffer("scale", torch::rand({dim}) + 0.5);
  std::string code = "def forward(self, x):\n";
  for (int i = 0; i < layers; ++i) code += "    x = self.l" + std::to_string(i) + ".forward(x)\n";
  code += R"(    if bool(x.sum() > 0):
        x = x * self.scale
    else:
        x = x - self.scale
    return torch.matmul(x, self.l0.weight)
)";
  top.define(code);
  return top;
}

//! make_stack's model as the Triton-layout directory `m` of a temporary directory.
struct stack_model {
  temp_dir dir;
  std::int64_t dim;
  stack_model(int layers, std::int64_t dim_, std::string_view config = {}) : dim(dim_) {
    auto m = make_stack(layers, dim);
    write_triton_model(dir / "m", m, config);
  }
  torchloom::model_spec spec(std::map<std::string, std::string> options = {}) const {
    auto s = torchloom::model_spec::from_directory(dir / "m");
    s.set(options);
    return s;
  }
};

//! The options of streamed_weights: a budget of `mb` MiB and a prefetch depth.
inline std::map<std::string, std::string> budget(std::int64_t mb, int depth = 2) {
  return {{"WEIGHT_OFFLOAD_BUDGET_MB", std::to_string(mb)},
          {"WEIGHT_OFFLOAD_PREFETCH_DEPTH", std::to_string(depth)}};
}

#if TORCHLOOM_HAS_CUDA
//! Bytes torch's caching allocator holds allocated on `device` now.
inline std::int64_t allocated_on(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
}
#endif

}  // namespace torchloom_test
