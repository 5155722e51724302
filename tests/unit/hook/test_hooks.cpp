// Model-init hooks (dlopen_hook, static_hook) and op libraries (OP_LIBRARIES), end to end:
// a model whose custom op reads embedding tables that a hook registers from weights/*.bin.
// The plug-ins are built in tests/plugins.
#include "support/aoti_fixtures.hpp"
#include "support/catch.hpp"
#include "support/fixtures.hpp"

#include "plugins/tl_test_tables.h"

#include <torchloom/torchloom.hpp>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using torchloom::errc;
using torchloom_test::temp_dir;

const fs::path plugin_build_dir = TL_TEST_PLUGIN_DIR;

std::string so(const std::string& name) { return "lib" + name + ".so"; }

// Copies `from` to `to` with `mode` (std::filesystem::copy_file is avoided for the reason
// temp_dir gives).
void copy_file(const fs::path& from, const fs::path& to, mode_t mode = 0755) {
  fs::create_directories(to.parent_path());
  {
    std::ifstream in(from, std::ios::binary);
    REQUIRE(in);
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
  }
  REQUIRE(::chmod(to.c_str(), mode) == 0);
}

fs::path install_plugin(const std::string& name, const fs::path& dir, mode_t mode = 0755) {
  copy_file(plugin_build_dir / so(name), dir / so(name), mode);
  return dir / so(name);
}

// A directory the application trusts for libraries, holding copies of every plug-in; the op
// library is loaded from there into this process once (the test needs its operator to
// define the model).
const fs::path& plugins() {
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
std::int64_t table_count() {
  return op_library_function<std::int64_t (*)()>("tl_test_table_count")();
}
std::int64_t unregister_calls() {
  return op_library_function<std::int64_t (*)()>("tl_test_unregister_calls")();
}

bool is_loaded(const fs::path& library) {
  void* h = ::dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h) ::dlclose(h);
  return h != nullptr;
}

void write_table(const fs::path& file, std::int32_t layer, const at::Tensor& t) {
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  const std::int64_t rows = t.size(0);
  const std::int64_t cols = t.size(1);
  out.write("TLTB", 4);
  out.write(reinterpret_cast<const char*>(&layer), sizeof layer);
  out.write(reinterpret_cast<const char*>(&rows), sizeof rows);
  out.write(reinterpret_cast<const char*>(&cols), sizeof cols);
  out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
}

struct e2e_options {
  std::string hook = "tl_test_hook";  // a plug-in copied into the model directory; "" none
  std::string hook_path;              // else: MODEL_INIT_LIBRARY as given
  std::string op_libraries;           // default: the trusted tl_test op library
  bool weights = true;
  bool weights_in_version_directory = false;  // where Triton-ABI hooks look
};

// A Triton-layout model directory: the model calls tl_test::lookup on two tables, whose
// weights are in weights/*.bin; config.pbtxt names the op library and the hook.
struct e2e_model {
  temp_dir dir;
  at::Tensor table0 = torch::randn({10, 4});
  at::Tensor table1 = torch::randn({10, 4});
  at::Tensor keys = torch::tensor({0, 3, 1, 7, 7, 9}, torch::kLong);

  explicit e2e_model(const e2e_options& o = {}) {
    plugins();
    torch::jit::Module m("embed");
    m.register_parameter("scale", torch::tensor({2.0F}), false);
    torchloom_test::define_with_ops(m, R"(
def forward(self, keys):
    return tl_test.lookup(keys, 0) * self.scale + tl_test.lookup(keys, 1)
)",
                                    {"tl_test"});
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
    torchloom_test::write_triton_model(dir.path(), m, config);
    if (o.weights) {
      const fs::path w = (o.weights_in_version_directory ? dir / "1" : dir.path()) / "weights";
      write_table(w / "table_0.bin", 0, table0);
      write_table(w / "table_1.bin", 1, table1);
    }
  }
  fs::path path() const { return dir.path(); }
  at::Tensor expected() const {
    return table0.index_select(0, keys) * 2.0 + table1.index_select(0, keys);
  }
};

using hooked_runner = torchloom::model_runner<torchloom::torchscript_loader, torchloom::dlopen_hook>;

