#pragma once
#include <torchloom/concepts/residency_policy.hpp>

#include <utility>

namespace torchloom {

//! The weights stay on the runner's device for the runner's lifetime: the loader's model is
//! held as is.
struct resident_weights {
  template <class Loader>
  class holder {
   public:
    holder(const Loader& l, const load_context& ctx) : model_(l.load(ctx)) {}

    const typename Loader::model_type& model() const noexcept { return model_; }

    template <class Body>
    decltype(auto) execute(Body&& body) {
      return std::forward<Body>(body)(model_);
    }

   private:
    typename Loader::model_type model_;
  };
};

static_assert(residency_policy_for<resident_weights, detail::loader_archetype>);

}  // namespace torchloom
