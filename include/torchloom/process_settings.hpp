#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>

#include <atomic>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace torchloom {

//! What happens when a runner asks for a process-wide torch setting (thread pools, JIT
//! executor and profiling modes) that differs from the value a live runner already set.
enum class setting_conflict {
  error,  //!< the second runner's construction throws invalid_option (the default)
  warn,   //!< a warning on std::clog; the first value stays
};

namespace detail {

struct setting_registry {
  struct entry {
    std::string value;
    std::string owner;
    int holders = 0;
    std::function<void()> undo;  // puts back what was in force before the first holder
  };
  std::mutex mutex;
  std::map<std::string, entry> entries;
  std::atomic<setting_conflict> policy{setting_conflict::error};

  static setting_registry& instance() {
    static setting_registry r;
    return r;
  }
};

}  // namespace detail

//! Chooses how conflicting process-wide settings are treated, for the whole process.
inline void on_setting_conflict(setting_conflict policy) noexcept {
  detail::setting_registry::instance().policy = policy;
}

namespace detail {

//! A runner's hold on one process-wide setting; released when the runner goes (or when its
//! construction fails). While any runner holds a setting, another value for it is a conflict;
//! when the last holder lets go, the value that was in force before the first one returns.
class setting_claim {
 public:
  setting_claim() = default;
  setting_claim(setting_claim&& o) noexcept : key_(std::exchange(o.key_, {})) {}
  setting_claim& operator=(setting_claim&& o) noexcept {
    if (this != &o) {
      release();
      key_ = std::exchange(o.key_, {});
    }
    return *this;
  }
  ~setting_claim() { release(); }

  //! Claims `key` = `value` for `model`; calls `apply` when no runner holds the key yet.
  //! `apply` sets the value and returns what undoes it (an empty function where torch cannot
  //! undo it). Throws invalid_option on a conflict (unless the policy is warn), and wraps
  //! what `apply` throws.
  template <class Apply>
  static setting_claim make(const std::string& key, const std::string& value,
                            const std::string& model, Apply&& apply) {
    auto& reg = setting_registry::instance();
    std::lock_guard lock(reg.mutex);
    auto& e = reg.entries[key];
    if (e.holders > 0 && e.value != value) {
      std::string msg =
          concat(key, "=", value, " conflicts with ", key, "=", e.value, " set by model '",
                 e.owner, "'; this torch setting is process-wide");
      if (reg.policy == setting_conflict::error) {
        throw error(errc::invalid_option, model, msg);
      }
      std::clog << "torchloom: warning: model '" << model << "': " << msg << "; keeping "
                << e.value << '\n';
      return {};
    }
    if (e.holders == 0) {  // torch may have been changed since: always apply
      try {
        e.undo = apply();
      } catch (const error&) {
        throw;
      } catch (const std::exception& ex) {
        throw error(errc::invalid_option, model,
                    concat("cannot set ", key, "=", value, ": ", torch_message(ex)));
      }
      e.value = value;
      e.owner = model;
    }
    ++e.holders;
    setting_claim c;
    c.key_ = key;
    return c;
  }

 private:
  void release() noexcept {
    if (key_.empty()) return;
    auto& reg = setting_registry::instance();
    std::lock_guard lock(reg.mutex);
    auto& e = reg.entries[key_];
    key_.clear();
    if (--e.holders > 0) return;
    auto undo = std::exchange(e.undo, {});
    if (!undo) return;
    try {
      undo();
    } catch (const std::exception& ex) {
      std::clog << "torchloom: warning: cannot restore a process-wide torch setting: "
                << torch_message(ex) << '\n';
    }
  }

  std::string key_;
};

}  // namespace detail
}  // namespace torchloom