// The static_hook variant: the same init code, linked into this program.
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

}  // namespace

TEST_CASE("dlopen_hook: the hook registers the tables, the model uses them, fini runs once",
          "[hook]") {
  e2e_model model;
  const auto calls = unregister_calls();
  const fs::path hook_lib = model.path() / so("tl_test_hook");
  {
    hooked_runner r(torchloom::model_spec::from_directory(model.path()));
    CHECK(r.name() == "embed");
    CHECK(table_count() == 2);
    CHECK(is_loaded(hook_lib));
    for (int i = 0; i < 3; ++i) {
      const auto out = r.run({model.keys});
      REQUIRE(out.size() == 1);
      CHECK(torch::equal(out[0], model.expected()));
    }
    CHECK(unregister_calls() == calls);  // no fini while the runner lives
  }
  CHECK(unregister_calls() == calls + 1);
  CHECK(table_count() == 0);
  CHECK_FALSE(is_loaded(hook_lib));
}

TEST_CASE("Without the hook, the model loads and its first run fails with the op's error",
          "[hook]") {
  e2e_model model;
  // A runner without dlopen_hook refuses MODEL_INIT_LIBRARY rather than ignore it...
  CHECK_TORCHLOOM_ERROR(torchloom::model_runner<torchloom::torchscript_loader>(
                            torchloom::model_spec::from_directory(model.path())),
                        errc::invalid_option, "model 'embed'", "MODEL_INIT_LIBRARY",
                        "dlopen_hook");
  // ...and without the option the model loads; the op then misses its table.
  auto spec = torchloom::model_spec::from_directory(model.path());
  spec.options.model_init_library.clear();
  torchloom::model_runner<torchloom::torchscript_loader> r(std::move(spec));
  CHECK_TORCHLOOM_ERROR(r.run({model.keys}), errc::run_failed, "model 'embed'",
                        "tl_test::lookup: no embedding table is registered for layer 0");
}

TEST_CASE("A failing init fails the load, leaves no library loaded and calls no fini",
          "[hook]") {
  e2e_options o;
  o.weights = false;
  e2e_model model(o);
  const auto calls = unregister_calls();
  const fs::path hook_lib = model.path() / so("tl_test_hook");
  CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                        errc::hook_failed, "model 'embed'", hook_lib.string(),
                        "init failed (status 1)", "no weights directory");
  CHECK_FALSE(is_loaded(hook_lib));
  CHECK(unregister_calls() == calls);
  CHECK(table_count() == 0);
}

TEST_CASE("dlopen_hook refuses a missing library, a missing symbol and another ABI version",
          "[hook]") {
  SECTION("missing file") {
    e2e_options o;
    o.hook = "";
    o.hook_path = "libnot_there.so";
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "model 'embed'", "MODEL_INIT_LIBRARY",
                          (model.path() / "libnot_there.so").string(), "No such file");
  }
  SECTION("not a shared library") {
    e2e_options o;
    o.hook = "";
    o.hook_path = "libbogus.so";
    e2e_model model(o);
    torchloom_test::write_file(model.path() / "libbogus.so", "not an ELF file");
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "libbogus.so", "dlopen failed");
  }
  SECTION("no fini") {
    e2e_options o;
    o.hook = "tl_test_hook_no_fini";
    e2e_model model(o);
    const auto calls = unregister_calls();
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, so("tl_test_hook_no_fini"),
                          "no torchloom_model_fini", "undefined symbol");
    CHECK(table_count() == 0);  // init never ran
    CHECK(unregister_calls() == calls);
    CHECK_FALSE(is_loaded(model.path() / so("tl_test_hook_no_fini")));
  }
  SECTION("ABI version") {
    e2e_options o;
    o.hook = "tl_test_hook_abi_mismatch";
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "built for model-init ABI version 999",
                          "this torchloom has version 1");
    CHECK(table_count() == 0);
    CHECK_FALSE(is_loaded(model.path() / so("tl_test_hook_abi_mismatch")));
  }
  SECTION("a library that is not a hook") {
    e2e_options o;
    o.hook = "";
    o.hook_path = (plugins() / so("tl_test_ops")).string();
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "exports neither torchloom_model_init_abi_version",
                          "triton_pytorch_model_init");
  }
}

