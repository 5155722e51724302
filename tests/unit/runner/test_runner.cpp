// The runner with the TorchScript loader: outputs, input validation, options that take
// effect, process-wide settings, warm-up, and concurrent run().
#include "../../support/fixtures.hpp"

#include <torchloom/torchloom.hpp>

#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::temp_dir;

namespace {

using runner = torchloom::model_runner<torchloom::torchscript_loader>;

struct linear_model {
  temp_dir dir;
  torch::jit::Module module = torchloom_test::make_linear(8, 4);
  at::Tensor w = module.attr("w").toTensor();
  at::Tensor b = module.attr("b").toTensor();

  explicit linear_model(std::string_view config = {}) {
    torchloom_test::write_triton_model(dir / "linear", module, config);
  }
  model_spec spec() const { return model_spec::from_directory(dir / "linear"); }
  at::Tensor reference(const at::Tensor& x) const { return at::matmul(x, w.t()) + b; }
};

// A TorchScript model `name` whose code is `source`, saved as <t>/<name>.pt.
model_spec scripted_model(const temp_dir& t, const std::string& name, const std::string& source) {
  torch::jit::Module m(name);
  m.define(source);
  m.save((t / (name + ".pt")).string());
  return model_spec::from_file(t / (name + ".pt"));
}

constexpr std::string_view declared_config = R"(
name: "linear"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 8 ] } ]
)";

}  // namespace

TEST_CASE("run() returns the model's output", "[runner]") {
  linear_model lm;
  runner r(lm.spec());
  CHECK(r.name() == "linear");
  CHECK(r.device() == c10::Device(c10::kCPU));
  const auto x = torch::randn({3, 8});
  const auto out = r.run({x});
  REQUIRE(out.size() == 1);
  CHECK(torch::allclose(out[0], lm.reference(x), 1e-5, 1e-6));
  CHECK(out[0].is_inference());  // INFERENCE_MODE defaults to true
}

