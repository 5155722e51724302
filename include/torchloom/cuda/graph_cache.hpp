#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/graph_cache.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif
#if TORCHLOOM_TORCH_VERSION < 20100
#error "torchloom/cuda/graph_cache.hpp needs LibTorch >= 2.1 (relaxed-mode capture, pool routing)"
#endif

#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/context.hpp>
#include <torchloom/cuda/check.hpp>
#include <torchloom/cuda/event.hpp>
#include <torchloom/cuda/owned_stream.hpp>
#include <torchloom/cuda/stream_lease.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/stream/graph_options.hpp>
#include <torchloom/stream/graph_stats.hpp>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#if __has_include(<ATen/core/CachingHostAllocator.h>)
#include <ATen/core/CachingHostAllocator.h>
#endif

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchloom::detail {
//! For tests: when set, the next graph replay throws right after its launch has gone out (as
//! a failed output allocation or copy would), and the flag is cleared. One relaxed load per
//! replay.
inline std::atomic<bool> fail_next_replay_after_launch{false};
}  // namespace torchloom::detail

namespace torchloom::cuda {

//! One runner's CUDA graphs, keyed by input signature (see graphed<Stream> in
//! torchloom/stream/graphed.hpp for the behaviour). All graphs share one private memory pool;
//! replays of one runner are chained by an event on the GPU, so no two replays ever touch the
//! shared pool or one graph's static buffers at the same time, whichever streams they run on.
//! Captures run on a stream of the cache's own (for a green context, one made in that
//! context; else one leased for the cache's life, see stream_lease, so that caches made and
//! dropped at every model load add no cuBLAS workspaces), never on a stream other runs use:
//! another thread's kernels queued there during a capture would be captured instead of run.
//! Thread-safe. Throws cuda_error (constructor) when a CUDA call fails.
class graph_cache {
 public:
  //! Eager runs of a new signature before it is captured (see graph_stats.hpp).
  static constexpr int eager_runs_before_capture = graph_eager_runs_before_capture;

  //! `capture_stream`: the stream captures run on (empty: the cache leases one, see
  //! stream_lease). `fusable`: replays may wrap the graph between copy nodes of their own
  //! (false for a green context's graphs, whose nodes must all run in the context).
  graph_cache(std::string model, c10::Device device, const graph_options& options,
              owned_stream capture_stream, bool fusable)
      : model_(std::move(model)),
        device_(device),
        max_shapes_(static_cast<std::size_t>(options.cuda_graph_max_shapes.value)),
        buckets_(options.cuda_graph_batch_sizes),
        fusable_(fusable),
        capture_stream_(std::move(capture_stream)) {
    c10::cuda::CUDAGuard guard(device_);
    done_ = event(model_);
    ready_ = event(model_);
    if (!capture_stream_) capture_lease_ = stream_lease(model_, device_.index());
    pool_ = at::cuda::graph_pool_handle();
    // torch's switch for its uncached allocator (read as torch reads it): tensors freed at
    // the end of a capture are then given back to CUDA while the graph still uses them, so
    // nothing is captured.
    uncached_allocator_ = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING") != nullptr;
  }

  graph_cache(const graph_cache&) = delete;
  graph_cache& operator=(const graph_cache&) = delete;

  ~graph_cache() {
    c10::cuda::CUDAGuard guard(device_);
    // The last replay may still run: its graph and buffers go only after it.
    (void)cudaEventSynchronize(done_.get());
    entries_.clear();
    index_.clear();
    if (held_.device) release_device_pool(device_.index(), pool_);
    if (held_.host) host_pool_call(pool_, [](auto& host, auto id) { host.release_pool(id); });
  }