TEST_CASE("Hooks written for Triton's ABI work unchanged", "[hook]") {
  for (const char* hook : {"tl_test_hook_triton_fini", "tl_test_hook_triton_release"}) {
    INFO(hook);
    e2e_options o;
    o.hook = hook;
    o.weights_in_version_directory = true;  // Triton gives the version directory
    e2e_model model(o);
    const auto calls = unregister_calls();
    {
      hooked_runner r(torchloom::model_spec::from_directory(model.path()));
      CHECK(torch::equal(r.run({model.keys})[0], model.expected()));
    }
    CHECK(unregister_calls() == calls + 1);
    CHECK(table_count() == 0);
    CHECK_FALSE(is_loaded(model.path() / so(hook)));
  }
}

TEST_CASE("static_hook runs the same init linked into the program", "[hook]") {
  SECTION("end to end") {
    e2e_options o;
    o.hook = "";
    e2e_model model(o);
    const auto calls = unregister_calls();
    {
      static_runner r(torchloom::model_spec::from_directory(model.path()));
      CHECK(torch::equal(r.run({model.keys})[0], model.expected()));
      CHECK(unregister_calls() == calls);
    }
    CHECK(unregister_calls() == calls + 1);
    CHECK(table_count() == 0);
  }
  SECTION("a failing init") {
    e2e_options o;
    o.hook = "";
    o.weights = false;
    e2e_model model(o);
    const auto calls = unregister_calls();
    CHECK_TORCHLOOM_ERROR(static_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "model 'embed'", "static_hook init failed",
                          "no weights directory");
    CHECK(unregister_calls() == calls);
  }
}

namespace {
struct throwing_hook {
  static int init(const torchloom::model_context&) { throw 42; }
  static void fini(int) noexcept {}
};
}  // namespace

TEST_CASE("static_hook: an init that throws something odd is still hook_failed", "[hook]") {
  e2e_options o;
  o.hook = "";
  e2e_model model(o);
  using runner =
      torchloom::model_runner<torchloom::torchscript_loader, torchloom::static_hook<throwing_hook>>;
  CHECK_TORCHLOOM_ERROR(runner(torchloom::model_spec::from_directory(model.path())),
                        errc::hook_failed, "model 'embed'", "not a std::exception");
}

TEST_CASE("Load and unload cycles leave nothing behind", "[hook]") {
  e2e_model model;
  const auto calls = unregister_calls();
  for (int i = 0; i < 20; ++i) {
    hooked_runner r(torchloom::model_spec::from_directory(model.path()));
    REQUIRE(torch::equal(r.run({model.keys})[0], model.expected()));
  }
  CHECK(unregister_calls() == calls + 20);
  CHECK(table_count() == 0);
  CHECK_FALSE(is_loaded(model.path() / so("tl_test_hook")));
}

TEST_CASE("Op libraries load once per process, copies included", "[hook]") {
  e2e_model first;
  const auto loaded = torchloom::detail::op_libraries().loaded.size();
  hooked_runner a(torchloom::model_spec::from_directory(first.path()));
  hooked_runner b(torchloom::model_spec::from_directory(first.path()));
  CHECK(torchloom::detail::op_libraries().loaded.size() == loaded);

  // Another model ships its own byte-identical copy: that is the same library.
  e2e_options o;
  o.hook = "";
  o.op_libraries = so("tl_test_ops");
  e2e_model second(o);
  install_plugin("tl_test_ops", second.path());
  torchloom::model_runner<torchloom::torchscript_loader> c(
      torchloom::model_spec::from_directory(second.path()));
  CHECK(torchloom::detail::op_libraries().loaded.size() == loaded);
  CHECK_FALSE(is_loaded(second.path() / so("tl_test_ops")));
}

