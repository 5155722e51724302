#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/graph_entry.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/check.hpp>
#include <torchloom/cuda/fused_graph.hpp>
#include <torchloom/cuda/graph_signature.hpp>
#include <torchloom/cuda/graph_values.hpp>
#include <torchloom/cuda/torch_cuda_graph.hpp>
#include <torchloom/detail/strings.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Device.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace torchloom::detail {

// For the static helpers, which have no model name: the runner adds it.
inline void check_static(cudaError_t rc, const char* what) {
  cuda::check(rc, "", detail::concat("graphed: ", what));
}

// One input signature of graph_cache: its graph (once captured) and its static buffers.
struct graph_entry {
  std::string key;
  int seen = 0;
  bool uncapturable = false;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  // Launched with cudaGraphLaunch directly: the graph draws no random numbers, so torch's
  // replay() would only re-seed the generator (two small kernels per replay) for nothing.
  bool direct = false;
  bool replayed = false;
  std::vector<at::Tensor> static_inputs;
  c10::IValue static_outputs;
  std::vector<at::Tensor> flat_outputs;  // the tensors of static_outputs, in flatten()'s order
  // The copies folded into one launch with the graph (see fuse()); null until the first
  // direct replay, and for good when the graph cannot be wrapped so.
  std::unique_ptr<fused_graph> fused;
  bool fuse_tried = false;
};

// Copies the inputs into the entry's static buffers (only the real rows when padded).
template <class Inputs>
void copy_in(graph_entry& e, const Inputs& inputs, const graph_signature& sig,
             cudaStream_t stream) {
  for (std::size_t i = 0; i < e.static_inputs.size(); ++i) {
    const at::Tensor& t = *tensor_of(inputs[i]);
    at::Tensor dst = e.static_inputs[i];
    if (sig.bucket > 0 && dst.dim() > 0) dst = dst.narrow(0, 0, sig.batch);
    if (dst.is_contiguous() && t.is_contiguous() && dst.scalar_type() == t.scalar_type() &&
        dst.numel() == t.numel()) {
      // The same bytes: one copy, without the dispatcher and TensorIterator around it.
      check_static(cudaMemcpyAsync(dst.data_ptr(), t.data_ptr(), t.nbytes(),
                                   cudaMemcpyDeviceToDevice, stream),
                   "cudaMemcpyAsync");
    } else {
      dst.copy_(t, /*non_blocking=*/true);
    }
  }
}

// The bytes of input `t` that go into static buffer `dst` as one plain copy (the same dtype,
// both contiguous, only the real rows when padded), or 0 when it needs torch's copy_.
inline std::size_t plain_bytes(const at::Tensor& t, const at::Tensor& dst,
                               const graph_signature& sig) {
  std::int64_t numel = dst.numel();
  if (sig.bucket > 0 && dst.dim() > 0 && dst.size(0) > 0) {
    numel = numel / dst.size(0) * sig.batch;
  }
  if (!t.is_contiguous() || !dst.is_contiguous() || t.scalar_type() != dst.scalar_type() ||
      t.numel() != numel) {
    return 0;
  }
  return t.nbytes();
}

// A fresh tensor for static output `s` of this replay (its real rows when padded), straight
// from the CUDA allocator on the current stream (the run's), without the dispatcher around
// at::empty; the same tensor as at::empty makes.
inline at::Tensor output_like(const at::Tensor& s, const graph_signature& sig) {
  if (sig.bucket > 0 && s.dim() > 0 && s.size(0) == sig.bucket) {
    std::vector<std::int64_t> shape(s.sizes().begin(), s.sizes().end());
    shape[0] = sig.batch;
    return at::Tensor(at::detail::empty_cuda(shape, s.options()));
  }
  return at::Tensor(at::detail::empty_cuda(s.sizes(), s.options()));
}

inline at::Tensor fresh(const at::Tensor& t, const graph_signature& sig, cudaStream_t stream) {
  const at::Tensor src =
      sig.bucket > 0 && t.dim() > 0 && t.size(0) == sig.bucket ? t.narrow(0, 0, sig.batch) : t;
  if (!src.is_contiguous()) return src.clone();
  // On the run's stream (current): the caching allocator ties the new block to it.
  at::Tensor out = at::empty(src.sizes(), src.options());
  check_static(cudaMemcpyAsync(out.data_ptr(), src.data_ptr(), src.nbytes(),
                               cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync");
  return out;
}

// The entry's static outputs with each tensor t replaced by fn(t), in flatten()'s order:
// in their structure (a tensor, a tuple, a list of tensors) or as a flat vector.
template <class Result, class Fn>
Result map_outputs(const graph_entry& e, Fn& fn) {
  if constexpr (std::is_same_v<Result, std::vector<at::Tensor>>) {
    std::vector<at::Tensor> out;
    out.reserve(e.flat_outputs.size());
    for (const at::Tensor& t : e.flat_outputs) out.push_back(fn(t));
    return out;
  } else {
    return map_structure(e.static_outputs, fn);
  }
}

// The first replay goes through torch's replay(), which advances the default generator by
// what the graph draws; when it draws nothing, later replays launch the graph directly.
inline void launch(const std::string& model, c10::DeviceIndex device, graph_entry& e,
                   cudaStream_t stream) {
  if (e.direct) {
    launch_exec(model, *e.graph, stream);
    return;
  }
  const at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device);
  const auto* state = gen.get<at::CUDAGeneratorImpl>();
  const std::uint64_t before = state->philox_offset_per_thread();
  e.graph->replay();
  if (!e.replayed) {
    e.replayed = true;
    e.direct = state->philox_offset_per_thread() == before && has_exec(*e.graph);
  }
}

// The outputs as the caller's own tensors: in the structure the model returned
// (c10::IValue), or flattened (std::vector<at::Tensor>).
template <class Result>
Result copy_out(const graph_entry& e, const graph_signature& sig, cudaStream_t stream) {
  const auto copy = [&](const at::Tensor& t) { return fresh(t, sig, stream); };
  return map_outputs<Result>(e, copy);
}

}  // namespace torchloom::detail
