#pragma once
#include <torchloom/context.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <concepts>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom {

//! run_tensors()'s inputs as a stream policy receives them: the caller's tensors, lent for the
//! whole call (alive until execute() returns). The loader only reads them, so the runner
//! hands on a reference rather than a copy, which would cost an allocation per call.
using lent_tensors = std::reference_wrapper<const std::vector<at::Tensor>>;

namespace detail {
//! Stands for the runner's body in the concept check: runs the model on the inputs it is
//! handed (an rvalue: the body consumes them) and returns `Result`.
template <class Inputs, class Result>
struct run_body_archetype {
  Result operator()(const run_context&, Inputs&&) const;
};

//! What a stream policy's execute() returns: what its body returns for these inputs.
template <class Body, class Inputs>
using run_result_t = std::invoke_result_t<Body, const run_context&, Inputs&&>;

//! True for a stream policy that captures runs into CUDA graphs (see stream_policy).
template <class S>
inline constexpr bool captures_graphs = requires {
  requires S::captures_graphs;
};
}  // namespace detail

//! A stream policy decides on which CUDA stream a model runs. Required:
//!  - `S(const model_context&)`: may create streams or contexts (throws cuda_error,
//!    unsupported);
//!  - `s.execute(c10::Device, Inputs inputs, Body&& body) -> detail::run_result_t<Body, Inputs>`
//!    for the two kinds of inputs the runner passes, by value:
//!     - `std::vector<c10::IValue>` (run(), run_ivalue()): the runner's own, moved in; the
//!       policy owns them;
//!     - `lent_tensors` (run_tensors()): the caller's tensors, alive until execute() returns.
//!    It calls `body(run_context, Inputs&&)` with the stream to use, ordered after the
//!    caller's pending work on the inputs, and hands the body either the inputs it was given
//!    (moved: the body consumes them, and the loader may free them while kernels that read
//!    them are still queued) or inputs of its own of the same kind (graphed runs the model on
//!    buffers it owns). What the policy needs of the inputs after the body (to keep their
//!    memory from being reused before the model has read it) it takes before handing them
//!    on. It returns what the body returns: `c10::IValue` for run_ivalue(),
//!    `std::vector<at::Tensor>` for run_tensors() (detail::for_each_tensor visits either kind
//!    of inputs and outputs). The result must be safe to use on the caller's current stream
//!    with no further synchronisation. Called from several threads at once.
//! Optional: `S::captures_graphs == true` says runs are captured and replayed as CUDA graphs
//! (the residency policy must then be graph_capturable, see residency_policy.hpp).
//! Every stream policy is a no-op for a CPU device.
template <class S>
concept stream_policy =
    std::constructible_from<S, const model_context&> && std::is_nothrow_destructible_v<S> &&
    requires(S& s, c10::Device d, std::vector<c10::IValue>&& values, lent_tensors tensors) {
      {
        s.execute(d, std::move(values),
                  detail::run_body_archetype<std::vector<c10::IValue>, c10::IValue>{})
      } -> std::same_as<c10::IValue>;
      {
        s.execute(d, tensors,
                  detail::run_body_archetype<lent_tensors, std::vector<at::Tensor>>{})
      } -> std::same_as<std::vector<at::Tensor>>;
    };

}  // namespace torchloom
