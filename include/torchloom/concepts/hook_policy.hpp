#pragma once
#include <torchloom/context.hpp>

#include <concepts>
#include <type_traits>

namespace torchloom {

//! A hook policy runs native set-up for a model before it loads. Required:
//!  - `H(const model_context&)`: runs the init (after op libraries, before the loader);
//!    throws torchloom::error (hook_failed) and leaves nothing behind when it fails;
//!  - a noexcept destructor: runs the fini, once, after the model is destroyed.
//! An empty hook (no_hook) costs nothing in the runner.
template <class H>
concept hook_policy = std::constructible_from<H, const model_context&> &&
                      std::is_nothrow_destructible_v<H> && !std::is_copy_constructible_v<H>;

}  // namespace torchloom
