#pragma once
#include <torchloom/concepts/loader.hpp>

#include <ATen/core/ivalue.h>

#include <concepts>
#include <type_traits>

namespace torchloom {

namespace detail {
//! Stands for the runner's body in the concept check: runs a loaded model.
template <class Model>
struct model_body_archetype {
  c10::IValue operator()(Model&) const;
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
//!  - `h.execute(Body&& body) -> c10::IValue`: calls `body(L::model_type&)` with the weights
//!    where the model expects them. Called from several threads at once.
template <class R, class L>
concept residency_policy_for =
    loader<L> && requires { typename R::template holder<L>; } &&
    std::constructible_from<typename R::template holder<L>, const L&, const load_context&> &&
    requires(typename R::template holder<L>& h) {
      { std::as_const(h).model() } -> std::same_as<const typename L::model_type&>;
      {
        h.execute(detail::model_body_archetype<typename L::model_type>{})
      } -> std::same_as<c10::IValue>;
    };

}  // namespace torchloom
