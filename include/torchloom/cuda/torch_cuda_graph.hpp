#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/torch_cuda_graph.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/check.hpp>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <type_traits>

namespace torchloom::detail {

// Keeps the captured cudaGraph_t (torch 2.8 and later can), so that fuse() can wrap it.
template <class Graph>
std::unique_ptr<Graph> make_graph() {
  if constexpr (std::is_constructible_v<Graph, bool>) {
    return std::make_unique<Graph>(/*keep_graph=*/true);
  } else {
    return std::make_unique<Graph>();
  }
}

// The captured graph, when this torch keeps it (see make_graph); else null.
template <class Graph>
cudaGraph_t raw_graph(Graph& g) {
  if constexpr (requires { g.raw_cuda_graph(); }) {
    return g.raw_cuda_graph();
  } else {
    return nullptr;
  }
}

// Whether this torch hands out the graph's executable (torch 2.8 and later do).
template <class Graph>
bool has_exec(Graph& g) {
  return requires { g.raw_cuda_graph_exec(); };
}

// Launches the graph's executable where this torch hands it out (see has_exec), else replays
// it through torch.
template <class Graph>
void launch_exec(const std::string& model, Graph& g, cudaStream_t stream) {
  if constexpr (requires { g.raw_cuda_graph_exec(); }) {
    cuda::check(cudaGraphLaunch(g.raw_cuda_graph_exec(), stream), model,
                "graphed: cudaGraphLaunch");
  } else {
    g.replay();
  }
}

}  // namespace torchloom::detail
