#pragma once
#include <torchloom/concepts/hook_policy.hpp>
#include <torchloom/detail/device_current.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

namespace torchloom {

//! What static_hook<T> needs of T:
//!  - `T::init(const model_context&)` returns the hook's state (any movable type); it may
//!    throw to fail the load;
//!  - `T::fini(state) noexcept` releases it.
template <class T>
concept static_hook_target =
    requires(const model_context& ctx) { T::init(ctx); } &&
    std::is_move_constructible_v<decltype(T::init(std::declval<const model_context&>()))> &&
    requires(decltype(T::init(std::declval<const model_context&>())) state) {
      { T::fini(std::move(state)) } noexcept;
    };

namespace detail {
// The state type, or a stand-in when T does not fit (the static_assert says why, alone).
template <class T, bool = static_hook_target<T>>
struct static_hook_state {
  using type = decltype(T::init(std::declval<const model_context&>()));
};
template <class T>
struct static_hook_state<T, false> {
  using type = int;
};
}  // namespace detail

//! A model-init hook linked into the program: no dlopen. T::init runs before the model loads,
//! with the runner's CUDA device current; T::fini runs once, after the model is destroyed.
//! An exception from T::init fails the load: a torchloom::error passes through as it is,
//! anything else becomes hook_failed naming the model and the exception's message.
template <class T>
class static_hook {
  static_assert(static_hook_target<T>,
                "torchloom: static_hook<T> needs `static State T::init(const "
                "torchloom::model_context&)` and `static void T::fini(State) noexcept`; see "
                "torchloom/hook/static_hook.hpp");

 public:
  using state_type = typename detail::static_hook_state<T>::type;

  explicit static_hook(const model_context& ctx) : device_(ctx.device), state_(init(ctx)) {}
  ~static_hook() {
    if constexpr (static_hook_target<T>) {
      // Fini sees the device init saw (a guard cannot fail for a device init could use).
      std::optional<c10::DeviceGuard> on_device;
      if (device_.is_cuda()) on_device.emplace(device_);
      T::fini(std::move(state_));
    }
  }

  static_hook(const static_hook&) = delete;
  static_hook& operator=(const static_hook&) = delete;

  //! The state T::init returned.
  const state_type& state() const noexcept { return state_; }

 private:
  static state_type init(const model_context& ctx) {
    const detail::device_current on_device(ctx.name, ctx.device);
    try {
      if constexpr (static_hook_target<T>) {
        return T::init(ctx);
      } else {
        return state_type{};
      }
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      throw error(errc::hook_failed, ctx.name,
                  detail::concat("static_hook init failed: ", e.what()));
    } catch (...) {
      throw error(errc::hook_failed, ctx.name,
                  "static_hook init failed: it threw something that is not a std::exception");
    }
  }

  c10::Device device_;
  [[no_unique_address]] state_type state_;
};

}  // namespace torchloom
