#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/fused_graph.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace torchloom::detail {

// The captured graph as the child of a graph of our own, between one memcpy node per input
// (the caller's tensor into the static buffer) and one per output (the static buffer into a
// fresh tensor). Each replay points the memcpy nodes at its tensors
// (cudaGraphExecMemcpyNodeSetParams1D) and launches once: no separate copies before and
// after, and no gaps between them on the GPU.
struct fused_graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<cudaGraphNode_t> in_nodes;
  std::vector<cudaGraphNode_t> out_nodes;
  // What each node copies now (inputs' nodes, then outputs'): a node whose tensors are those
  // of the last run (the same caller tensor, the allocator's same block) is left as it is.
  struct operands {
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<operands> now;

  fused_graph() = default;
  fused_graph(const fused_graph&) = delete;
  fused_graph& operator=(const fused_graph&) = delete;
  ~fused_graph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
};

}  // namespace torchloom::detail
