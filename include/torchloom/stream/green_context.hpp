#pragma once
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/options.hpp>
#include <torchloom/options/green_context_options.hpp>
#include <torchloom/stream/stream_fence.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <boost/mp11/list.hpp>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#if TORCHLOOM_HAS_CUDA
#include <torchloom/cuda/green_context.hpp>
#endif

namespace torchloom {

//! Which SMs a green-context stream policy takes.
enum class green_partition {
  first,       //!< GREEN_CONTEXT_SM_COUNT SMs
  complement,  //!< the SMs left over after those GREEN_CONTEXT_SM_COUNT
};

#if TORCHLOOM_HAS_CUDA

//! Runs the model on the stream of a CUDA green context that holds part of the GPU's SMs:
//! its kernels run only on those SMs, so a co-tenant in the complement partition never
//! shares an SM with it. At construction, for a CUDA device: a green context with
//! GREEN_CONTEXT_SM_COUNT SMs (`first`) or with every SM outside those (`complement`), made
//! once per process and configuration and shared by the runners that ask for it
//! (cuda::shared_green_context says why). Each run is fenced with the
//! caller's current stream both ways as in pool_stream, so the caller may use the outputs on
//! its own stream right after run() returns; concurrent runs of one runner share its one
//! green stream. No host synchronisation per run. A no-op on CPU.
//! Throws (constructor) invalid_option when GREEN_CONTEXT_SM_COUNT is unset or the device
//! cannot be split that way (the message says which counts work), unsupported when the
//! driver or device has no green contexts, cuda_error when a driver call fails.
template <green_partition P>
class basic_green_context_stream {
 public:
  static constexpr green_partition partition = P;
  //! The options this policy reads (a runner without it refuses them).
  using option_blocks = boost::mp11::mp_list<green_context_options>;
  //! Its stream is the context's, which it holds: graphed<> relies on it outliving the graphs.
  static constexpr bool streams_outlive_runner = true;

  explicit basic_green_context_stream(const model_context& ctx) {
    if (ctx.device.is_cpu()) return;
    if (!ctx.device.is_cuda()) {
      throw error(errc::unsupported, ctx.name,
                  detail::concat(policy_name(), " needs a CUDA device, not ", ctx.device));
    }
    const green_context_options& options = ctx.options;
    const auto& count = options.green_context_sm_count;
    if (!count) {
      throw error(errc::invalid_option, ctx.name,
                  detail::concat("GREEN_CONTEXT_SM_COUNT is not set: ", policy_name(),
                                 P == green_partition::first
                                     ? " needs the number of SMs for its green context"
                                     : " takes the SMs left after the first "
                                       "GREEN_CONTEXT_SM_COUNT",
                                 "; set it in the model's options (config.pbtxt parameters "
                                 "or model_spec::set)"));
    }
    context_ = cuda::shared_green_context(
        ctx.name, ctx.device.has_index() ? ctx.device.index() : c10::DeviceIndex{0}, count->value,
        P == green_partition::first ? cuda::sm_split_part::group : cuda::sm_split_part::remaining);
  }

  template <class Inputs, class Body>
  detail::run_result_t<Body, Inputs> execute(c10::Device device, Inputs inputs, Body&& body) {
    if (device.is_cpu() || !context_) {
      return detail::run_on_host(device, std::move(inputs), std::forward<Body>(body));
    }
    // run_fenced records the inputs on the caller's stream, never on the green stream: an
    // input may outlive this runner and its stream.
    return detail::run_fenced(device, context_->stream().unwrap(), std::move(inputs),
                              std::forward<Body>(body));
  }

  //! SMs actually in the partition (0 on CPU).
  int sm_count() const noexcept { return context_ ? context_->sm_count() : 0; }
  //! The green context (empty on CPU).
  const std::shared_ptr<cuda::green_context>& context() const noexcept { return context_; }

 private:
  static constexpr const char* policy_name() noexcept {
    return P == green_partition::first ? "green_context_stream" : "green_context_complement_stream";
  }

  std::shared_ptr<cuda::green_context> context_;
};

#else

//! Without CUDA (TORCHLOOM_HAS_CUDA == 0) green contexts do not exist: a runner that uses this
//! policy does not compile, and says why. The header itself stays includable.
template <green_partition P>
class basic_green_context_stream {
 public:
  static constexpr green_partition partition = P;
  //! The options this policy reads (a runner without it refuses them).
  using option_blocks = boost::mp11::mp_list<green_context_options>;

  template <class T = void>
  explicit basic_green_context_stream(const model_context&) {
    static_assert(detail::dependent_false<T>,
                  "torchloom: green_context_stream needs CUDA: link torchloom::cuda (CUDA "
                  "toolkit and a CUDA build of torch); see torchloom/stream/green_context.hpp");
  }

  // Never called: no object of this type can be constructed in this build.
  template <class Inputs, class Body>
  detail::run_result_t<Body, Inputs> execute(c10::Device, Inputs, Body&&) {
    return {};
  }

  int sm_count() const noexcept { return 0; }
};

#endif

//! GREEN_CONTEXT_SM_COUNT SMs of the runner's GPU.
using green_context_stream = basic_green_context_stream<green_partition::first>;
//! The SMs of the runner's GPU outside the first GREEN_CONTEXT_SM_COUNT: a runner with this
//! policy and one with green_context_stream, given the same count, split the GPU between them.
using green_context_complement_stream = basic_green_context_stream<green_partition::complement>;

static_assert(stream_policy<green_context_stream>);
static_assert(stream_policy<green_context_complement_stream>);

}  // namespace torchloom
