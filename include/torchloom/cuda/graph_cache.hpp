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
#include <torchloom/cuda/fused_replay.hpp>
#include <torchloom/cuda/graph_entry.hpp>
#include <torchloom/cuda/graph_pool.hpp>
#include <torchloom/cuda/graph_signature.hpp>
#include <torchloom/cuda/graph_values.hpp>
#include <torchloom/cuda/owned_stream.hpp>
#include <torchloom/cuda/replay_order.hpp>
#include <torchloom/cuda/stream_lease.hpp>
#include <torchloom/cuda/torch_cuda_graph.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/graph_stats.hpp>
#include <torchloom/options/graph_options.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
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
  //! `lasting_streams`: the streams the wrapped policy chooses instead of the caller's
  //! outlive the cache (torch's pool streams, a green context's; see replay_order).
  graph_cache(std::string model, c10::Device device, const graph_options& options,
              owned_stream capture_stream, bool fusable, bool lasting_streams)
      : model_(std::move(model)),
        device_(device),
        max_shapes_(static_cast<std::size_t>(options.cuda_graph_max_shapes.value)),
        buckets_(options.cuda_graph_batch_sizes),
        fusable_(fusable),
        lasting_streams_(lasting_streams),
        capture_stream_(std::move(capture_stream)) {
    c10::cuda::CUDAGuard guard(device_);
    order_ = replay_order(model_);
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
    order_.wait_quietly();
    entries_.clear();
    index_.clear();
    if (held_.device) detail::release_device_pool(device_.index(), pool_);
    if (held_.host) {
      detail::host_pool_call(pool_, [](auto& host, auto id) { host.release_pool(id); });
    }
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
    const std::optional<signature> sig =
        detail::signature_of(detail::given(inputs), device_, buckets_);
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
    // The caller's stream, before the wrapped policy chooses one (see replay_order): needed
    // only where the policy's own streams outlive the cache.
    const cudaStream_t caller =
        lasting_streams_ ? c10::cuda::getCurrentCUDAStream(device_.index()).stream() : nullptr;
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
      return replay<result>(e, rc, detail::given(in), *sig, caller);
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
  using signature = detail::graph_signature;
  using entry = detail::graph_entry;

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
      order_.wait(model_);
      ++stats_.evictions;
      index_.erase(it->key);
      it = entries_.erase(it);
      --graphs;
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
    const auto& inputs = detail::given(in);
    const c10::cuda::CUDAStream run_stream(c10::cuda::CUDAStream::UNCHECKED, rc.stream);
    c10::cuda::CUDAStreamGuard on_run(run_stream);
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    std::string why;
    c10::IValue outputs;
    try {
      e.static_inputs.clear();
      for (const auto& v : inputs) {
        const at::Tensor& t = *detail::tensor_of(v);
        if (sig.bucket > 0 && t.dim() > 0) {
          std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
          shape[0] = sig.bucket;
          // Padding rows are zeros at first, then whatever the last larger batch left there:
          // rows are independent, so they never reach the real rows' outputs.
          e.static_inputs.push_back(at::zeros(shape, t.options()));
        } else if (!detail::overlapping(t)) {
          // The input's own layout (dense in another order, or a view with gaps): the graph's
          // kernels are the ones an eager run on it launches.
          e.static_inputs.push_back(at::empty_strided(t.sizes(), t.strides(), t.options()));
        } else {
          // Broadcast (stride 0) or otherwise overlapping: a buffer holds each element once.
          e.static_inputs.push_back(at::empty(t.sizes(), t.options()));
        }
      }
      detail::copy_in(e, inputs, sig, run_stream.stream());
      // The cache's own reference to the pool, taken at the first capture (torch's allocator
      // is set up by then): each capture takes one and each graph gives its back when it
      // goes, so without this one the pool would go (or, with blocks still out, be left at no
      // references, which torch's next capture into it asserts against) once every graph was
      // evicted.
      if (!held_.device && !held_.host) held_ = detail::hold_pool(device_.index(), pool_);
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
        graph = detail::make_graph<at::cuda::CUDAGraph>();
        bool begun = false;
        try {
          // Relaxed: other threads of the process (other runners, eager runs of this one)
          // keep calling CUDA meanwhile.
          graph->capture_begin(pool_, cudaStreamCaptureModeRelaxed);
          begun = true;
          outputs = detail::boxed(body(run_context{rc.device, capture_stream.unwrap()},
                                       detail::replacement(in, e.static_inputs)));
        } catch (const std::exception& ex) {
          why = torchloom::detail::torch_message(ex);
        }
        if (begun) {
          detail::end_capture(*graph, capture_stream.stream(), why, device_.index(), pool_);
        }
      }
    } catch (const std::exception& ex) {
      if (why.empty()) why = torchloom::detail::torch_message(ex);
    }
    // A failed capture leaves its error in the runtime's last-error slot.
    if (!why.empty()) (void)cudaGetLastError();
    if (why.empty() && !detail::tensors_only(outputs)) {
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
    detail::flatten(outputs, e.flat_outputs);
    e.static_outputs = std::move(outputs);
    keep_graphs_bounded(e);
  }

  // Replays the entry's graph on the run's stream and returns copies of its outputs.
  // `caller`: the caller's stream when the run began (null unless lasting_streams_).
  template <class Result, class Inputs>
  Result replay(entry& e, const run_context& rc, const Inputs& inputs, const signature& sig,
                cudaStream_t caller) {
    const c10::cuda::CUDAStream stream(c10::cuda::CUDAStream::UNCHECKED, rc.stream);
    c10::cuda::CUDAStreamGuard on_run(stream);
    // After the runner's previous replay, on whatever stream it ran: the pool and the static
    // buffers are this replay's alone.
    order_.before(stream.stream(), model_);
    // From here on this replay may have queued work: however it ends, it is the last replay,
    // which the next one, an eviction and the destructor wait for.
    const bool lasting =
        stream.stream() == nullptr || (lasting_streams_ && stream.stream() != caller);
    done_marker marker{*this, stream.stream(), lasting};
    Result out;
    const bool fused =
        e.fused && detail::launch_fused(model_, *e.fused, e, inputs, sig, stream.stream(), out);
    if (!fused) {
      detail::copy_in(e, inputs, sig, stream.stream());
      detail::launch(model_, device_.index(), e, stream.stream());
      out = detail::copy_out<Result>(e, sig, stream.stream());
      if (e.direct && !e.fuse_tried) {
        e.fuse_tried = true;
        e.fused = detail::fuse(e, inputs, sig, out, fusable_);
      }
    }
    if (torchloom::detail::fail_next_replay_after_launch.load(std::memory_order_relaxed) &&
        torchloom::detail::fail_next_replay_after_launch.exchange(false)) {
      throw error(errc::run_failed, model_, "graphed: a replay failed after its launch (test)");
    }
    marker.record();
    ++stats_.replays;
    return out;
  }

  // Makes a replay the last one (see replay_order): record() checks its CUDA call; a replay
  // that throws before it does it on the way out (unchecked: that replay's own error is the
  // one to report).
  struct done_marker {
    graph_cache& cache;
    cudaStream_t stream;
    bool lasting;
    bool recorded = false;
    void record() {
      recorded = true;
      cache.order_.after(stream, lasting, cache.model_);
    }
    ~done_marker() {
      if (!recorded) cache.order_.after(stream, lasting, cache.model_, /*checked=*/false);
    }
  };

  void check(cudaError_t rc, const char* what) const {
    cuda::check(rc, model_, detail::concat("graphed: ", what));
  }

  std::string model_;
  c10::Device device_;
  std::size_t max_shapes_;
  graph_batch_sizes buckets_;
  bool fusable_;
  bool lasting_streams_;
  at::cuda::MempoolId_t pool_{0, 0};
  detail::pool_hold held_;
  replay_order order_;
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