TEST_CASE("tuple and list outputs are flattened and run_ivalue returns them as they are",
          "[runner]") {
  temp_dir t;
  runner r(scripted_model(t, "multi", R"(
def forward(self, x):
    return (x + 1, [x * 2, x * 3])
)"));
  const auto x = torch::rand({2});
  const auto out = r.run({x});
  REQUIRE(out.size() == 3);
  CHECK(torch::equal(out[0], x + 1));
  CHECK(torch::equal(out[2], x * 3));
  CHECK(r.run_ivalue({x}).isTuple());
}

TEST_CASE("a non-tensor output is refused by run() with a pointer to run_ivalue()",
          "[runner]") {
  temp_dir t;
  runner r(scripted_model(t, "count", R"(
def forward(self, x):
    return x.size(0)
)"));
  CHECK_TORCHLOOM_ERROR(r.run({torch::rand({5})}), errc::unsupported, "model 'count'",
                        "run_ivalue");
  CHECK(r.run_ivalue({torch::rand({5})}).toInt() == 5);
}

TEST_CASE("bad inputs throw bad_input naming the input and the runner stays usable", "[runner]") {
  linear_model lm;
  runner r(lm.spec());
  REQUIRE(r.inputs().size() == 1);
  CHECK(r.inputs()[0].name == "x");
  CHECK_TORCHLOOM_ERROR(r.run({}), errc::bad_input, "model 'linear'", "expected 1 input (x)",
                        "got 0");
  CHECK_TORCHLOOM_ERROR(r.run({torch::rand({1, 8}), torch::rand({1, 8})}), errc::bad_input,
                        "got 2");
  CHECK_TORCHLOOM_ERROR(r.run({c10::IValue(3)}), errc::bad_input, "input 0 ('x')",
                        "must be a Tensor", "Int");
  CHECK_TORCHLOOM_ERROR(r.run({at::Tensor()}), errc::bad_input, "undefined Tensor");
  const auto x = torch::randn({2, 8});
  CHECK(torch::allclose(r.run({x})[0], lm.reference(x), 1e-5, 1e-6));
}

TEST_CASE("declared dtype and shape from config.pbtxt are checked", "[runner]") {
  linear_model lm(declared_config);
  runner r(lm.spec());
  REQUIRE(r.inputs()[0].dtype == c10::ScalarType::Float);
  REQUIRE(r.inputs()[0].shape == std::vector<std::int64_t>{-1, 8});
  CHECK_TORCHLOOM_ERROR(r.run({torch::ones({2, 8}, torch::kFloat64)}), errc::bad_input,
                        "input 0 ('x')", "must be float32", "float64");
  CHECK_TORCHLOOM_ERROR(r.run({torch::ones({2, 7})}), errc::bad_input, "shape [-1, 8]",
                        "[2, 7]");
  CHECK_TORCHLOOM_ERROR(r.run({torch::ones({8})}), errc::bad_input, "shape [-1, 8]");
  const auto x = torch::randn({5, 8});
  CHECK(torch::allclose(r.run({x})[0], lm.reference(x), 1e-5, 1e-6));
}

TEST_CASE("run_tensors() is run() for a loader without a tensor path", "[runner]") {
  STATIC_REQUIRE_FALSE(torchloom::tensor_loader<torchloom::torchscript_loader>);
  linear_model lm(declared_config);
  runner r(lm.spec());
  const auto x = torch::randn({5, 8});
  const auto out = r.run_tensors({x});
  REQUIRE(out.size() == 1);
  CHECK(torch::allclose(out[0], lm.reference(x), 1e-5, 1e-6));
  CHECK_TORCHLOOM_ERROR(r.run_tensors({torch::ones({2, 8}, torch::kFloat64)}), errc::bad_input,
                        "input 0 ('x')", "must be float32");
}

TEST_CASE("a config input the model does not have is an error", "[runner]") {
  linear_model lm(R"(
input [ { name: "x" data_type: TYPE_FP32 dims: [ 8 ] }, { name: "y" data_type: TYPE_FP32 } ]
)");
  CHECK_TORCHLOOM_ERROR(runner(lm.spec()), errc::invalid_option, "'y'");
}

TEST_CASE("non-tensor arguments are checked against the schema and defaults may be left out",
          "[runner]") {
  temp_dir t;
  runner r(scripted_model(t, "scale", R"(
def forward(self, x, factor: float = 2.0):
    return x * factor
)"));
  const auto x = torch::rand({3});
  CHECK(torch::allclose(r.run({x})[0], x * 2.0));
  CHECK(torch::allclose(r.run({x, 0.5})[0], x * 0.5));
  CHECK_TORCHLOOM_ERROR(r.run({x, "half"}), errc::bad_input, "input 1 ('factor')",
                        "must be float");
  CHECK_TORCHLOOM_ERROR(r.run({}), errc::bad_input, "expected 1 to 2 inputs");
}

TEST_CASE("an error raised by the model is run_failed with torch's message", "[runner]") {
  linear_model lm;  // no declared shape: the bad input reaches torch
  runner r(lm.spec());
  const auto e = torchloom_test::capture_error([&] { r.run({torch::rand({2, 5})}); });
  INFO(e.what());
  CHECK(e.code() == errc::run_failed);
  CHECK(torchloom_test::contains(e.what(), "model 'linear'"));
  CHECK(torchloom_test::contains(e.what(), "2x5"));
  CHECK_FALSE(torchloom_test::contains(e.what(), "Exception raised from"));  // no backtrace
  CHECK(r.run({torch::rand({2, 8})}).size() == 1);
}

TEST_CASE("parameters in config.pbtxt take effect: INFERENCE_MODE", "[runner]") {
  SECTION("absent: inference tensors") {
    linear_model lm("name: \"linear\"\n");
    runner r(lm.spec());
    CHECK(r.options().inference_mode);
    CHECK(r.run({torch::rand({1, 8})})[0].is_inference());
  }
  SECTION("present and false: ordinary tensors, still no autograd graph") {
    linear_model lm(R"(
parameters: { key: "INFERENCE_MODE" value: { string_value: "false" } }
)");
    runner r(lm.spec());
    CHECK_FALSE(r.options().inference_mode);
    const auto out = r.run({torch::rand({1, 8})})[0];
    CHECK_FALSE(out.is_inference());
    CHECK_FALSE(out.requires_grad());
  }
}

TEST_CASE("parameters take effect: executor switches and thread counts", "[runner]") {
  const bool profiling_before = torch::jit::getProfilingMode();
  {
    linear_model lm(R"(
parameters: { key: "ENABLE_JIT_PROFILING" value: { string_value: "false" } }
parameters: { key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } }
parameters: { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }
)");
    runner r(lm.spec());
    CHECK_FALSE(torch::jit::getProfilingMode());
    CHECK(at::get_num_threads() == 1);
    CHECK_FALSE(r.model().optimized_execution);
    const auto x = torch::randn({2, 8});
    CHECK(torch::allclose(r.run({x})[0], lm.reference(x), 1e-5, 1e-6));
    // The optimisation switch is per run: the calling thread's setting is restored.
    CHECK(torch::jit::getGraphExecutorOptimize());
  }
  torch::jit::getProfilingMode() = profiling_before;
}

TEST_CASE("conflicting process-wide settings are an error while the first runner lives",
          "[runner]") {
  linear_model lm;
  const int before = at::get_num_threads();
  {
    auto a = lm.spec();
    a.name = "first";
    a.set("INTRA_OP_THREAD_COUNT", "1");
    runner ra(a);
    auto b = lm.spec();
    b.name = "second";
    b.set("INTRA_OP_THREAD_COUNT", "2");
    CHECK_TORCHLOOM_ERROR(runner(b), errc::invalid_option, "model 'second'",
                          "INTRA_OP_THREAD_COUNT=2", "INTRA_OP_THREAD_COUNT=1",
                          "model 'first'", "process-wide");
    runner same(a);  // the same value is no conflict
    CHECK(at::get_num_threads() == 1);

    torchloom::on_setting_conflict(torchloom::setting_conflict::warn);
    CHECK_NOTHROW(runner(b));  // warns, keeps the first value
    CHECK(at::get_num_threads() == 1);
    torchloom::on_setting_conflict(torchloom::setting_conflict::error);
  }
  {
    auto b = lm.spec();
    b.set("INTRA_OP_THREAD_COUNT", "2");
    runner rb(b);  // the first runners are gone: the new value applies
    CHECK(at::get_num_threads() == 2);
  }
  at::set_num_threads(before);
}

TEST_CASE("WARMUP_ITERATIONS runs the model at load with synthesised inputs", "[runner]") {
  temp_dir t;
  torch::jit::Module m("counter");
  m.register_attribute("calls", c10::IntType::get(), 0);
  m.define(R"(
def forward(self, x):
    self.calls += 1
    return x * 2
)");
  torchloom_test::write_triton_model(t / "counter", m, R"(
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
parameters: { key: "WARMUP_ITERATIONS" value: { string_value: "3" } }
)");
  runner r(model_spec::from_directory(t / "counter"));
  CHECK(r.model().module.attr("calls").toInt() == 3);
  r.run({torch::rand({2, 3})});
  CHECK(r.model().module.attr("calls").toInt() == 4);

  torchloom_test::write_file(t / "counter" / "config.pbtxt", R"(
parameters: { key: "WARMUP_ITERATIONS" value: { string_value: "3" } }
)");
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "counter")), errc::invalid_option,
                        "WARMUP_ITERATIONS=3", "input 'x'");
}