  //! Runs `body` through `inner` (the wrapped stream policy): eagerly for a signature seen
  //! fewer than eager_runs_before_capture times or that cannot be captured, else by replaying
  //! its graph (captured on the spot the first time). A replay returns fresh output tensors,
  //! of the kind the body returns (c10::IValue or std::vector<at::Tensor>). `inputs`: a
  //! vector of c10::IValue, or lent_tensors (see stream_policy).
  template <class Inner, class Inputs, class Body>
  detail::run_result_t<Body, Inputs> run(Inner& inner, c10::Device device, Inputs inputs,
                                         Body&& body) {
    using result = detail::run_result_t<Body, Inputs>;
    const std::optional<signature> sig = signature_of(given(inputs));
    bool eager = true;
    bool warm_up = false;
    {
      std::lock_guard lock(mutex_);
      if (sig) {
        entry& e = touch(*sig);
        eager = e.uncapturable || (!e.graph && e.seen < eager_runs_before_capture);
        warm_up = eager && !e.uncapturable;
      }
      if (eager) ++stats_.eager_runs;
    }
    // Eager runs go outside the lock: they overlap as they do without graphs.
    if (eager) {
      auto out = inner.execute(device, std::move(inputs), std::forward<Body>(body));
      // Counted once finished: a capture never starts while the runs that set up what it
      // needs (handles, workspaces, the TorchScript executor's plan) are still under way.
      if (warm_up) {
        std::lock_guard lock(mutex_);
        if (auto it = index_.find(sig->key); it != index_.end()) ++it->second->seen;
      }
      return out;
    }
    return inner.execute(device, std::move(inputs), [&](const run_context& rc, Inputs&& in) {
      std::unique_lock lock(mutex_);
      // Looked up again: another thread may have pushed it out meanwhile.
      entry& e = touch(*sig);
      if (!e.graph && !e.uncapturable) capture(e, rc, in, body, *sig);
      if (e.uncapturable) {
        ++stats_.eager_runs;
        lock.unlock();
        return body(rc, std::move(in));
      }
      return replay<result>(e, rc, given(in), *sig);
    });
  }

  //! What the cache has done so far.
  graph_stats stats() const {
    std::lock_guard lock(mutex_);
    graph_stats s = stats_;
    s.cached_graphs = 0;
    for (const auto& e : entries_) s.cached_graphs += e.graph ? 1 : 0;
    return s;
  }

 private:
  struct signature {
    std::string key;
    std::int64_t batch = -1;   // the real batch size when padded to a bucket, else -1
    std::int64_t bucket = -1;  // the bucket, when padded
  };

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
    // The next replay's outputs, made (and the output nodes pointed at them) right after the
    // last launch, while the GPU ran it: a replay on the same stream with the same real batch
    // launches at once and hands these out. Empty when there are none ready.
    std::vector<at::Tensor> next;
    cudaStream_t next_stream = nullptr;
    std::int64_t next_batch = -1;

    fused_graph() = default;
    fused_graph(const fused_graph&) = delete;
    fused_graph& operator=(const fused_graph&) = delete;
    ~fused_graph() {
      if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
    }
  };

  struct entry {
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

  // The tensors or values the runner passed, to read.
  static const std::vector<c10::IValue>& given(const std::vector<c10::IValue>& v) { return v; }
  static const std::vector<at::Tensor>& given(lent_tensors v) { return v.get(); }

  // What the body runs the model on instead of the caller's inputs: the static buffers, as
  // the same kind of inputs (lent: the buffers stay the entry's).
  static std::vector<c10::IValue> replacement(const std::vector<c10::IValue>&,
                                              const std::vector<at::Tensor>& statics) {
    return std::vector<c10::IValue>(statics.begin(), statics.end());
  }
  static lent_tensors replacement(lent_tensors, const std::vector<at::Tensor>& statics) {
    return std::cref(statics);
  }

  // A capture's outputs as the entry keeps them, whichever kind the body returned: one
  // tensor as itself, several as a tuple (as a loader boxes them).
  static c10::IValue boxed(c10::IValue v) { return v; }
  static c10::IValue boxed(std::vector<at::Tensor> v) {
    if (v.size() == 1) return c10::IValue(std::move(v.front()));
    return c10::ivalue::Tuple::create(std::vector<c10::IValue>(v.begin(), v.end()));
  }

  static const at::Tensor* tensor_of(const at::Tensor& t) { return &t; }
  static const at::Tensor* tensor_of(const c10::IValue& v) {
    return v.isTensor() ? &v.toTensor() : nullptr;
  }

