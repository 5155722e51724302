#pragma once
#include <torchloom/concepts/hook_policy.hpp>

namespace torchloom {

//! No model-init hook: an empty type that emits no code.
struct no_hook {
  constexpr explicit no_hook(const model_context&) noexcept {}
  no_hook(const no_hook&) = delete;
  no_hook& operator=(const no_hook&) = delete;
};

static_assert(hook_policy<no_hook>);

}  // namespace torchloom
