#pragma once
#include <torchloom/concepts/residency_policy.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/libraries/library_trust.hpp>
#include <torchloom/options.hpp>
#include <torchloom/options/weight_options.hpp>

#include <sys/stat.h>

#include <cstddef>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace torchloom {

namespace detail {
// What in the options changes the object a loader makes: the loader's own load_key() where
// it has one (keyed_loader), else every option (never shares what might differ).
template <class Loader>
std::string load_key_of(const runner_options& o) {
  if constexpr (keyed_loader<Loader>) {
    return std::string(Loader::load_key(o));
  } else {
    return to_string(o);
  }
}

// The registry key: the file's real path and identity (so a file replaced on disk is loaded
// anew), the device and the options that change the loaded object. The loader is part of it
// through the registry being per loader type.
inline std::string shared_model_key(const load_context& ctx, const std::string& options_key) {
  const std::string path = real_path(ctx.file.string());
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return {};
  return concat(path, '\n', st.st_dev, ':', st.st_ino, ':', st.st_size, ':',
                st.st_mtim.tv_sec, '.', st.st_mtim.tv_nsec, '\n', ctx.device, '\n',
                options_key, ctx.graph_capture ? "\ngraph capture" : "");
}
}  // namespace detail

//! Runners of the same model on the same device share one loaded model: a process-wide,
//! thread-safe registry keyed by (real path of the model file and its identity on disk,
//! device, loader, options that change the loaded object). The last runner to go frees it.
//! ENABLE_WEIGHT_SHARING=false makes a runner load its own copy. Loads of different models
//! run concurrently; runners of one model wait for its one load. run() on shared runners may
//! run concurrently (the loaders' models allow it).
struct shared_weights {
  //! The options this policy reads: its switch, which every runner accepts (see
  //! shared_weights_options).
  using option_blocks = boost::mp11::mp_list<shared_weights_options>;

  template <class Loader>
  class holder {
    using model_type = typename Loader::model_type;

   public:
    holder(const Loader& l, const load_context& ctx) : model_(acquire(l, ctx)) {}

    const model_type& model() const noexcept { return *model_; }

    template <class Body>
    decltype(auto) execute(Body&& body) {
      return std::forward<Body>(body)(*model_);
    }

    //! How many runners hold this runner's model (this one included).
    long use_count() const noexcept { return model_.use_count(); }

    //! How many shared models of this loader type are loaded in the process.
    static std::size_t loaded_count() {
      auto& r = registry();
      std::lock_guard lock(r.mutex);
      std::size_t n = 0;
      for (const auto& [key, slot] : r.slots) n += slot->model.expired() ? 0 : 1;
      return n;
    }

   private:
    struct slot {
      std::mutex load;                  // held while this key's model loads
      std::weak_ptr<model_type> model;  // read and written under the registry's mutex
    };
    struct registry_state {
      std::mutex mutex;  // guards `slots` and each slot's `model`; never held while loading
      std::map<std::string, std::shared_ptr<slot>> slots;
    };
    static registry_state& registry() {
      static registry_state r;
      return r;
    }

    static std::shared_ptr<model_type> load(const Loader& l, const load_context& ctx) {
      return std::make_shared<model_type>(l.load(ctx));
    }

    static std::shared_ptr<model_type> acquire(const Loader& l, const load_context& ctx) {
      const shared_weights_options& options = ctx.spec.options;
      if (options.enable_weight_sharing == false) return load(l, ctx);
      const std::string key =
          detail::shared_model_key(ctx, detail::load_key_of<Loader>(ctx.spec.options));
      if (key.empty()) return load(l, ctx);  // no such file: the loader says so
      auto& r = registry();
      std::shared_ptr<slot> s;
      {
        std::lock_guard lock(r.mutex);
        // Drop the slots of freed models that nobody is loading (only the map holds them).
        for (auto it = r.slots.begin(); it != r.slots.end();) {
          const bool unused = it->second.use_count() == 1 && it->second->model.expired();
          it = unused && it->first != key ? r.slots.erase(it) : std::next(it);
        }
        auto& found = r.slots[key];
        if (!found) found = std::make_shared<slot>();
        s = found;
      }
      std::lock_guard loading(s->load);
      {
        std::lock_guard lock(r.mutex);
        if (auto m = s->model.lock()) return m;
      }
      auto m = load(l, ctx);
      std::lock_guard lock(r.mutex);
      s->model = m;
      return m;
    }

    std::shared_ptr<model_type> model_;
  };
};

static_assert(residency_policy_for<shared_weights, detail::loader_archetype>);

}  // namespace torchloom