TEST_CASE("An op library that registers what is already registered is refused", "[hook]") {
  const std::string first = (plugins() / so("tl_test_ops")).string();
  const auto loaded = torchloom::detail::op_libraries().loaded.size();
  SECTION("the same namespace (a second TORCH_LIBRARY)") {
    e2e_options o;
    o.op_libraries = (plugins() / so("tl_test_ops_namespace_conflict")).string();
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(
        hooked_runner(torchloom::model_spec::from_directory(model.path())),
        errc::op_library_conflict, "model 'embed'", o.op_libraries, first,
        "namespace 'tl_test'", "tl_test::lookup");
  }
  SECTION("the same operator") {
    e2e_options o;
    o.op_libraries = (plugins() / so("tl_test_ops_operator_conflict")).string();
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::op_library_conflict, o.op_libraries, first,
                          "operator tl_test::lookup");
  }
  SECTION("a new operator in a namespace another library owns") {
    e2e_options o;
    o.op_libraries = (plugins() / so("tl_test_ops_fragment_conflict")).string();
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::op_library_conflict, o.op_libraries, first,
                          "tl_test::other", "namespace 'tl_test'");
  }
  SECTION("only a kernel for an operator another library defines") {
    e2e_options o;
    o.op_libraries = (plugins() / so("tl_test_ops_kernel_conflict")).string();
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::op_library_conflict, o.op_libraries, first,
                          "kernel of operator tl_test::lookup");
    const auto op = c10::Dispatcher::singleton().findSchema({"tl_test::lookup", ""});
    REQUIRE(op.has_value());
    CHECK_FALSE(op->hasKernelForDispatchKey(c10::DispatchKey::Meta));
  }
  SECTION("a kernel that replaces torch's own (aten::relu for the CPU)") {
    e2e_options o;
    o.op_libraries = (plugins() / so("tl_test_ops_override_relu")).string();
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::op_library_conflict, "model 'embed'", o.op_libraries,
                          "kernel of operator aten::relu");
    // Nothing of it reached this process: relu still computes relu.
    CHECK(torch::relu(torch::tensor({-1.0F, 2.0F})).equal(torch::tensor({0.0F, 2.0F})));
  }
  CHECK(torchloom::detail::op_libraries().loaded.size() == loaded);
  CHECK_FALSE(c10::Dispatcher::singleton().findSchema({"tl_test::other", ""}).has_value());
  CHECK(table_count() == 0);  // the hook never ran
}

TEST_CASE("Trust checks refuse libraries others could have written", "[hook]") {
  SECTION("a world-writable hook library") {
    e2e_model model;
    REQUIRE(::chmod((model.path() / so("tl_test_hook")).c_str(), 0777) == 0);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "model 'embed'", "writable by others",
                          "mode 0777", so("tl_test_hook"));
  }
  SECTION("a group-writable model directory") {
    e2e_model model;
    REQUIRE(::chmod(model.path().c_str(), 0775) == 0);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "directory '", "writable by its group");
  }
  SECTION("a library outside the model directory") {
    temp_dir elsewhere;
    const fs::path outside = install_plugin("tl_test_hook", elsewhere.path());
    e2e_options o;
    o.hook = "";
    o.hook_path = outside.string();
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, outside.string(), "outside the model directory",
                          "allow_library_directory");
    CHECK_FALSE(is_loaded(outside));
  }
  SECTION("a symlink in the model directory to a library outside it") {
    temp_dir elsewhere;
    const fs::path outside = install_plugin("tl_test_hook", elsewhere.path());
    e2e_options o;
    o.hook = "";
    o.hook_path = "libhook.so";
    e2e_model model(o);
    REQUIRE(::symlink(outside.c_str(), (model.path() / "libhook.so").c_str()) == 0);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "libhook.so", outside.string(),
                          "outside the model directory");
  }
  SECTION("an op library outside the model directory") {
    temp_dir elsewhere;
    const fs::path outside = install_plugin("tl_test_ops", elsewhere.path());
    e2e_options o;
    o.op_libraries = outside.string();
    e2e_model model(o);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::load_failed, "OP_LIBRARIES", outside.string(),
                          "outside the model directory");
  }
  SECTION("a directory the application allows") {
    e2e_options o;
    o.hook = "";
    o.hook_path = (plugins() / so("tl_test_hook")).string();
    e2e_model model(o);
    hooked_runner r(torchloom::model_spec::from_directory(model.path()));
    CHECK(r.run({model.keys})[0].size(0) == 6);
  }
  CHECK(table_count() == 0);
}

