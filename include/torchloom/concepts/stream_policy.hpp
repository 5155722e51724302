#pragma once
#include <torchloom/concepts/loader.hpp>
#include <torchloom/model_spec.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <concepts>
#include <type_traits>
#include <vector>

namespace torchloom {

namespace detail {
//! Stands for the runner's body in the concept check: runs the model on a run_context.
struct run_body_archetype {
  c10::IValue operator()(const run_context&) const;
  c10::IValue operator()(const run_context&, std::vector<c10::IValue>) const;
};

//! Calls the one of its lambdas that fits the arguments.
template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};

//! True for a stream policy that returns outputs of its own (see stream_policy).
template <class S>
inline constexpr bool returns_own_outputs = requires {
  requires S::returns_own_outputs;
};

//! True for a stream policy that captures runs into CUDA graphs (see stream_policy).
template <class S>
inline constexpr bool captures_graphs = requires {
  requires S::captures_graphs;
};
}  // namespace detail

//! A stream policy decides on which CUDA stream a model runs. Required:
//!  - `S(const model_context&)`: may create streams or contexts (throws cuda_error,
//!    unsupported);
//!  - `s.execute(c10::Device, const std::vector<c10::IValue>& inputs, Body&& body)
//!    -> c10::IValue`: calls `body(run_context)` with the stream to use, ordered after the
//!    caller's pending work on the inputs; the result must be safe to use on the caller's
//!    current stream with no further synchronisation. Called from several threads at once.
//!    The runner also calls it with a `const std::vector<at::Tensor>&` (run_tensors): a
//!    template on the inputs' type takes both (detail::for_each_tensor visits either).
//! The runner's body may also be called as `body(run_context, Inputs replacement)`: it then
//! runs the model on `replacement` (same kind as the inputs) instead of the caller's inputs;
//! an adaptor that runs the model on buffers of its own (graphed) uses it.
//! Optional: `S::returns_own_outputs == true` says execute() returns tensors of its own
//! rather than what the body returned (run_tensors then takes them from the result), and
//! `S::captures_graphs == true` says runs are captured and replayed as CUDA graphs (the
//! residency policy must then be graph_capturable, see residency_policy.hpp).
//! Every stream policy is a no-op for a CPU device.
template <class S>
concept stream_policy =
    std::constructible_from<S, const model_context&> && std::is_nothrow_destructible_v<S> &&
    requires(S& s, c10::Device d, const std::vector<c10::IValue>& in) {
      { s.execute(d, in, detail::run_body_archetype{}) } -> std::same_as<c10::IValue>;
    };

}  // namespace torchloom
