// Op libraries (OP_LIBRARIES): each loads once per process, a byte-identical copy included,
// and a library that registers what another already registered (a namespace, an operator, a
// kernel, a kernel of torch's own) is refused before any of it reaches the process.
#include "support/catch.hpp"
#include "support/fixtures.hpp"
#include "support/hook_fixtures.hpp"

#include <torchloom/torchloom.hpp>

#include <string>

using torchloom::errc;
using namespace torchloom_test;  // the fixtures of support/hook_fixtures.hpp

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
