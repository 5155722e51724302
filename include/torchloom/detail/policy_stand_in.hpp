#pragma once
#include <type_traits>

namespace torchloom::detail {

// When a policy fails its concept, the runner's members fall back to these stand-ins, so the
// user sees the static_assert naming the role and not a cascade of errors behind it.
struct invalid_policy_stand_in {
  const invalid_policy_stand_in& model() const noexcept { return *this; }
};
template <class L, class = void>
struct model_type_of {
  using type = invalid_policy_stand_in;
};
template <class L>
struct model_type_of<L, std::void_t<typename L::model_type>> {
  using type = typename L::model_type;
};
template <bool Valid, class Residency, class Loader>
struct holder_of {
  using type = typename Residency::template holder<Loader>;
};
template <class Residency, class Loader>
struct holder_of<false, Residency, Loader> {
  using type = invalid_policy_stand_in;
};

}  // namespace torchloom::detail
