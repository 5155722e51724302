#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/fused_replay.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/check.hpp>
#include <torchloom/cuda/fused_graph.hpp>
#include <torchloom/cuda/graph_entry.hpp>
#include <torchloom/cuda/graph_signature.hpp>
#include <torchloom/cuda/graph_values.hpp>
#include <torchloom/cuda/torch_cuda_graph.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGraph.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom::detail {

// Wraps the entry's graph between memcpy nodes (see fused_graph), with this replay's inputs
// and fresh outputs as the nodes' first operands. Null when torch keeps no cudaGraph_t, for
// a green context's graph (not `fusable`: a memcpy node of ours would run outside its
// partition), when an input or output is not one plain copy, or when CUDA refuses the
// wrapping: replays then copy around the graph as before.
template <class Inputs, class Result>
std::unique_ptr<fused_graph> fuse(graph_entry& e, const Inputs& inputs, const graph_signature& sig,
                                  const Result& out, bool fusable) {
  if (!std::is_constructible_v<at::cuda::CUDAGraph, bool> || !fusable) {
    return nullptr;
  }
  const std::vector<at::Tensor>& statics = e.flat_outputs;
  std::vector<at::Tensor> fresh_outputs;
  flatten(out, fresh_outputs);
  if (statics.size() != fresh_outputs.size()) return nullptr;
  std::vector<std::size_t> in_bytes;
  for (std::size_t i = 0; i < e.static_inputs.size(); ++i) {
    const std::size_t bytes = plain_bytes(*tensor_of(inputs[i]), e.static_inputs[i], sig);
    if (bytes == 0) return nullptr;
    in_bytes.push_back(bytes);
  }
  for (std::size_t k = 0; k < statics.size(); ++k) {
    if (!statics[k].is_contiguous() || fresh_outputs[k].nbytes() == 0 ||
        fresh_outputs[k].scalar_type() != statics[k].scalar_type()) {
      return nullptr;
    }
  }
  auto f = std::make_unique<fused_graph>();
  const auto failed = [](cudaError_t rc) {
    if (rc == cudaSuccess) return false;
    (void)cudaGetLastError();
    return true;
  };
  try {
    if (failed(cudaGraphCreate(&f->graph, 0))) return nullptr;
    for (std::size_t i = 0; i < in_bytes.size(); ++i) {
      cudaGraphNode_t node = nullptr;
      if (failed(cudaGraphAddMemcpyNode1D(&node, f->graph, nullptr, 0,
                                          e.static_inputs[i].data_ptr(),
                                          tensor_of(inputs[i])->data_ptr(), in_bytes[i],
                                          cudaMemcpyDeviceToDevice))) {
        return nullptr;
      }
      f->in_nodes.push_back(node);
      f->now.push_back({e.static_inputs[i].data_ptr(), tensor_of(inputs[i])->data_ptr(),
                        in_bytes[i]});
    }
    const cudaGraph_t captured = raw_graph(*e.graph);
    cudaGraphNode_t body = nullptr;
    if (captured == nullptr ||
        failed(cudaGraphAddChildGraphNode(&body, f->graph, f->in_nodes.data(),
                                          f->in_nodes.size(), captured))) {
      return nullptr;
    }
    for (std::size_t k = 0; k < statics.size(); ++k) {
      cudaGraphNode_t node = nullptr;
      if (failed(cudaGraphAddMemcpyNode1D(&node, f->graph, &body, 1,
                                          fresh_outputs[k].data_ptr(), statics[k].data_ptr(),
                                          fresh_outputs[k].nbytes(),
                                          cudaMemcpyDeviceToDevice))) {
        return nullptr;
      }
      f->out_nodes.push_back(node);
      f->now.push_back(
          {fresh_outputs[k].data_ptr(), statics[k].data_ptr(), fresh_outputs[k].nbytes()});
    }
    if (failed(cudaGraphInstantiateWithFlags(&f->exec, f->graph, 0))) return nullptr;
  } catch (const std::exception&) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return f;
}

// One launch: the caller's inputs into the static buffers, the graph, the static outputs
// into fresh tensors (made here, on the run's stream, before the launch). A node is pointed
// anew only where its tensors moved: a caller that lets go of a run's outputs before the next
// run usually gets the same blocks back from the caching allocator. False, with nothing
// launched, when this run's tensors do not fit the memcpy nodes (an input not one plain copy,
// memory CUDA will not put in the node): the caller copies around the graph instead.
template <class Inputs, class Result>
bool launch_fused(const std::string& model, fused_graph& f, const graph_entry& e,
                  const Inputs& inputs, const graph_signature& sig, cudaStream_t stream,
                  Result& out) {
  // Node j (inputs' first): points it at dst, src, n unless it points there already.
  const auto set = [&f](std::size_t j, cudaGraphNode_t node, void* dst, const void* src,
                        std::size_t n) {
    auto& now = f.now[j];
    if (now.dst == dst && now.src == src && now.bytes == n) return true;
    if (cudaGraphExecMemcpyNodeSetParams1D(f.exec, node, dst, src, n,
                                           cudaMemcpyDeviceToDevice) == cudaSuccess) {
      now = {dst, src, n};
      return true;
    }
    (void)cudaGetLastError();
    now = {};  // unknown: set again next time
    return false;
  };
  for (std::size_t i = 0; i < e.static_inputs.size(); ++i) {
    const at::Tensor& t = *tensor_of(inputs[i]);
    const std::size_t bytes = plain_bytes(t, e.static_inputs[i], sig);
    if (bytes == 0 ||
        !set(i, f.in_nodes[i], e.static_inputs[i].data_ptr(), t.data_ptr(), bytes)) {
      return false;
    }
  }
  std::size_t k = 0;
  bool ok = true;
  const std::size_t first_out = f.in_nodes.size();
  const auto make = [&](const at::Tensor& s) {
    at::Tensor o = output_like(s, sig);
    ok = ok && k < f.out_nodes.size() && o.nbytes() > 0 &&
         set(first_out + k, f.out_nodes[k], o.data_ptr(), s.data_ptr(), o.nbytes());
    ++k;
    return o;
  };
  Result result = map_outputs<Result>(e, make);
  if (!ok || k != f.out_nodes.size()) return false;
  cuda::check(cudaGraphLaunch(f.exec, stream), model, "graphed: cudaGraphLaunch");
  out = std::move(result);
  return true;
}

}  // namespace torchloom::detail