TEST_CASE("A library's dependencies are held to the same trust rules", "[hook]") {
  // The hook needs libtl_test_dep.so, which the dynamic linker finds through the hook's
  // RUNPATH ($ORIGIN/deps).
  e2e_options o;
  o.hook = "tl_test_hook_with_dep";
  e2e_model model(o);
  const fs::path deps = model.path() / "deps";
  const fs::path dep = install_plugin("tl_test_dep", deps);
  SECTION("a dependency in a directory others can write to") {
    REQUIRE(::chmod(deps.c_str(), 0777) == 0);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "model 'embed'", so("tl_test_hook_with_dep"),
                          "needs 'libtl_test_dep.so'", "writable by others");
    CHECK_FALSE(is_loaded(model.path() / so("tl_test_hook_with_dep")));
    CHECK_FALSE(is_loaded(dep));
  }
  SECTION("a dependency file others can write to") {
    REQUIRE(::chmod(dep.c_str(), 0666) == 0);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "needs 'libtl_test_dep.so'", dep.filename().string(),
                          "writable by others");
    CHECK_FALSE(is_loaded(dep));
  }
  SECTION("a dependency outside the model directory and the allowed ones") {
    temp_dir elsewhere;
    REQUIRE(::unlink(dep.c_str()) == 0);
    install_plugin("tl_test_dep", elsewhere.path());
    REQUIRE(::symlink((elsewhere.path() / so("tl_test_dep")).c_str(), dep.c_str()) == 0);
    CHECK_TORCHLOOM_ERROR(hooked_runner(torchloom::model_spec::from_directory(model.path())),
                          errc::hook_failed, "needs 'libtl_test_dep.so'",
                          "outside the model directory");
  }
  SECTION("trusted dependencies load") {
    hooked_runner r(torchloom::model_spec::from_directory(model.path()));
    CHECK(torch::equal(r.run({model.keys})[0], model.expected()));
  }
  CHECK(table_count() == 0);
}

TEST_CASE("dlopen_hook without MODEL_INIT_LIBRARY does nothing", "[hook]") {
  e2e_options o;
  o.hook = "";
  e2e_model model(o);
  hooked_runner r(torchloom::model_spec::from_directory(model.path()));
  CHECK(table_count() == 0);
  CHECK_TORCHLOOM_ERROR(r.run({model.keys}), errc::run_failed, "no embedding table");
}

TEST_CASE("dlopen_hook on a CUDA device: init sees the device, the tables live there",
          "[hook][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  // CUDA first, so the op library's probe forks a process that has CUDA initialised (CTest
  // runs each test case in a process of its own).
  CHECK(torch::ones({1}, torch::Device(torch::kCUDA, 0)).sum().item<float>() == 1.0F);
  e2e_model model;
  hooked_runner r(torchloom::model_spec::from_directory(model.path()),
                  torch::Device(torch::kCUDA, 0));
  const auto out = r.run({model.keys});
  REQUIRE(out[0].is_cuda());
  CHECK(torch::equal(out[0].cpu(), model.expected()));
}

#if TORCHLOOM_TORCH_VERSION >= 20600
TEST_CASE("An AOTInductor package calls the op library's operator on the hook's tables",
          "[hook][aoti]") {
  // scripts/make_aoti_fixtures.py exports the same computation as e2e_model's TorchScript
  // model: lookup(keys, 0) * 2 + lookup(keys, 1).
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(package, "lookup_cpu");
  e2e_model model;
  copy_file(package / "1" / "model.pt2", model.path() / "1" / "model.pt2", 0644);
  const auto spec = torchloom::model_spec::from_directory(model.path());
  const auto calls = unregister_calls();
  {
    torchloom::model_runner<torchloom::aoti_loader, torchloom::dlopen_hook> r(spec);
    const auto out = r.run({model.keys});
    REQUIRE(out.size() == 1);
    CHECK(torch::allclose(out[0], model.expected()));
  }
  CHECK(unregister_calls() == calls + 1);
  // The runners below have no dlopen_hook, which would refuse MODEL_INIT_LIBRARY.
  auto spec_without_library = spec;
  spec_without_library.options.model_init_library.clear();
  {
    torchloom::model_runner<torchloom::aoti_loader, torchloom::static_hook<tables_hook>> r(
        spec_without_library);
    CHECK(torch::allclose(r.run({model.keys})[0], model.expected()));
  }
  CHECK(unregister_calls() == calls + 2);
  torchloom::model_runner<torchloom::aoti_loader> unhooked(spec_without_library);
  // AOTInductor logs the operator's message to stderr and reports only a failed call.
  CHECK_TORCHLOOM_ERROR(unhooked.run({model.keys}), errc::run_failed, "model 'embed'",
                        "the error itself, such as a custom operator's message, was logged "
                        "to stderr");
}
#endif

