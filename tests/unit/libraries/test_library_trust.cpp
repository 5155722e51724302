// Where hook and op libraries may come from: a library, its directory or one of its
// dependencies that others could have written is refused, as is one outside the model
// directory (through a symlink too) unless the application allows its directory.
#include "support/catch.hpp"
#include "support/fixtures.hpp"
#include "support/hook_fixtures.hpp"

#include <torchloom/torchloom.hpp>

#include <sys/stat.h>
#include <unistd.h>

using namespace torchloom_test;  // the fixtures of support/hook_fixtures.hpp
using torchloom::errc;

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
