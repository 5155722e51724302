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
//! Every stream policy is a no-op for a CPU device.
template <class S>
concept stream_policy =
    std::constructible_from<S, const model_context&> && std::is_nothrow_destructible_v<S> &&
    requires(S& s, c10::Device d, const std::vector<c10::IValue>& in) {
      { s.execute(d, in, detail::run_body_archetype{}) } -> std::same_as<c10::IValue>;
    };

}  // namespace torchloom
