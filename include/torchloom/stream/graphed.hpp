#pragma once

#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/error.hpp>
#include <torchloom/graph_stats.hpp>
#include <torchloom/options.hpp>
#include <torchloom/options/graph_options.hpp>
#include <torchloom/stream/caller.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <boost/mp11/list.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <string_view>
#include <utility>

// CUDA graphs need LibTorch >= 2.1: before, torch captures in global mode only, which any CUDA
// call of another thread (another runner's allocation) breaks. Below it graphed<S> refuses
// CUDA devices (see its constructor).
#if TORCHLOOM_HAS_CUDA && TORCHLOOM_TORCH_VERSION >= 20100
#define TORCHLOOM_CUDA_GRAPHS 1
#include <torchloom/cuda/graph_cache.hpp>
#else
#define TORCHLOOM_CUDA_GRAPHS 0
#endif

namespace torchloom {

//! A stream-policy adaptor that replays CUDA graphs: `graphed<caller_stream>`,
//! `graphed<pool_stream>`, `graphed<green_context_stream>`... For a CUDA device, per input
//! signature (the inputs' dtypes, shapes and contiguity; with CUDA_GRAPH_BATCH_SIZES the
//! batch dimension rounded up to its bucket) the first two runs run eagerly, the third
//! captures the model into a CUDA graph (torch's at::cuda::CUDAGraph, in one private memory
//! pool per runner) on buffers of its own, and from then on every run copies the inputs into
//! those buffers, replays the graph on the stream the wrapped policy chose, and returns
//! copies of the graph's outputs that the caller owns (with torch 2.8 and later, those copies
//! are memcpy nodes around the graph, so a replay is one launch). The wrapped policy's
//! fences and guarantees hold unchanged: the caller may use the outputs on its own stream at
//! once.
//!  - CUDA_GRAPH_MAX_SHAPES signatures are kept (least recently used goes; dropping a graph
//!    waits for the runner's last replay on the host).
//!  - A model that cannot be captured (it synchronises with the host, copies from pageable
//!    host memory, returns something other than tensors) runs eagerly for that signature,
//!    with one warning per runner on std::clog; inputs that are not all tensors on the
//!    runner's device always run eagerly.
//!  - Concurrent runs stay correct: a runner's replays are ordered one after another on the
//!    GPU (an event chain; the host never waits), eager runs overlap as usual.
//!  - Not with streamed_weights (a compile-time error says why).
//! A no-op for a CPU device, and in a build without CUDA (which has only CPU devices).
//! Throws what the wrapped policy throws, and cuda_error when a CUDA call fails.
template <class Stream>
class graphed {
  static_assert(stream_policy<Stream>,
                "torchloom: graphed<Stream> wraps a stream policy: Stream must satisfy "
                "torchloom::stream_policy; see torchloom/concepts/stream_policy.hpp");

 public:
  using stream_type = Stream;
  //! Runs are captured: the runner checks that the residency policy replays correctly.
  static constexpr bool captures_graphs = true;
  //! The options it reads: the wrapped policy's and its own (a runner without graphed
  //! refuses CUDA_GRAPH_* keys, see policy_option_readers).
  using option_blocks = boost::mp11::mp_push_back<option_blocks_of<Stream>, graph_options>;

  explicit graphed(const model_context& ctx) : inner_(ctx) {
    if (ctx.options.enable_cache_cleaning) {
      // Emptying torch's cache after a run synchronises the device, which a capture under
      // way on another thread does not survive.
      throw error(errc::invalid_option, ctx.name,
                  "ENABLE_CACHE_CLEANING cannot be combined with graphed<Stream>: emptying "
                  "the allocator's cache after each run synchronises the device, which breaks "
                  "a CUDA graph capture under way on another thread (and a graph keeps its "
                  "memory in a pool of its own anyway); turn one of them off");
    }
#if TORCHLOOM_HAS_CUDA && !TORCHLOOM_CUDA_GRAPHS
    if (ctx.device.is_cuda()) {
      throw error(errc::unsupported, ctx.name,
                  "graphed<Stream> needs LibTorch >= 2.1 on a CUDA device (older versions "
                  "capture in a mode that other threads' CUDA calls break); use the plain "
                  "stream policy");
    }
#endif
#if TORCHLOOM_CUDA_GRAPHS
    if (ctx.device.is_cuda()) {
      // A green context's kernels must be captured in that context (a kernel node runs in the
      // context it was captured in, wherever the graph is launched), on a stream of the
      // cache's own: the policy's stream is shared by every runner of the configuration.
      cuda::owned_stream capture_stream;
      constexpr bool context_bound = requires(const Stream& s) { s.context(); };
      if constexpr (context_bound) capture_stream = inner_.context()->make_stream(ctx.name);
      // Whether the streams the policy runs on instead of the caller's outlive the graphs.
      constexpr bool lasting = requires { requires Stream::streams_outlive_runner; };
      cache_ = std::make_unique<cuda::graph_cache>(ctx.name, ctx.device, ctx.options,
                                                   std::move(capture_stream), !context_bound,
                                                   lasting);
    }
#endif
  }

  //! Runs through the wrapped policy; a replay returns fresh copies of the graph's outputs,
  //! of the kind the body returns (c10::IValue or std::vector<at::Tensor>).
  template <class Inputs, class Body>
  detail::run_result_t<Body, Inputs> execute(c10::Device device, Inputs inputs, Body&& body) {
#if TORCHLOOM_CUDA_GRAPHS
    if (cache_ && device.is_cuda()) {
      return cache_->run(inner_, device, std::move(inputs), std::forward<Body>(body));
    }
#endif
    return inner_.execute(device, std::move(inputs), std::forward<Body>(body));
  }

  //! The wrapped policy.
  Stream& wrapped() noexcept { return inner_; }
  const Stream& wrapped() const noexcept { return inner_; }

  //! Captures, replays, eager runs and evictions so far (all zero on CPU).
  graph_stats stats() const {
#if TORCHLOOM_CUDA_GRAPHS
    if (cache_) return cache_->stats();
#endif
    return {};
  }

 private:
  Stream inner_;
#if TORCHLOOM_CUDA_GRAPHS
  std::unique_ptr<cuda::graph_cache> cache_;
#endif
};

static_assert(stream_policy<graphed<caller_stream>>);

}  // namespace torchloom
