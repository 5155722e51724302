#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/graph_cache.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/concepts/loader.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/stream/graph_options.hpp>
#include <torchloom/stream/graph_stats.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchloom::cuda {

//! One runner's CUDA graphs, keyed by input signature (see graphed<Stream> in
//! torchloom/stream/graphed.hpp for the behaviour). All graphs share one private memory pool;
//! replays of one runner are chained by an event on the GPU, so no two replays ever touch the
//! shared pool or one graph's static buffers at the same time, whichever streams they run on.
//! Thread-safe. Throws cuda_error (constructor) when a CUDA call fails.
class graph_cache {
 public:
  //! Eager runs of a new signature before it is captured (see graph_stats.hpp).
  static constexpr int eager_runs_before_capture = graph_eager_runs_before_capture;

  graph_cache(std::string model, c10::Device device, const graph_options& options,
              bool capture_on_run_stream)
      : model_(std::move(model)),
        device_(device),
        max_shapes_(static_cast<std::size_t>(options.cuda_graph_max_shapes.value)),
        buckets_(options.cuda_graph_batch_sizes),
        capture_on_run_stream_(capture_on_run_stream) {
    c10::cuda::CUDAGuard guard(device_);
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    if (!capture_on_run_stream_) {
      check(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking),
            "cudaStreamCreate");
    }
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
    (void)cudaEventSynchronize(done_);
    entries_.clear();
    index_.clear();
    if (capture_stream_ != nullptr) (void)cudaStreamDestroy(capture_stream_);
    (void)cudaEventDestroy(ready_);
    (void)cudaEventDestroy(done_);
  }

  //! Runs `body` through `inner` (the wrapped stream policy): eagerly for a signature seen
  //! fewer than eager_runs_before_capture times or that cannot be captured, else by replaying
  //! its graph (captured on the spot the first time). Returns fresh output tensors.
  template <class Inner, class Inputs, class Body>
  c10::IValue run(Inner& inner, c10::Device device, const Inputs& inputs, Body&& body) {
    const std::optional<signature> sig = signature_of(inputs);
    bool eager = true;
    {
      std::lock_guard lock(mutex_);
      if (sig) {
        entry& e = touch(*sig);
        eager = e.uncapturable || (!e.graph && e.seen < eager_runs_before_capture);
        if (eager) ++e.seen;
      }
      if (eager) ++stats_.eager_runs;
    }
    // Eager runs go outside the lock: they overlap as they do without graphs.
    if (eager) return inner.execute(device, inputs, std::forward<Body>(body));
    return inner.execute(device, inputs, [&](const run_context& rc) -> c10::IValue {
      std::unique_lock lock(mutex_);
      // Looked up again: another thread may have pushed it out meanwhile.
      entry& e = touch(*sig);
      if (!e.graph && !e.uncapturable) capture(e, rc, inputs, body, *sig);
      if (e.uncapturable) {
        ++stats_.eager_runs;
        lock.unlock();
        return body(rc);
      }
      return replay(e, rc, inputs, *sig);
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
  };

  static const at::Tensor* tensor_of(const at::Tensor& t) { return &t; }
  static const at::Tensor* tensor_of(const c10::IValue& v) {
    return v.isTensor() ? &v.toTensor() : nullptr;
  }

  template <class T>
  static void append(std::string& key, T v) {
    key.append(reinterpret_cast<const char*>(&v), sizeof v);
  }

  // Shapes, dtypes, layouts and devices of the inputs, with the batch dimension replaced by
  // its bucket. Empty when an input is not a tensor on the runner's device: such runs stay
  // eager.
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
      append(sig.key, static_cast<std::int8_t>(t.scalar_type()));
      append(sig.key, static_cast<std::int8_t>(t.is_contiguous()));
      append(sig.key, static_cast<std::int8_t>(t.dim()));
      for (std::int64_t d = 0; d < t.dim(); ++d) {
        append(sig.key, d == 0 && bucket ? *bucket : t.size(d));
      }
    }
    if (bucket && *bucket != batch) {
      sig.batch = batch;
      sig.bucket = *bucket;
    }
    return sig;
  }

  // The entry for `sig`, made most recently used; a new one may push the least recently used
  // out.
  entry& touch(const signature& sig) {
    if (auto it = index_.find(sig.key); it != index_.end()) {
      entries_.splice(entries_.begin(), entries_, it->second);
      return entries_.front();
    }
    while (entries_.size() >= max_shapes_) {
      entry& victim = entries_.back();
      if (victim.graph) {
        // Its last replay may still run on the GPU: wait for it (rare: the LRU is full).
        check(cudaEventSynchronize(done_), "cudaEventSynchronize");
        ++stats_.evictions;
      }
      index_.erase(victim.key);
      entries_.pop_back();
    }
    entries_.emplace_front();
    entries_.front().key = sig.key;
    index_.emplace(sig.key, entries_.begin());
    return entries_.front();
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

  // Captures the model on copies of these inputs. A model that cannot be captured (it
  // synchronises with the host, copies from pageable host memory, returns something other
  // than tensors) is marked so and runs eagerly from then on, with one warning per runner.
  template <class Inputs, class Body>
  void capture(entry& e, const run_context& rc, const Inputs& inputs, Body& body,
               const signature& sig) {
    const c10::cuda::CUDAStream run_stream(c10::cuda::CUDAStream::UNCHECKED, rc.stream);
    c10::cuda::CUDAStreamGuard on_run(run_stream);
    e.static_inputs.clear();
    for (const auto& v : inputs) {
      const at::Tensor& t = *tensor_of(v);
      if (sig.bucket > 0 && t.dim() > 0) {
        std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
        shape[0] = sig.bucket;
        // Padding rows are zeros at first, then whatever the last larger batch left there:
        // rows are independent, so they never reach the real rows' outputs.
        e.static_inputs.push_back(at::zeros(shape, t.options()));
      } else {
        e.static_inputs.push_back(at::empty_strided(t.sizes(), t.strides(), t.options()));
      }
    }
    copy_in(e, inputs, sig, run_stream.stream());

    const c10::cuda::CUDAStream capture_stream =
        capture_on_run_stream_ ? run_stream
                               : c10::cuda::getStreamFromExternal(capture_stream_, device_.index());
    if (capture_stream != run_stream) {
      check(cudaEventRecord(ready_, run_stream.stream()), "cudaEventRecord");
      check(cudaStreamWaitEvent(capture_stream.stream(), ready_, 0), "cudaStreamWaitEvent");
    }
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    std::string why;
    c10::IValue outputs;
    if (uncached_allocator_) {
      why = "PYTORCH_NO_CUDA_MEMORY_CACHING is set: torch's uncached allocator frees a graph's "
            "memory at the end of its capture";
    } else {
      c10::cuda::CUDAStreamGuard on_capture(capture_stream);
      const Inputs replacement(e.static_inputs.begin(), e.static_inputs.end());
      bool begun = false;
      try {
        // Relaxed: the capture is on a stream of its own, and other threads of the process
        // (other runners, eager runs of this one) keep calling CUDA meanwhile.
#if TORCHLOOM_TORCH_VERSION >= 20100
        graph->capture_begin(pool_, cudaStreamCaptureModeRelaxed);
#else
        graph->capture_begin(pool_);  // older torch captures in global mode only
#endif
        begun = true;
        outputs = body(run_context{rc.device, capture_stream.unwrap()}, replacement);
      } catch (const std::exception& ex) {
        why = detail::torch_message(ex);
      }
      if (begun) {
        try {
          graph->capture_end();
        } catch (const std::exception& ex) {
          if (why.empty()) why = detail::torch_message(ex);
        }
      }
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
    e.static_outputs = std::move(outputs);
  }

  // Replays the entry's graph on the run's stream and returns copies of its outputs.
  template <class Inputs>
  c10::IValue replay(entry& e, const run_context& rc, const Inputs& inputs,
                     const signature& sig) {
    const c10::cuda::CUDAStream stream(c10::cuda::CUDAStream::UNCHECKED, rc.stream);
    c10::cuda::CUDAStreamGuard on_run(stream);
    // After the runner's previous replay, on whatever stream it ran: the pool and the static
    // buffers are this replay's alone.
    check(cudaStreamWaitEvent(stream.stream(), done_, 0), "cudaStreamWaitEvent");
    copy_in(e, inputs, sig, stream.stream());
    launch(e, stream.stream());
    c10::IValue out = copy_out(e.static_outputs, sig, stream.stream());
    check(cudaEventRecord(done_, stream.stream()), "cudaEventRecord");
    ++stats_.replays;
    return out;
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

  // The outputs as the caller's own tensors, in the structure the model returned.
  static c10::IValue copy_out(const c10::IValue& v, const signature& sig, cudaStream_t stream) {
    if (v.isTensor()) return fresh(v.toTensor(), sig, stream);
    if (v.isTuple()) {
      std::vector<c10::IValue> elements;
      elements.reserve(v.toTupleRef().elements().size());
      for (const auto& x : v.toTupleRef().elements()) {
        elements.push_back(copy_out(x, sig, stream));
      }
      return c10::ivalue::Tuple::create(std::move(elements));
    }
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorList().vec()) list.push_back(fresh(t, sig, stream));
    return list;
  }

  void check(cudaError_t rc, const char* what) const {
    if (rc == cudaSuccess) return;
    (void)cudaGetLastError();
    throw error(errc::cuda_error, model_,
                detail::concat("graphed: ", what, " failed: ", cudaGetErrorString(rc)));
  }

  // For the static helpers, which have no model name: the runner wraps what they throw as
  // run_failed with its name.
  static void check_static(cudaError_t rc, const char* what) {
    if (rc == cudaSuccess) return;
    (void)cudaGetLastError();
    throw std::runtime_error(
        detail::concat("graphed: ", what, " failed: ", cudaGetErrorString(rc)));
  }

  std::string model_;
  c10::Device device_;
  std::size_t max_shapes_;
  graph_batch_sizes buckets_;
  bool capture_on_run_stream_;
  at::cuda::MempoolId_t pool_{0, 0};
  cudaEvent_t done_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaStream_t capture_stream_ = nullptr;
  mutable std::mutex mutex_;
  std::list<entry> entries_;  // most recently used first
  std::unordered_map<std::string, std::list<entry>::iterator> index_;
  graph_stats stats_;
  bool warned_ = false;
  bool uncached_allocator_ = false;
};

}  // namespace torchloom::cuda
