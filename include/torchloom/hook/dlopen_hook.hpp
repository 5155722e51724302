#pragma once
#include <torchloom/concepts/hook_policy.hpp>
#include <torchloom/detail/device_current.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/libraries/library_trust.hpp>
#include <torchloom/model_init.h>
#include <torchloom/options.hpp>
#include <torchloom/options/dlopen_hook_options.hpp>

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <boost/mp11/list.hpp>

#include <dlfcn.h>

#include <array>
#include <exception>
#include <memory>
#include <optional>
#include <string>

namespace torchloom {

//! Runs the model-init hook library that MODEL_INIT_LIBRARY names (C ABI:
//! torchloom/model_init.h, or Triton's triton_pytorch_model_init). A relative path resolves
//! against the model directory; the library must pass the trust checks of
//! torchloom/libraries/library_trust.hpp. It is loaded with dlopen(RTLD_NOW | RTLD_LOCAL) and its init
//! runs before the model loads, with the runner's CUDA device current. The destructor runs
//! fini exactly once (the runner destroys the model first), then dlcloses the library.
//! Without MODEL_INIT_LIBRARY it does nothing.
//! Fail-closed: a missing or untrusted file, a missing symbol, another ABI version or a
//! failing init throws torchloom::error (hook_failed) naming the model, the library and
//! dlerror() or the hook's own message, and leaves nothing loaded.
class dlopen_hook {
 public:
  //! The options this policy reads (a runner without it refuses them).
  using option_blocks = boost::mp11::mp_list<dlopen_hook_options>;

  explicit dlopen_hook(const model_context& ctx) {
    const dlopen_hook_options& options = ctx.options;
    const std::string& library = options.model_init_library;
    if (library.empty()) return;
    path_ = detail::trusted_library_path(ctx.name, "MODEL_INIT_LIBRARY", library,
                                         ctx.directory, errc::hook_failed);
    const auto fail = [&](const std::string& why) {
      return error(errc::hook_failed, ctx.name,
                   detail::concat("MODEL_INIT_LIBRARY '", path_, "': ", why));
    };
    const auto why_missing = [] {
      const char* e = ::dlerror();
      return std::string(e ? e : "no such symbol");
    };

    ::dlerror();
    std::unique_ptr<void, library_closer> lib(::dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL));
    if (!lib) throw fail(detail::concat("dlopen failed: ", why_missing()));
    const auto symbol = [&](const char* name) { return ::dlsym(lib.get(), name); };
    // A C++ hook may throw through the C ABI: its init fails like any other.
    const auto call_init = [&](const char* what, const auto& call) {
      try {
        call();
      } catch (const std::exception& e) {
        throw fail(detail::concat(what, " threw an exception: ", e.what()));
      } catch (...) {
        throw fail(detail::concat(what, " threw an exception"));
      }
    };

    const detail::device_current on_device(ctx.name, ctx.device);
    const int device_index = ctx.device.is_cuda() ? ctx.device.index() : -1;
    if (void* version = symbol("torchloom_model_init_abi_version")) {
      void* init = symbol("torchloom_model_init");
      if (!init) throw fail(detail::concat("no torchloom_model_init: ", why_missing()));
      void* fini = symbol("torchloom_model_fini");
      if (!fini) throw fail(detail::concat("no torchloom_model_fini: ", why_missing()));
      const unsigned abi = reinterpret_cast<torchloom_model_init_abi_version_fn>(version)();
      if (abi != TORCHLOOM_MODEL_INIT_ABI_VERSION) {
        throw fail(detail::concat("built for model-init ABI version ", abi,
                                  "; this torchloom has version ",
                                  TORCHLOOM_MODEL_INIT_ABI_VERSION,
                                  ": rebuild it against this torchloom's model_init.h"));
      }
      const std::string dir = ctx.directory.string();
      const std::string version_dir = ctx.version_directory.string();
      const torchloom_model_init_args args{ctx.name.c_str(), dir.c_str(), version_dir.c_str(),
                                           device_index};
      std::array<char, 4096> message{};
      int status = 0;
      call_init("init", [&] {
        status = reinterpret_cast<torchloom_model_init_fn>(init)(&args, &handle_,
                                                                 message.data(), message.size());
      });
      message.back() = '\0';
      if (status != TORCHLOOM_MODEL_INIT_OK) {
        handle_ = nullptr;
        throw fail(detail::concat("init failed (status ", status, "): ",
                                  message[0] ? message.data() : "the hook gave no message"));
      }
      fini_ = reinterpret_cast<torchloom_model_fini_fn>(fini);
    } else if (void* init = symbol("triton_pytorch_model_init")) {
      void* fini = symbol("triton_pytorch_model_fini");
      if (!fini) fini = symbol("triton_pytorch_model_release");
      if (!fini) {
        throw fail(detail::concat("exports triton_pytorch_model_init but neither "
                                  "triton_pytorch_model_fini nor triton_pytorch_model_release: ",
                                  why_missing()));
      }
      using triton_init = void* (*)(const char*, int);
      const std::string version_dir = ctx.version_directory.string();
      call_init("triton_pytorch_model_init", [&] {
        handle_ = reinterpret_cast<triton_init>(init)(version_dir.c_str(), device_index);
      });
      fini_ = reinterpret_cast<torchloom_model_fini_fn>(fini);
    } else {
      throw fail(detail::concat(
          "exports neither torchloom_model_init_abi_version (see torchloom/model_init.h) nor "
          "triton_pytorch_model_init: ",
          why_missing()));
    }
    library_ = lib.release();
    device_ = ctx.device;
  }

  ~dlopen_hook() {
    if (fini_) {
      try {
        // Fini sees the device init saw.
        std::optional<c10::DeviceGuard> on_device;
        if (device_.is_cuda()) on_device.emplace(device_);
        fini_(handle_);
      } catch (const std::exception& e) {
        TORCH_WARN("torchloom: MODEL_INIT_LIBRARY '", path_, "': fini threw: ", e.what());
      } catch (...) {
        TORCH_WARN("torchloom: MODEL_INIT_LIBRARY '", path_, "': fini threw an exception");
      }
    }
    if (library_) ::dlclose(library_);
  }

  dlopen_hook(const dlopen_hook&) = delete;
  dlopen_hook& operator=(const dlopen_hook&) = delete;

  //! The real path of the loaded hook library; empty when the model names none.
  const std::string& library() const noexcept { return path_; }

 private:
  struct library_closer {
    void operator()(void* lib) const noexcept { ::dlclose(lib); }
  };

  std::string path_;
  c10::Device device_{c10::kCPU};
  void* library_ = nullptr;
  void* handle_ = nullptr;
  torchloom_model_fini_fn fini_ = nullptr;
};

static_assert(hook_policy<dlopen_hook>);

}  // namespace torchloom