  // Whether two elements of `t` share memory (an expanded input's stride 0): such a layout
  // cannot be a buffer that inputs are copied into. A view with gaps (a narrowed, transposed
  // one) is not: torch says it cannot tell, and its layout is kept. (A rarer overlapping view
  // without a stride 0 makes the copy into its buffer fail: that signature runs eagerly.)
  static bool overlapping(const at::Tensor& t) {
    return at::has_internal_overlap(t) == at::MemOverlap::Yes;
  }

  template <class T>
  static void append(std::string& key, T v) {
    key.append(reinterpret_cast<const char*>(&v), sizeof v);
  }

  // Shapes, dtypes, layouts and devices of the inputs, with the batch dimension replaced by
  // its bucket. The layout decides the graph's input buffer (see capture()): contiguous;
  // another layout without overlap (with its strides, which the buffer copies); or an
  // overlapping one (broadcast), copied into a contiguous buffer. Empty when an input is not a tensor
  // on the runner's device: such runs stay eager.
  template <class Inputs>
  std::optional<signature> signature_of(const Inputs& inputs) const {
    signature sig;
    sig.key.reserve(16 + inputs.size() * 48);
    std::int64_t batch = -1;
    bool same_batch = !buckets_.sizes.empty();
    for (const auto& v : inputs) {
      const at::Tensor* t = tensor_of(v);
      if (t == nullptr || !t->defined() || t->device() != device_) return std::nullopt;
      if (t->dim() == 0) {
        same_batch = false;
      } else if (batch < 0) {
        batch = t->size(0);
      } else if (t->size(0) != batch) {
        same_batch = false;
      }
    }
    std::optional<std::int64_t> bucket;
    if (same_batch && batch > 0) bucket = buckets_.bucket_for(batch);
    for (const auto& v : inputs) {
      const at::Tensor& t = *tensor_of(v);
      const std::int8_t layout = t.is_contiguous() ? 0 : overlapping(t) ? 2 : 1;
      append(sig.key, static_cast<std::int8_t>(t.scalar_type()));
      append(sig.key, layout);
      append(sig.key, static_cast<std::int8_t>(t.dim()));
      for (std::int64_t d = 0; d < t.dim(); ++d) {
        append(sig.key, d == 0 && bucket ? *bucket : t.size(d));
      }
      if (layout == 1 && !bucket) {
        for (std::int64_t d = 0; d < t.dim(); ++d) append(sig.key, t.stride(d));
      }
    }
    if (bucket && *bucket != batch) {
      sig.batch = batch;
      sig.bucket = *bucket;
    }
    return sig;
  }

  // The entry for `sig`, made most recently used. Entries without a graph (signatures not yet
  // captured, or that cannot be) and entries with one are bounded apart, each by
  // CUDA_GRAPH_MAX_SHAPES: a new signature pushes out the least recently used entry without a
  // graph, never a captured graph (one-off shapes must not cost the graphs that are
  // replayed); a new graph pushes out the least recently used graph (see keep_graphs_bounded).
  entry& touch(const signature& sig) {
    if (auto it = index_.find(sig.key); it != index_.end()) {
      entries_.splice(entries_.begin(), entries_, it->second);
      return entries_.front();
    }
    std::size_t without_graph = 0;
    for (const entry& e : entries_) without_graph += e.graph ? 0 : 1;
    for (auto it = entries_.end(); without_graph >= max_shapes_ && it != entries_.begin();) {
      --it;
      if (it->graph) continue;
      index_.erase(it->key);
      it = entries_.erase(it);
      --without_graph;
    }
    entries_.emplace_front();
    entries_.front().key = sig.key;
    index_.emplace(sig.key, entries_.begin());
    return entries_.front();
  }

  // After `kept` got its graph: the least recently used other graphs go until at most
  // CUDA_GRAPH_MAX_SHAPES are left.
  void keep_graphs_bounded(const entry& kept) {
    std::size_t graphs = 0;
    for (const entry& e : entries_) graphs += e.graph ? 1 : 0;
    for (auto it = entries_.end(); graphs > max_shapes_ && it != entries_.begin();) {
      --it;
      if (!it->graph || &*it == &kept) continue;
      // Its last replay may still run on the GPU: wait for it (rare: the LRU is full).
      check(cudaEventSynchronize(done_.get()), "cudaEventSynchronize");
      ++stats_.evictions;
      index_.erase(it->key);
      it = entries_.erase(it);
      --graphs;
    }
  }

