// Hostile and broken inputs to the runner: a model.pt whose tensor records are short,
// declared shapes too large to synthesise, a None where the model takes an int, and the
// process-wide settings a failed construction claimed.
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <string>
#include <torchloom/torchloom.hpp>

#include "../../support/fixtures.hpp"
#include "../../support/model_archive.hpp"

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::temp_dir;

namespace {

using runner = torchloom::model_runner<torchloom::torchscript_loader>;

// A model with a parameter, a buffer and a tensor attribute that is neither.
torch::jit::Module make_three_tensor_model() {
  torch::jit::Module m("three");
  m.register_parameter("w", torch::randn({4, 8}), false);
  m.register_buffer("shift", torch::randn({4}));
  m.register_attribute("scale", c10::TensorType::get(), torch::full({4}, 2.0F));
  m.define(R"(
def forward(self, x):
    return (torch.linear(x, self.w) + self.shift) * self.scale
)");
  return m;
}

struct failing_init_hook {
  static int init(const torchloom::model_context&) { throw std::runtime_error("init refused"); }
  static void fini(int) noexcept {}
};

}  // namespace

TEST_CASE("A model.pt whose tensor record is shorter than its tensor fails at load",
          "[hostile][runner]") {
  temp_dir t;
  auto m = make_three_tensor_model();
  torchloom_test::write_triton_model(t / "three", m);
  const auto file = t / "three" / "1" / "model.pt";
  const auto good = t / "good.pt";
  std::filesystem::rename(file, good);

  std::vector<std::string> data_records;
  for (const auto& [name, bytes] : torchloom_test::read_archive(good)) {
    if (name.rfind("data/", 0) == 0) data_records.push_back(name);
  }
  REQUIRE(data_records.size() == 3);  // w, shift, scale
  for (const auto& victim : data_records) {
    for (const std::size_t cut : {4, 0}) {
      DYNAMIC_SECTION("record " << victim << " cut to " << cut << " bytes") {
        torchloom_test::rewrite_archive(good, file, [&](const std::string& name, std::string& b) {
          if (name == victim) b.resize(cut);
          return true;
        });
        const auto err = torchloom_test::capture_error(
            [&] { runner r(model_spec::from_directory(t / "three")); });
        INFO(err.what());
        CHECK(err.code() == errc::load_failed);
        CHECK(torchloom_test::contains(err.what(), "model 'three'"));
        CHECK(torchloom_test::contains(err.what(), file.string()));
        CHECK(
            torchloom_test::contains(err.what(), "its record holds " + std::to_string(cut) + ";"));
        const bool names_tensor = torchloom_test::contains(err.what(), "w (") ||
                                  torchloom_test::contains(err.what(), "shift (") ||
                                  torchloom_test::contains(err.what(), "scale (");
        CHECK(names_tensor);
      }
    }
  }
  SECTION("the untouched copy loads and runs") {
    torchloom_test::rewrite_archive(good, file,
                                    [](const std::string&, std::string&) { return true; });
    runner r(model_spec::from_directory(t / "three"));
    const auto x = torch::randn({2, 8});
    const auto w = m.attr("w").toTensor();
    const auto expected =
        (torch::linear(x, w) + m.attr("shift").toTensor()) * m.attr("scale").toTensor();
    CHECK(torch::allclose(r.run({x})[0], expected));
  }
}

TEST_CASE("WARMUP_ITERATIONS with declared dims too large to make is invalid_option",
          "[hostile][runner]") {
  temp_dir t;
  auto m = torchloom_test::make_linear(8, 4);
  torchloom_test::write_triton_model(t / "huge", m, R"(
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2147483648, 2147483648 ] } ]
parameters: { key: "WARMUP_ITERATIONS" value: { string_value: "1" } }
)");
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "huge")), errc::invalid_option,
                        "model 'huge'", "WARMUP_ITERATIONS=1", "input 'x'",
                        "[2147483648, 2147483648]");
}

TEST_CASE("None for an int argument is bad_input naming it", "[hostile][runner]") {
  temp_dir t;
  torch::jit::Module m("scaled");
  m.define(R"(
def forward(self, x, n: int, k: Optional[int] = None):
    return x * n
)");
  torchloom_test::write_triton_model(t / "scaled", m);
  runner r(model_spec::from_directory(t / "scaled"));
  CHECK_TORCHLOOM_ERROR(r.run({torch::ones({2}), c10::IValue()}), errc::bad_input, "model 'scaled'",
                        "'n'", "int");
  // Where the schema says Optional, None is fine; and the runner is still usable.
  CHECK(r.run({torch::ones({2}), c10::IValue(3), c10::IValue()})[0].equal(torch::full({2}, 3.0F)));
}

TEST_CASE("A failed construction leaves the process-wide settings as it found them",
          "[hostile][runner]") {
  temp_dir t;
  const int threads_before = at::get_num_threads();
  const int threads_other = threads_before == 1 ? 2 : 1;
  const bool profiling_before = torch::jit::getProfilingMode();
  const bool executor_before = torch::jit::getExecutorMode();
  const std::string params =
      "parameters: { key: \"INTRA_OP_THREAD_COUNT\" value: { string_value: \"" +
      std::to_string(threads_other) + "\" } }\n" +
      "parameters: { key: \"ENABLE_JIT_PROFILING\" value: { string_value: \"" +
      (profiling_before ? "false" : "true") + "\" } }\n" +
      "parameters: { key: \"ENABLE_JIT_EXECUTOR\" value: { string_value: \"" +
      (executor_before ? "false" : "true") + "\" } }\n";
  auto m = torchloom_test::make_linear(8, 4);

  SECTION("the model fails to load") {
    torchloom_test::write_triton_model(t / "broken", m, params);
    torchloom_test::write_file(t / "broken" / "1" / "model.pt", "not a TorchScript archive");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "broken")), errc::load_failed,
                          "model 'broken'");
  }
  SECTION("the hook fails") {
    torchloom_test::write_triton_model(t / "hooked", m, params);
    using hooked = torchloom::model_runner<torchloom::torchscript_loader,
                                           torchloom::static_hook<failing_init_hook>>;
    CHECK_TORCHLOOM_ERROR(hooked(model_spec::from_directory(t / "hooked")), errc::hook_failed,
                          "init refused");
  }
  SECTION("warm-up fails") {
    torchloom_test::write_triton_model(
        t / "warm", m,
        params +
            "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
            "parameters: { key: \"WARMUP_ITERATIONS\" value: { string_value: \"1\" } }\n");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "warm")), errc::run_failed,
                          "model 'warm'");
  }
  SECTION("a runner that loaded and is gone gives them back too") {
    torchloom_test::write_triton_model(t / "fine", m, params);
    {
      runner r(model_spec::from_directory(t / "fine"));
      CHECK(at::get_num_threads() == threads_other);
      CHECK(torch::jit::getProfilingMode() != profiling_before);
    }
  }
  CHECK(at::get_num_threads() == threads_before);
  CHECK(torch::jit::getProfilingMode() == profiling_before);
  CHECK(torch::jit::getExecutorMode() == executor_before);
  torch::jit::getProfilingMode() = profiling_before;
  torch::jit::getExecutorMode() = executor_before;
  at::set_num_threads(threads_before);
}
