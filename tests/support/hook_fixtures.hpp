#pragma once
// The hook and op-library tests' fixtures: a trusted directory holding every plug-in, the op
// library's counters, and e2e_model, a Triton-layout model whose custom op reads embedding
// tables that a hook registers from weights/*.bin.
#include "catch.hpp"
#include "fixtures.hpp"
#include "plugins.hpp"

#include "plugins/tl_test_tables.h"

#include <torchloom/torchloom.hpp>

#include <dlfcn.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace torchloom_test {

//! A directory the application trusts for libraries, holding copies of every plug-in; the op
//! library is loaded from there into this process once (the tests need its operator to
//! define the model).
inline const fs::path& plugins() {
  static temp_dir dir;
  static const bool ready = [] {
    for (const char* name :
         {"tl_test_ops", "tl_test_ops_namespace_conflict", "tl_test_ops_operator_conflict",
          "tl_test_ops_fragment_conflict", "tl_test_ops_kernel_conflict",
          "tl_test_ops_override_relu", "tl_test_hook", "tl_test_hook_triton_fini",
          "tl_test_hook_triton_release", "tl_test_hook_abi_mismatch", "tl_test_hook_no_fini"}) {
      install_plugin(name, dir.path());
    }
    torchloom::allow_library_directory(dir.path());
    torchloom::detail::load_op_libraries("fixture", dir.path(), {so("tl_test_ops")});
    return true;
  }();
  (void)ready;
  return dir.path();
}

template <class F>
F op_library_function(const char* name) {
  void* f = ::dlsym(RTLD_DEFAULT, name);
  REQUIRE(f != nullptr);
  return reinterpret_cast<F>(f);
}

//! How many embedding tables the op library holds now.
inline std::int64_t table_count() {
  return op_library_function<std::int64_t (*)()>("tl_test_table_count")();
}

//! How many times the hook's fini has unregistered the tables, in this process.
inline std::int64_t unregister_calls() {
  return op_library_function<std::int64_t (*)()>("tl_test_unregister_calls")();
}

//! Whether `library` is loaded in this process.
inline bool is_loaded(const fs::path& library) {
  void* h = ::dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h) ::dlclose(h);
  return h != nullptr;
}

struct e2e_options {
  std::string hook = "tl_test_hook";  // a plug-in copied into the model directory; "" none
  std::string hook_path;              // else: MODEL_INIT_LIBRARY as given
  std::string op_libraries;           // default: the trusted tl_test op library
  bool weights = true;
  bool weights_in_version_directory = false;  // where Triton-ABI hooks look
  // An AOTInductor package of the same model: the version directory holds it as model.pt2
  // instead of the TorchScript model.pt.
  fs::path package;
  std::string config;  // more config.pbtxt lines (a platform, parameters, instance_group)
};

//! A Triton-layout model directory: the model calls tl_test::lookup on two tables, whose
//! weights are in weights/*.bin; config.pbtxt names the op library and the hook.
struct e2e_model {
  temp_dir dir;
  at::Tensor table0 = torch::randn({10, 4});
  at::Tensor table1 = torch::randn({10, 4});
  at::Tensor keys = torch::tensor({0, 3, 1, 7, 7, 9}, torch::kLong);

  explicit e2e_model(const e2e_options& o = {}) {
    plugins();
    torch::jit::Module m = make_embed_module();
    std::string config = "name: \"embed\"\n";
    const std::string ops =
        o.op_libraries.empty() ? (plugins() / so("tl_test_ops")).string() : o.op_libraries;
    config += "parameters { key: \"OP_LIBRARIES\" value: { string_value: \"" + ops + "\" } }\n";
    std::string hook = o.hook_path;
    if (hook.empty() && !o.hook.empty()) {
      install_plugin(o.hook, dir.path());
      hook = so(o.hook);
    }
    if (!hook.empty()) {
      config += "parameters { key: \"MODEL_INIT_LIBRARY\" value: { string_value: \"" + hook +
                "\" } }\n";
    }
    config += o.config;
    if (o.package.empty()) {
      write_triton_model(dir.path(), m, config);
    } else {
      fs::create_directories(dir / "1");
      fs::copy_file(o.package, dir / "1" / "model.pt2");
      write_file(dir / "config.pbtxt", config);
    }
    if (o.weights) {
      const fs::path w = (o.weights_in_version_directory ? dir / "1" : dir.path()) / "weights";
      write_table(w / "table_0.bin", 0, table0);
      write_table(w / "table_1.bin", 1, table1);
    }
  }
  fs::path path() const { return dir.path(); }
  at::Tensor expected() const { return embed_reference(table0, table1, keys); }
};

using hooked_runner = torchloom::model_runner<torchloom::torchscript_loader, torchloom::dlopen_hook>;

//! The static_hook variant: the same init code, linked into this program.
struct tables_hook {
  static int init(const torchloom::model_context& ctx) {
    char message[512] = {};
    const int device = ctx.device.is_cuda() ? ctx.device.index() : -1;
    if (tl_test_load_tables(ctx.directory.c_str(), device, message, sizeof message) != 0) {
      throw std::runtime_error(message);
    }
    return 1;
  }
  static void fini(int) noexcept { tl_test_unload_tables(); }
};
using static_runner =
    torchloom::model_runner<torchloom::torchscript_loader, torchloom::static_hook<tables_hook>>;

}  // namespace torchloom_test