  // Copies the inputs into the entry's static buffers (only the real rows when padded).
  template <class Inputs>
  static void copy_in(entry& e, const Inputs& inputs, const signature& sig,
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

  // Captures the model on copies of these inputs, on the cache's own capture stream (joined
  // after the run's stream by an event). A model that cannot be captured (it synchronises
  // with the host, copies from pageable host memory, returns something other than tensors),
  // or inputs that cannot be copied into buffers of the graph's, mark the signature so: it
  // runs eagerly from then on, with one warning per runner. A failed capture leaves torch's
  // allocator as it found it (see abandon_capture).
  template <class Given, class Body>
  void capture(entry& e, const run_context& rc, const Given& in, Body& body,
               const signature& sig) {
    const auto& inputs = given(in);
    const c10::cuda::CUDAStream run_stream(c10::cuda::CUDAStream::UNCHECKED, rc.stream);
    c10::cuda::CUDAStreamGuard on_run(run_stream);
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    std::string why;
    c10::IValue outputs;
    try {
      e.static_inputs.clear();
      for (const auto& v : inputs) {
        const at::Tensor& t = *tensor_of(v);
        if (sig.bucket > 0 && t.dim() > 0) {
          std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
          shape[0] = sig.bucket;
          // Padding rows are zeros at first, then whatever the last larger batch left there:
          // rows are independent, so they never reach the real rows' outputs.
          e.static_inputs.push_back(at::zeros(shape, t.options()));
        } else if (!overlapping(t)) {
          // The input's own layout (dense in another order, or a view with gaps): the graph's
          // kernels are the ones an eager run on it launches.
          e.static_inputs.push_back(at::empty_strided(t.sizes(), t.strides(), t.options()));
        } else {
          // Broadcast (stride 0) or otherwise overlapping: a buffer holds each element once.
          e.static_inputs.push_back(at::empty(t.sizes(), t.options()));
        }
      }
      copy_in(e, inputs, sig, run_stream.stream());
      // The cache's own reference to the pool, taken at the first capture (torch's allocator
      // is set up by then): each capture takes one and each graph gives its back when it
      // goes, so without this one the pool would go (or, with blocks still out, be left at no
      // references, which torch's next capture into it asserts against) once every graph was
      // evicted.
      if (!held_.device && !held_.host) held_ = hold_pool(device_.index(), pool_);
      const c10::cuda::CUDAStream capture_stream =
          c10::cuda::getStreamFromExternal(
              capture_stream_ ? capture_stream_.get() : capture_lease_.get(), device_.index());
      check(cudaEventRecord(ready_.get(), run_stream.stream()), "cudaEventRecord");
      check(cudaStreamWaitEvent(capture_stream.stream(), ready_.get(), 0), "cudaStreamWaitEvent");
      if (uncached_allocator_) {
        why = "PYTORCH_NO_CUDA_MEMORY_CACHING is set: torch's uncached allocator frees a graph's "
              "memory at the end of its capture";
      } else {
        c10::cuda::CUDAStreamGuard on_capture(capture_stream);
        graph = make_graph<at::cuda::CUDAGraph>();
        bool begun = false;
        try {
          // Relaxed: other threads of the process (other runners, eager runs of this one)
          // keep calling CUDA meanwhile.
          graph->capture_begin(pool_, cudaStreamCaptureModeRelaxed);
          begun = true;
          outputs = boxed(body(run_context{rc.device, capture_stream.unwrap()},
                               replacement(in, e.static_inputs)));
        } catch (const std::exception& ex) {
          why = torchloom::detail::torch_message(ex);
        }
        if (begun) end_capture(*graph, capture_stream.stream(), why);
      }
    } catch (const std::exception& ex) {
      if (why.empty()) why = torchloom::detail::torch_message(ex);
    }
    // A failed capture leaves its error in the runtime's last-error slot.
    if (!why.empty()) (void)cudaGetLastError();
    if (why.empty() && !tensors_only(outputs)) {
      why = "its output is not a tensor, a tuple of tensors or a list of tensors";
    }
    ++stats_.captures;
    if (!why.empty()) {
      e.uncapturable = true;
      e.static_inputs.clear();
      ++stats_.uncapturable;
      if (!warned_) {
        warned_ = true;
        std::clog << "torchloom: warning: model '" << model_
                  << "': cannot capture a CUDA graph (" << why
                  << "); this input signature runs eagerly from now on\n";
      }
      return;
    }
    e.graph = std::move(graph);
    flatten(outputs, e.flat_outputs);
    e.static_outputs = std::move(outputs);
    keep_graphs_bounded(e);
  }

  // Ends a capture that began on `stream`: through torch when it is still going and nothing
  // failed, else by hand (an operation a capture does not allow ends it; torch's capture_end
  // would then throw before giving the allocator back its routing). Sets `why` on failure.
  void end_capture(at::cuda::CUDAGraph& graph, cudaStream_t stream, std::string& why) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) (void)cudaGetLastError();
    if (why.empty() && status == cudaStreamCaptureStatusActive) {
      try {
        graph.capture_end();
        return;
      } catch (const std::exception& ex) {
        why = torchloom::detail::torch_message(ex);
      }
    } else {
      if (why.empty()) why = "the capture was ended by an operation that a capture does not allow";
      if (status != cudaStreamCaptureStatusNone) {
        cudaGraph_t partial = nullptr;
        if (cudaStreamEndCapture(stream, &partial) != cudaSuccess) (void)cudaGetLastError();
        if (partial != nullptr) (void)cudaGraphDestroy(partial);
      }
    }
    abandon_capture();
  }