namespace {

// What the process holds: resident memory, open descriptors, mapped shared objects.
struct process_usage {
  long rss_kib = 0;
  std::size_t fds = 0;
  std::set<std::string> libraries;
  std::size_t mappings = 0;
};

process_usage current_usage() {
  process_usage u;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) u.rss_kib = std::stol(line.substr(6));
  }
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++u.fds;
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    ++u.mappings;
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find(".so") != std::string::npos) u.libraries.insert(path);
  }
  return u;
}

}  // namespace

TEST_CASE("Soak: 1,000 construct/destroy cycles leave memory, descriptors and libraries as "
          "they were",
          "[.][soak]") {
  temp_dir linear_dir;
  auto linear = torchloom_test::make_linear(8, 4);
  torchloom_test::write_triton_model(linear_dir / "linear", linear);
  e2e_model hooked;  // op library, hook, weights
  e2e_options no_weights;
  no_weights.weights = false;
  e2e_model failing_hook(no_weights);  // the hook's init fails
  e2e_model failing_load;              // the hook runs, then the model fails to load
  torchloom_test::write_file(failing_load.path() / "1" / "model.pt", "not a TorchScript file");
  const auto x = torch::randn({2, 8});

  const auto cycle = [&](int i) {
    switch (i % 4) {
      case 0: {
        torchloom::model_runner<torchloom::torchscript_loader> r(
            torchloom::model_spec::from_directory(linear_dir / "linear"));
        REQUIRE(r.run({x})[0].size(1) == 4);
        break;
      }
      case 1: {
        hooked_runner r(torchloom::model_spec::from_directory(hooked.path()));
        REQUIRE(torch::equal(r.run({hooked.keys})[0], hooked.expected()));
        break;
      }
      case 2:
        REQUIRE_THROWS_AS(hooked_runner(torchloom::model_spec::from_directory(failing_hook.path())),
                          torchloom::error);
        break;
      default:
        REQUIRE_THROWS_AS(hooked_runner(torchloom::model_spec::from_directory(failing_load.path())),
                          torchloom::error);
        break;
    }
  };
  for (int i = 0; i < 100; ++i) cycle(i);  // allocator pools and torch's caches settle
  const auto before = current_usage();
  for (int i = 0; i < 500; ++i) cycle(i);
  const auto half = current_usage();
  for (int i = 500; i < 1000; ++i) cycle(i);
  const auto after = current_usage();
  WARN("RSS KiB: " << before.rss_kib << " -> " << half.rss_kib << " -> " << after.rss_kib
                   << "; fds " << before.fds << " -> " << after.fds << "; mappings "
                   << before.mappings << " -> " << after.mappings << "; libraries "
                   << before.libraries.size() << " -> " << after.libraries.size());
  CHECK(after.fds == before.fds);
  CHECK(after.libraries == before.libraries);
  CHECK_FALSE(is_loaded(hooked.path() / so("tl_test_hook")));
  // A leak of 8 KiB per cycle would add 8 MiB; allocator noise is far below that, and the
  // second half of the cycles must add no more than the first settles.
  CHECK(after.rss_kib - before.rss_kib < 8 * 1024);
  CHECK(after.rss_kib - half.rss_kib < 4 * 1024);
  CHECK(table_count() == 0);
}
