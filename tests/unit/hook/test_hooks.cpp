// Model-init hooks (dlopen_hook, static_hook), end to end: a model whose custom op reads
// embedding tables that a hook registers from weights/*.bin; the hook's symbols and ABI
// versions, Triton's hook ABI, failing inits, load and unload cycles, a CUDA device and an
// AOTInductor package. The plug-ins are built in tests/plugins.
#include "support/aoti_fixtures.hpp"
#include "support/catch.hpp"
#include "support/fixtures.hpp"
#include "support/hook_fixtures.hpp"

#include <torchloom/torchloom.hpp>

#include <string>

using namespace torchloom_test;  // the fixtures of support/hook_fixtures.hpp
using torchloom::errc;

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
  e2e_options o;
  o.package = package / "1" / "model.pt2";
  e2e_model model(o);
  const auto spec = torchloom::model_spec::from_directory(model.path());
  REQUIRE(spec.platform.name == "torch_aoti");  // the version directory holds model.pt2 alone
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

TEST_CASE("A torch_aoti repository on the GPU whose package reads the tables a hook registers, "
          "through both hook ABIs",
          "[hook][aoti][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  // CUDA first, so the op library's probe forks a process that has CUDA initialised.
  CHECK(torch::ones({1}, torch::Device(torch::kCUDA, 0)).sum().item<float>() == 1.0F);
  // The deployment this project was made for: a package compiled for CUDA whose custom
  // operator looks its tables up in a process-global registry, which MODEL_INIT_LIBRARY fills
  // before the package loads and empties when it unloads; a Triton config with a parameters
  // block, INFERENCE_MODE among them.
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(package, "lookup_cuda");
  struct abi {
    const char* hook;
    bool weights_in_version_directory;  // Triton's ABI gets the version directory
  };
  for (const abi& a : {abi{"tl_test_hook", false}, abi{"tl_test_hook_triton_release", true},
                       abi{"tl_test_hook_triton_fini", true}}) {
    INFO(a.hook);
    e2e_options o;
    o.hook = a.hook;
    o.weights_in_version_directory = a.weights_in_version_directory;
    o.package = package / "1" / "model.pt2";
    o.config = R"(backend: "pytorch"
platform: "torch_aoti"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
parameters { key: "INFERENCE_MODE" value: { string_value: "true" } }
parameters { key: "ENABLE_CACHE_CLEANING" value: { string_value: "true" } }
parameters { key: "AOTI_NUM_RUNNERS" value: { string_value: "2" } }
)";
    e2e_model model(o);
    const auto spec = torchloom::model_spec::from_directory(model.path());
    REQUIRE(spec.platform.name == "torch_aoti");
    REQUIRE(torchloom::loader_for(spec) == torchloom::loader_kind::aoti);
    CHECK(spec.options.inference_mode);
    CHECK(spec.options.enable_cache_cleaning);
    const auto calls = unregister_calls();
    {
      torchloom::model_runner<torchloom::aoti_loader, torchloom::dlopen_hook,
                              torchloom::pool_stream>
          r(spec);
      CHECK(r.device() == torch::Device(torch::kCUDA, 0));  // from instance_group
      CHECK(table_count() == 2);  // registered by the hook before the package loaded
      CHECK(r.inputs()[0].dtype == c10::ScalarType::Long);  // from config.pbtxt
      const auto out = r.run({model.keys});  // CPU keys, moved to the GPU
      REQUIRE(out.size() == 1);
      CHECK(out[0].is_cuda());
      CHECK(out[0].is_inference());  // INFERENCE_MODE in effect
      CHECK(torch::allclose(out[0].cpu(), model.expected()));
      const auto named = r.run_named({{"ARGS[0]", model.keys.cuda()}});
      CHECK(torch::allclose(named.at("OUTPUT__0").toTensor().cpu(), model.expected()));
      const auto ordinal = r.run_named({{"INPUT__0", model.keys}});
      CHECK(torch::allclose(ordinal.at("OUTPUT__0").toTensor().cpu(), model.expected()));
      CHECK(unregister_calls() == calls);  // not released while the model is loaded
    }
    CHECK(unregister_calls() == calls + 1);  // released exactly once, at unload
    CHECK(table_count() == 0);
    CHECK_FALSE(is_loaded(model.path() / so(a.hook)));
  }
}
#endif