  // After a capture that did not end through torch: takes the pool out of torch's caching
  // allocators' capture routing (torch up to 2.11 skips that when cudaStreamEndCapture fails,
  // and from then on defers freeing every block used on a second stream until no capture is
  // under way: forever) and gives back the reference the capture took on the pool. Where
  // torch did end the routing (it failed later), ending it again throws and nothing more is
  // done: the graph gives its reference back itself.
  void abandon_capture() noexcept {
    const c10::DeviceIndex index = device_.index();
    bool device_ended = false;
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(index, pool_);
      device_ended = true;
    } catch (const std::exception&) {
      device_ended = false;
    }
    const bool host_ended =
        host_pool_call(pool_, [](auto& host, auto id) { host.end_allocate_to_pool(id); });
    if (device_ended) release_device_pool(index, pool_);
    if (host_ended) host_pool_call(pool_, [](auto& host, auto id) { host.release_pool(id); });
  }

  // Calls `f(host_allocator, pool)` on torch's CUDA host allocator, where this torch routes a
  // capture's host allocations to its pool (2.10 and later); true when it ran and did not
  // throw.
  template <class Id, class F>
  static bool host_pool_call(Id pool, F&& f) noexcept {
#if __has_include(<ATen/core/CachingHostAllocator.h>)
    if constexpr (requires(at::HostAllocator& h) { f(h, pool); }) {
      try {
        at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
        if (host == nullptr) return false;
        f(*host, pool);
        return true;
      } catch (const std::exception&) {
        return false;
      }
    }
#endif
    (void)pool;
    (void)f;
    return false;
  }

  // Takes a reference of the cache's own to `pool` in torch's device and host allocators: a
  // routing begun and ended at once, which routes nothing (its filter takes no stream) and
  // leaves the reference that beginning it takes. Returns which allocators hold one.
  struct pool_hold {
    bool device = false;
    bool host = false;
  };
  template <class Id>
  static pool_hold hold_pool(c10::DeviceIndex index, Id pool) {
    pool_hold held;
    namespace alloc = c10::cuda::CUDACachingAllocator;
    if constexpr (requires(std::function<bool(cudaStream_t)> f) {
                    alloc::beginAllocateToPool(index, pool, f);
                  }) {
      alloc::beginAllocateToPool(index, pool, [](cudaStream_t) { return false; });
      alloc::endAllocateToPool(index, pool);
      held.device = true;
    }
    if (host_pool_call(pool, [](auto& host, auto id) {
          host.begin_allocate_to_pool(id, [](c10::Stream) { return false; });
        })) {
      held.host = host_pool_call(pool, [](auto& host, auto id) { host.end_allocate_to_pool(id); });
    }
    return held;
  }

  // Gives back a reference to `pool` in the device allocator; ignores failures.
  template <class Id>
  static void release_device_pool(c10::DeviceIndex index, Id pool) noexcept {
    try {
      c10::cuda::CUDACachingAllocator::releasePool(index, pool);
    } catch (const std::exception&) {
      (void)0;
    }
  }

  // Keeps the captured cudaGraph_t (torch 2.8 and later can), so that fuse() can wrap it.
  template <class Graph>
  static std::unique_ptr<Graph> make_graph() {
    if constexpr (std::is_constructible_v<Graph, bool>) {
      return std::make_unique<Graph>(/*keep_graph=*/true);
    } else {
      return std::make_unique<Graph>();
    }
  }

  // Replays the entry's graph on the run's stream and returns copies of its outputs.
  template <class Result, class Inputs>
  Result replay(entry& e, const run_context& rc, const Inputs& inputs, const signature& sig) {
    const c10::cuda::CUDAStream stream(c10::cuda::CUDAStream::UNCHECKED, rc.stream);
    c10::cuda::CUDAStreamGuard on_run(stream);
    // After the runner's previous replay, on whatever stream it ran: the pool and the static
    // buffers are this replay's alone. Always (a fraction of a microsecond): neither a stream
    // handle nor a thread id says that the previous replay was this stream's, since the
    // system hands both out again.
    check(cudaStreamWaitEvent(stream.stream(), done_.get(), 0), "cudaStreamWaitEvent");
    // From here on this replay may have queued work: however it ends, done_ marks the end of
    // that work, which the next replay, an eviction and the destructor wait for.
    done_marker marker{done_.get(), stream.stream()};
    Result out;
    const bool fused = e.fused && launch_fused(*e.fused, e, inputs, sig, stream.stream(), out);
    if (!fused) {
      copy_in(e, inputs, sig, stream.stream());
      launch(e, stream.stream());
      out = copy_out<Result>(e, sig, stream.stream());
      if (e.direct && !e.fuse_tried) {
        e.fuse_tried = true;
        e.fused = fuse(e, inputs, sig, out);
      }
    }
    if (torchloom::detail::fail_next_replay_after_launch.load(std::memory_order_relaxed) &&
        torchloom::detail::fail_next_replay_after_launch.exchange(false)) {
      throw error(errc::run_failed, model_, "graphed: a replay failed after its launch (test)");
    }
    marker.record(*this);
    ++stats_.replays;
    // The GPU runs the replay meanwhile: making the next one's outputs now takes them off
    // its path to the launch.
    if (fused) prepare_next(*e.fused, e, sig, stream.stream());
    return out;
  }

  // Records done_ on a replay's stream: record() checks the call; a replay that throws before
  // it records it on the way out (unchecked: that replay's own error is the one to report).
  struct done_marker {
    cudaEvent_t done;
    cudaStream_t stream;
    bool recorded = false;
    void record(const graph_cache& cache) {
      recorded = true;
      cache.check(cudaEventRecord(done, stream), "cudaEventRecord");
    }
    ~done_marker() {
      if (!recorded && cudaEventRecord(done, stream) != cudaSuccess) (void)cudaGetLastError();
    }
  };

  // The bytes of input `t` that go into static buffer `dst` as one plain copy (the same dtype,
  // both contiguous, only the real rows when padded), or 0 when it needs torch's copy_.
  static std::size_t plain_bytes(const at::Tensor& t, const at::Tensor& dst,
                                 const signature& sig) {
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

  static void flatten(const std::vector<at::Tensor>& v, std::vector<at::Tensor>& out) {
    out.insert(out.end(), v.begin(), v.end());
  }

  static void flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
    if (v.isTensor()) {
      out.push_back(v.toTensor());
    } else if (v.isTuple()) {
      for (const auto& x : v.toTupleRef().elements()) flatten(x, out);
    } else {
      for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(t);
    }
  }

  // Wraps the entry's graph between memcpy nodes (see fused_graph), with this replay's inputs
  // and fresh outputs as the nodes' first operands. Null when torch keeps no cudaGraph_t, for
  // a green context's graph (a memcpy node of ours would run outside its partition), when an
  // input or output is not one plain copy, or when CUDA refuses the wrapping: replays then
  // copy around the graph as before.
  template <class Inputs, class Result>
  std::unique_ptr<fused_graph> fuse(entry& e, const Inputs& inputs, const signature& sig,
                                    const Result& out) const {
    if (!std::is_constructible_v<at::cuda::CUDAGraph, bool> || !fusable_) {
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
  // into fresh tensors (made here, on the run's stream). False, with nothing launched, when
  // this run's tensors do not fit the memcpy nodes (an input not one plain copy, memory CUDA
  // will not put in the node): the caller copies around the graph instead.
  template <class Inputs, class Result>
  bool launch_fused(fused_graph& f, const entry& e, const Inputs& inputs, const signature& sig,
                    cudaStream_t stream, Result& out) const {
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
    // Outputs made after the last launch, for a replay like this one: the nodes point at them.
    std::vector<at::Tensor> ready = std::move(f.next);
    f.next.clear();
    const bool use_ready = ready.size() == f.out_nodes.size() && f.next_stream == stream &&
                           f.next_batch == sig.batch;
    const auto make = [&](const at::Tensor& s) {
      if (use_ready) return std::move(ready[k++]);
      at::Tensor o = output_like(s, sig);
      ok = ok && k < f.out_nodes.size() && o.nbytes() > 0 &&
           set(first_out + k, f.out_nodes[k], o.data_ptr(), s.data_ptr(), o.nbytes());
      ++k;
      return o;
    };
    Result result = map_outputs<Result>(e, make);
    if (!ok || k != f.out_nodes.size()) return false;
    check(cudaGraphLaunch(f.exec, stream), "cudaGraphLaunch");
    out = std::move(result);
    return true;
  }

  // A fresh tensor for static output `s` of this replay (its real rows when padded), straight
  // from the CUDA allocator on the current stream (the run's), without the dispatcher around
  // at::empty; the same tensor as at::empty makes.
  static at::Tensor output_like(const at::Tensor& s, const signature& sig) {
    if (sig.bucket > 0 && s.dim() > 0 && s.size(0) == sig.bucket) {
      std::vector<std::int64_t> shape(s.sizes().begin(), s.sizes().end());
      shape[0] = sig.batch;
      return at::Tensor(at::detail::empty_cuda(shape, s.options()));
    }
    return at::Tensor(at::detail::empty_cuda(s.sizes(), s.options()));
  }

  // Makes the outputs of the next replay on `stream` with this real batch, and points the
  // output nodes at them (which changes only later launches, not the one running). Made on
  // `stream`, so they are handed out only by a replay on it. On failure (out of memory
  // included: this replay has run, and is not failed for the next one's sake), none are ready
  // and the next replay makes its own, before its launch.
  void prepare_next(fused_graph& f, const entry& e, const signature& sig,
                    cudaStream_t stream) const noexcept {
    f.next.clear();
    try {
      make_next(f, e, sig, stream);
    } catch (...) {
      f.next.clear();
    }
  }

  void make_next(fused_graph& f, const entry& e, const signature& sig,
                 cudaStream_t stream) const {
    const std::vector<at::Tensor>& statics = e.flat_outputs;
    if (statics.size() != f.out_nodes.size()) return;
    std::vector<at::Tensor> next;
    next.reserve(statics.size());
    const std::size_t first_out = f.in_nodes.size();
    for (std::size_t k = 0; k < statics.size(); ++k) {
      at::Tensor o = output_like(statics[k], sig);
      void* dst = o.data_ptr();
      const void* src = statics[k].data_ptr();
      if (o.nbytes() == 0 ||
          cudaGraphExecMemcpyNodeSetParams1D(f.exec, f.out_nodes[k], dst, src, o.nbytes(),
                                             cudaMemcpyDeviceToDevice) != cudaSuccess) {
        (void)cudaGetLastError();
        f.now[first_out + k] = {};  // unknown: set again next time
        return;
      }
      f.now[first_out + k] = {dst, src, o.nbytes()};
      next.push_back(std::move(o));
    }
    f.next = std::move(next);
    f.next_stream = stream;
    f.next_batch = sig.batch;
  }

  // The first replay goes through torch's replay(), which advances the default generator by
  // what the graph draws; when it draws nothing, later replays launch the graph directly.
  void launch(entry& e, cudaStream_t stream) {
    if (e.direct) {
      launch_exec(*e.graph, stream);
      return;
    }
    const at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device_.index());
    const auto* state = gen.get<at::CUDAGeneratorImpl>();
    const std::uint64_t before = state->philox_offset_per_thread();
    e.graph->replay();
    if (!e.replayed) {
      e.replayed = true;
      e.direct = state->philox_offset_per_thread() == before && has_exec(*e.graph);
    }
  }

  // The captured graph, when this torch keeps it (see make_graph); else null.
  template <class Graph>
  static cudaGraph_t raw_graph(Graph& g) {
    if constexpr (requires { g.raw_cuda_graph(); }) {
      return g.raw_cuda_graph();
    } else {
      return nullptr;
    }
  }

  // Whether this torch hands out the graph's executable (torch 2.8 and later do).
  template <class Graph>
  static bool has_exec(Graph& g) {
    return requires { g.raw_cuda_graph_exec(); };
  }

  template <class Graph>
  void launch_exec(Graph& g, cudaStream_t stream) const {
    if constexpr (requires { g.raw_cuda_graph_exec(); }) {
      check(cudaGraphLaunch(g.raw_cuda_graph_exec(), stream), "cudaGraphLaunch");
    } else {
      g.replay();
    }
  }

  static bool tensors_only(const c10::IValue& v) {
    if (v.isTensor()) return true;
    if (v.isTuple()) {
      for (const auto& x : v.toTupleRef().elements()) {
        if (!tensors_only(x)) return false;
      }
      return true;
    }
    return v.isTensorList();
  }

  static at::Tensor fresh(const at::Tensor& t, const signature& sig, cudaStream_t stream) {
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

  // The outputs as the caller's own tensors: in the structure the model returned
  // (c10::IValue), or flattened (std::vector<at::Tensor>).
  template <class Result>
  static Result copy_out(const entry& e, const signature& sig, cudaStream_t stream) {
    const auto copy = [&](const at::Tensor& t) { return fresh(t, sig, stream); };
    return map_outputs<Result>(e, copy);
  }

  // The entry's static outputs with each tensor t replaced by fn(t), in flatten()'s order:
  // in their structure (a tensor, a tuple, a list of tensors) or as a flat vector.
  template <class Result, class Fn>
  static Result map_outputs(const entry& e, Fn& fn) {
    if constexpr (std::is_same_v<Result, std::vector<at::Tensor>>) {
      std::vector<at::Tensor> out;
      out.reserve(e.flat_outputs.size());
      for (const at::Tensor& t : e.flat_outputs) out.push_back(fn(t));
      return out;
    } else {
      return map_structure(e.static_outputs, fn);
    }
  }

  template <class Fn>
  static c10::IValue map_structure(const c10::IValue& v, Fn& fn) {
    if (v.isTensor()) return fn(v.toTensor());
    if (v.isTuple()) {
      std::vector<c10::IValue> elements;
      elements.reserve(v.toTupleRef().elements().size());
      for (const auto& x : v.toTupleRef().elements()) elements.push_back(map_structure(x, fn));
      return c10::ivalue::Tuple::create(std::move(elements));
    }
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorList().vec()) list.push_back(fn(t));
    return list;
  }

  void check(cudaError_t rc, const char* what) const {
    cuda::check(rc, model_, detail::concat("graphed: ", what));
  }

  // For the static helpers, which have no model name: the runner adds it.
  static void check_static(cudaError_t rc, const char* what) {
    cuda::check(rc, "", detail::concat("graphed: ", what));
  }

  std::string model_;
  c10::Device device_;
  std::size_t max_shapes_;
  graph_batch_sizes buckets_;
  bool fusable_;
  at::cuda::MempoolId_t pool_{0, 0};
  pool_hold held_;
  event done_;
  event ready_;
  owned_stream capture_stream_;
  stream_lease capture_lease_;  // where capture_stream_ is empty
  mutable std::mutex mutex_;
  std::list<entry> entries_;  // most recently used first
  std::unordered_map<std::string, std::list<entry>::iterator> index_;
  graph_stats stats_;
  bool warned_ = false;
  bool uncached_allocator_ = false;
};

}  // namespace torchloom::cuda
