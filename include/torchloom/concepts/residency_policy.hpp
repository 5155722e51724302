#pragma once
#include <torchloom/concepts/loader.hpp>
#include <torchloom/context.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <concepts>
#include <type_traits>
#include <vector>

namespace torchloom {

namespace detail {
//! Stands for the runner's body in the concept check: runs a loaded model and returns
//! `Result`.
template <class Model, class Result>
struct model_body_archetype {
  Result operator()(Model&) const;
};

//! Whether a run under residency policy R may be captured into a CUDA graph and replayed
//! (graphed<Stream>): true unless R says `static constexpr bool graph_capturable = false`.
template <class R>
inline constexpr bool graph_capturable = !requires {
  requires !R::graph_capturable;
};
}  // namespace detail

//! A residency policy decides where a model's weights live. Required, for a loader L:
//!  - `typename R::template holder<L>`, constructible from `(const L&, const load_context&)`:
//!    loads (or finds) the model and places its weights; throws torchloom::error;
//!  - `h.model() -> const L::model_type&`: the loaded model (for its signature);
//!  - `h.execute(Body&& body)`: calls `body(L::model_type&)` with the weights where the model
//!    expects them and returns what the body returns (`c10::IValue` for run_ivalue(),
//!    `std::vector<at::Tensor>` for run_tensors()). Called from several threads at once.
template <class R, class L>
concept residency_policy_for =
    loader<L> && requires { typename R::template holder<L>; } &&
    std::constructible_from<typename R::template holder<L>, const L&, const load_context&> &&
    requires(typename R::template holder<L>& h) {
      { std::as_const(h).model() } -> std::same_as<const typename L::model_type&>;
      {
        h.execute(detail::model_body_archetype<typename L::model_type, c10::IValue>{})
      } -> std::same_as<c10::IValue>;
      {
        h.execute(detail::model_body_archetype<typename L::model_type, std::vector<at::Tensor>>{})
      } -> std::same_as<std::vector<at::Tensor>>;
    };

}  // namespace torchloom