TEST_CASE("a CUDA device where there is none, or an unknown device, is unsupported",
          "[runner]") {
  linear_model lm;
  const auto count = torch::cuda::device_count();
  CHECK_TORCHLOOM_ERROR(runner(lm.spec(), c10::Device(c10::kCUDA, static_cast<int8_t>(count))),
                        errc::unsupported, "model 'linear'", "cuda:" + std::to_string(count));
  CHECK_TORCHLOOM_ERROR(runner(lm.spec(), c10::Device("meta")), errc::unsupported, "meta");
}

TEST_CASE("concurrent run() from 8 threads gives every caller its own correct output",
          "[runner][concurrency]") {
  linear_model lm(declared_config);
  runner r(lm.spec());
  std::atomic<int> wrong{0};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        const auto x = torch::full({1 + (i + t) % 8, 8}, static_cast<float>(t * 1000 + i));
        const auto out = r.run({x});
        if (out.size() != 1 || !torch::allclose(out[0], lm.reference(x), 1e-4, 1e-3)) ++wrong;
        if (i % 10 == 0) {  // bad requests interleaved with good ones
          try {
            r.run({torch::rand({1, 3})});
            ++wrong;
          } catch (const torchloom::error& e) {
            if (e.code() != errc::bad_input) ++wrong;
          }
        }
        ++done;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(done == 800);
  CHECK(wrong == 0);
}

TEST_CASE("CUDA: CPU inputs move to the runner's device and outputs match the CPU run",
          "[runner][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  linear_model lm(declared_config);
  runner cpu(lm.spec());
  runner gpu(lm.spec(), c10::Device("cuda:0"));
  for (int i = 0; i < 10; ++i) {
    const auto x = torch::randn({4, 8});
    const auto out = gpu.run({x});
    REQUIRE(out.size() == 1);
    CHECK(out[0].device() == c10::Device("cuda:0"));
    CHECK(torch::allclose(out[0].cpu(), cpu.run({x})[0], 1e-4, 1e-5));
    CHECK(torch::allclose(gpu.run({x.cuda()})[0].cpu(), lm.reference(x), 1e-4, 1e-5));
  }
  // An input on another device than the runner's is not moved silently.
  CHECK_TORCHLOOM_ERROR(cpu.run({torch::randn({4, 8}).cuda()}), errc::bad_input,
                        "input 0 ('x') is on cuda:0", "runner is on cpu");
}

TEST_CASE("CUDA: concurrent run() on one GPU runner", "[runner][cuda][concurrency]") {
  TORCHLOOM_REQUIRE_CUDA();
  linear_model lm(declared_config);
  runner r(lm.spec(), c10::Device("cuda:0"));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        const auto x = torch::full({8, 8}, static_cast<float>(t * 100 + i));
        const auto out = r.run({x});
        if (!torch::allclose(out[0].cpu(), lm.reference(x), 1e-3, 1e-2)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
}
