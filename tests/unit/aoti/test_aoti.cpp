// The runner with the AOTInductor loader: outputs against the Python reference, inputs
// checked from what the package declares, concurrent run(), every stream policy, files that
// are not packages, and Triton's torch_aoti repositories (names, batching). Needs
// LibTorch >= 2.6; with an older one this file compiles to nothing. The packages come from
// scripts/make_aoti_fixtures.py (TORCHLOOM_AOTI_FIXTURES or the build tree's aoti_fixtures/);
// without them the cases that need one are skipped.
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600

#include "../../support/aoti_fixtures.hpp"
#include "../../support/fixtures.hpp"
#include "../../support/streams.hpp"

#include <torchloom/torchloom.hpp>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::current_cuda_stream;
using torchloom_test::pool_cuda_stream;
using torchloom_test::temp_dir;

namespace {

namespace fs = std::filesystem;

template <class Stream = torchloom::caller_stream>
using runner = torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook, Stream>;

// What the fixture script saved next to each package: the inputs it ran the model on and
// the model's outputs in Python (buffers in0, in1, ... and out0, out1, ... of a TorchScript
// module, readable without Python).
struct reference {
  std::vector<c10::IValue> inputs;
  std::vector<at::Tensor> outputs;
};

reference read_reference(const fs::path& dir) {
  const auto holder = torch::jit::load((dir / "reference.pt").string());
  reference ref;
  for (const auto& b : holder.named_buffers()) {
    if (b.name.rfind("in", 0) == 0) ref.inputs.emplace_back(b.value);
    if (b.name.rfind("out", 0) == 0) ref.outputs.push_back(b.value);
  }
  return ref;
}

std::vector<c10::IValue> on(const std::vector<c10::IValue>& inputs, c10::Device device) {
  std::vector<c10::IValue> out;
  for (const auto& v : inputs) out.emplace_back(v.toTensor().to(device));
  return out;
}

bool matches(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!torch::allclose(got[i].cpu(), want[i].cpu(), 1e-4, 1e-4)) return false;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// No fixture needed.

TEST_CASE("AOTI: a version directory without model.pt2 is model_not_found naming the path",
          "[aoti]") {
  temp_dir t;
  fs::create_directories(t / "m" / "1");
  CHECK_TORCHLOOM_ERROR(runner<>(model_spec::from_directory(t / "m")), errc::model_not_found,
                        "model 'm'", (t / "m" / "1" / "model.pt2").string(), "does not exist");
}

TEST_CASE("AOTI: a file that is not a zip archive is load_failed before torch reads it", "[aoti]") {
  temp_dir t;
  torchloom_test::write_file(t / "m" / "1" / "model.pt2", "this is not a package");
  CHECK_TORCHLOOM_ERROR(runner<>(model_spec::from_directory(t / "m")), errc::load_failed,
                        (t / "m" / "1" / "model.pt2").string(), "not a zip archive");
  torchloom_test::write_file(t / "empty.pt2", "");
  CHECK_TORCHLOOM_ERROR(runner<>(model_spec::from_file(t / "empty.pt2")), errc::load_failed,
                        "empty.pt2", "not a zip archive");
}

TEST_CASE("AOTI: a corrupt zip archive is load_failed with torch's message and the path",
          "[aoti]") {
  temp_dir t;
  std::ofstream(t / "broken.pt2", std::ios::binary)
      << std::string("PK\x03\x04", 4) << std::string(200, 'x');
  CHECK_TORCHLOOM_ERROR(runner<>(model_spec::from_file(t / "broken.pt2")), errc::load_failed,
                        "model 'broken'", "cannot load AOTInductor package",
                        (t / "broken.pt2").string());
}

// ---------------------------------------------------------------------------------------
// The CPU package (its config.pbtxt declares the input's dtype and shape).

TEST_CASE("AOTI: the CPU package's outputs equal the Python reference", "[aoti]") {
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cpu");
  const reference ref = read_reference(dir);
  runner<> r(model_spec::from_directory(dir));
  REQUIRE(r.inputs().size() == 1);
  CHECK(r.inputs()[0].name == "x");
  CHECK(r.inputs()[0].dtype == c10::ScalarType::Float);
  CHECK(r.inputs()[0].shape == std::vector<std::int64_t>{-1, 64});
  const auto out = r.run(ref.inputs);
  CHECK(matches(out, ref.outputs));
  // A single .pt2 file works as well as the Triton layout.
  runner<> from_file(model_spec::from_file(dir / "1" / "model.pt2"));
  CHECK(matches(from_file.run(ref.inputs), ref.outputs));
}

TEST_CASE("AOTI: wrong count, dtype or shape is bad_input naming the input; nothing runs",
          "[aoti]") {
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cpu");
  const reference ref = read_reference(dir);
  runner<> r(model_spec::from_directory(dir));
  const auto x = ref.inputs.front().toTensor();
  CHECK_TORCHLOOM_ERROR(r.run({}), errc::bad_input, "model 'mlp_cpu'", "expected 1 input (x)",
                        "got 0");
  CHECK_TORCHLOOM_ERROR(r.run({x, x}), errc::bad_input, "got 2");
  CHECK_TORCHLOOM_ERROR(r.run({x.to(torch::kFloat64)}), errc::bad_input, "input 0 ('x')",
                        "must be float32", "float64");
  CHECK_TORCHLOOM_ERROR(r.run({torch::rand({2, 63})}), errc::bad_input, "input 0 ('x')",
                        "shape [-1, 64]");
  CHECK(matches(r.run(ref.inputs), ref.outputs));  // still usable

  // The same checks on the unboxed path.
  CHECK(matches(r.run_tensors({x}), ref.outputs));
  CHECK_TORCHLOOM_ERROR(r.run_tensors({}), errc::bad_input, "expected 1 input (x)", "got 0");
  CHECK_TORCHLOOM_ERROR(r.run_tensors({x.to(torch::kFloat64)}), errc::bad_input,
                        "input 0 ('x')", "must be float32", "float64");
  CHECK_TORCHLOOM_ERROR(r.run_tensors({torch::rand({2, 63})}), errc::bad_input,
                        "input 0 ('x')", "shape [-1, 64]");
  CHECK_TORCHLOOM_ERROR(r.run_tensors({at::Tensor()}), errc::bad_input, "undefined Tensor");
  CHECK(matches(r.run_tensors({x}), ref.outputs));
}

TEST_CASE("AOTI: WARMUP_ITERATIONS synthesises inputs from the declared specs", "[aoti]") {
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cpu");
  const reference ref = read_reference(dir);
  runner<> r(model_spec::from_directory(dir).set("WARMUP_ITERATIONS", "3"));
  CHECK(matches(r.run(ref.inputs), ref.outputs));
}

TEST_CASE("AOTI: concurrent run() from 8 threads with AOTI_NUM_RUNNERS=4 (CPU)",
          "[aoti][concurrency]") {
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cpu");
  const reference ref = read_reference(dir);
  runner<> r(model_spec::from_directory(dir).set("AOTI_NUM_RUNNERS", "4"));
  REQUIRE(matches(r.run(ref.inputs), ref.outputs));
  // Expected outputs come from the runner alone, one call at a time.
  std::vector<at::Tensor> xs;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(torch::randn({1 + i, 64}));
    expected.push_back(r.run({xs.back()}).front());
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const int k = (t + i) % 8;
        if (!matches(r.run({xs[k]}), {expected[k]})) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
}

// ---------------------------------------------------------------------------------------
// CUDA packages (their metadata declares the inputs).

TEST_CASE("AOTI CUDA: outputs equal the Python reference; CPU inputs are moved", "[aoti][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cuda");
  const reference ref = read_reference(dir);
  runner<> r(model_spec::from_directory(dir), c10::Device("cuda:0"));
  REQUIRE(r.inputs().size() == 1);
  CHECK(r.inputs()[0].name == "x");
  CHECK(r.inputs()[0].dtype == c10::ScalarType::Float);
  CHECK(r.inputs()[0].shape == std::vector<std::int64_t>{-1, 64});
  const auto out = r.run(on(ref.inputs, c10::Device("cuda:0")));
  REQUIRE(out.size() == 1);
  CHECK(out[0].device() == c10::Device("cuda:0"));
  CHECK(matches(out, ref.outputs));
  // run_tensors moves CPU inputs too.
  const auto unboxed = r.run_tensors({ref.inputs.front().toTensor().cpu()});
  REQUIRE(unboxed.size() == 1);
  CHECK(unboxed[0].device() == c10::Device("cuda:0"));
  CHECK(matches(unboxed, ref.outputs));
  CHECK(matches(r.run(ref.inputs), ref.outputs));  // CPU inputs
}

TEST_CASE("AOTI CUDA: two inputs of different dtypes; wrong dtype or count is bad_input",
          "[aoti][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "two_inputs_cuda");
  const reference ref = read_reference(dir);
  REQUIRE(ref.inputs.size() == 2);
  runner<> r(model_spec::from_directory(dir).set("WARMUP_ITERATIONS", "2"), c10::Device("cuda:0"));
  REQUIRE(r.inputs().size() == 2);
  CHECK(r.inputs()[0].name == "x");
  CHECK(r.inputs()[1].name == "ids");
  CHECK(r.inputs()[0].dtype == c10::ScalarType::Float);
  CHECK(r.inputs()[1].dtype == c10::ScalarType::Long);
  const auto inputs = on(ref.inputs, c10::Device("cuda:0"));
  CHECK(matches(r.run(inputs), ref.outputs));
  const auto x = inputs[0].toTensor();
  const auto ids = inputs[1].toTensor();
  CHECK_TORCHLOOM_ERROR(r.run({x, ids.to(torch::kInt32)}), errc::bad_input, "input 1 ('ids')",
                        "must be int64", "int32");
  CHECK_TORCHLOOM_ERROR(r.run({ids, x}), errc::bad_input, "input 0 ('x')", "must be float32");
  CHECK_TORCHLOOM_ERROR(r.run({x}), errc::bad_input, "expected 2 inputs (x, ids)", "got 1");
  CHECK(matches(r.run(inputs), ref.outputs));
}

TEST_CASE(
    "AOTI CUDA: an input on another device is bad_input; a package for another device "
    "type is unsupported",
    "[aoti][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(cpu_dir, "mlp_cpu");
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(cuda_dir, "mlp_cuda");
  const reference ref = read_reference(cpu_dir);
  runner<> cpu(model_spec::from_directory(cpu_dir));
  CHECK_TORCHLOOM_ERROR(cpu.run(on(ref.inputs, c10::Device("cuda:0"))), errc::bad_input,
                        "input 0 ('x') is on cuda:0", "runner is on cpu");
  CHECK_TORCHLOOM_ERROR(runner<>(model_spec::from_directory(cuda_dir)), errc::unsupported,
                        "compiled for cuda", "runner is on cpu");
  CHECK_TORCHLOOM_ERROR(runner<>(model_spec::from_directory(cpu_dir), c10::Device("cuda:0")),
                        errc::unsupported, "compiled for cpu", "runner is on cuda:0");
}

#if TORCHLOOM_HAS_CUDA
TEST_CASE("AOTI CUDA: mapped_weights serves the package's constants from mapped host memory",
          "[aoti][cuda][mapped]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cuda");
  const reference ref = read_reference(dir);
  const c10::Device gpu("cuda:0");
  using mapped_runner =
      torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook,
                              torchloom::caller_stream, torchloom::mapped_weights>;
  runner<> resident(model_spec::from_directory(dir), gpu);
  mapped_runner mapped(model_spec::from_directory(dir), gpu);
  const auto inputs = on(ref.inputs, gpu);
  const auto want = resident.run(inputs);
  const auto got = mapped.run(inputs);
  REQUIRE(got.size() == 1);
  CHECK(torch::equal(got[0], want[0]));
  CHECK(matches(got, ref.outputs));
  CHECK(mapped.memory().device_bytes == 0);
  CHECK(mapped.memory().host_bytes > 0);
  // Every constant the package now runs with lies in host memory.
  const auto constants =
      mapped.model().package->get_runner()->extract_constants_map(/*use_inactive=*/false);
  REQUIRE_FALSE(constants.empty());
  for (const auto& [name, t] : constants) {
    cudaPointerAttributes where{};
    REQUIRE(cudaPointerGetAttributes(&where, t.data_ptr()) == cudaSuccess);
    INFO(name);
    CHECK(where.type == cudaMemoryTypeHost);
  }
  // With a budget the largest constants stay on the device.
  mapped_runner partly(model_spec::from_directory(dir).set("WEIGHT_OFFLOAD_BUDGET_MB", "1"),
                       gpu);
  CHECK(partly.memory().device_bytes > 0);
  CHECK(torch::equal(partly.run(inputs)[0], want[0]));
}
#endif

TEST_CASE("AOTI CUDA: concurrent run() from 8 threads with AOTI_NUM_RUNNERS=4",
          "[aoti][cuda][concurrency]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cuda");
  const reference ref = read_reference(dir);
  runner<torchloom::pool_stream> r(model_spec::from_directory(dir).set("AOTI_NUM_RUNNERS", "4"),
                                   c10::Device("cuda:0"));
  REQUIRE(matches(r.run(ref.inputs), ref.outputs));
  std::vector<at::Tensor> xs;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(torch::randn({1 + 3 * i, 64}, torch::kCUDA));
    expected.push_back(r.run({xs.back()}).front().cpu());
  }
  torch::cuda::synchronize();  // the threads' streams read xs
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      // Each thread calls from its own stream, as a server's request threads would.
      c10::StreamGuard guard(pool_cuda_stream());
      for (int i = 0; i < 50; ++i) {
        const int k = (t + i) % 8;
        if (!matches(r.run({xs[k]}), {expected[k]})) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
}

// The caller works on a side stream and writes each input after a long kernel: a runner
// that launched on another stream without waiting for the caller's, or that ignored the
// stream the policy chose, would read the input before it is written, or return outputs
// the caller reads before they are written.
template <class Stream>
void check_stream_ordering(const fs::path& dir, model_spec spec) {
  runner<Stream> r(std::move(spec), c10::Device("cuda:0"));
  const reference ref = read_reference(dir);
  REQUIRE(matches(r.run(ref.inputs), ref.outputs));
  std::vector<at::Tensor> xs;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(torch::randn({256, 64}, torch::kCUDA));
    expected.push_back(r.run({xs.back()}).front());
  }
  torch::cuda::synchronize();  // the side stream below reads them
  const c10::Stream side = pool_cuda_stream();
  c10::StreamGuard guard(side);
  const auto slow = torch::rand({2048, 2048}, torch::kCUDA);
  int wrong = 0;
  for (int i = 0; i < 200; ++i) {
    const auto busy = at::matmul(slow, slow);
    const auto x = xs[i % 4] + busy.narrow(0, 0, 256).narrow(1, 0, 64) * 0;
    const auto out = r.run({x}).front();
    // Compared on the caller's (side) stream, with no synchronisation in between.
    if (!at::allclose(out, expected[i % 4], 1e-4, 1e-4)) ++wrong;
  }
  CHECK(current_cuda_stream() == side);
  CHECK(wrong == 0);
}

TEMPLATE_TEST_CASE("AOTI CUDA: every stream policy orders the run after the caller's work",
                   "[aoti][cuda][stream]", torchloom::caller_stream, torchloom::pool_stream,
                   torchloom::adaptive_stream) {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cuda");
  check_stream_ordering<TestType>(dir, model_spec::from_directory(dir));
}

#if TORCHLOOM_HAS_CUDA
TEST_CASE("AOTI CUDA: green_context_stream orders the run after the caller's work",
          "[aoti][cuda][stream]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cuda");
  check_stream_ordering<torchloom::green_context_stream>(
      dir, model_spec::from_directory(dir).set("GREEN_CONTEXT_SM_COUNT", "16"));
}
#endif

#if TORCHLOOM_HAS_CUDA
// torch's threaded model container (AOTI_NUM_RUNNERS=1, the default) takes its one model
// instance back with a host wait on the instance's previous run: back-to-back calls block
// until the GPU has finished the call before, and pool_stream threads never overlap. A
// second call must return while the first one's kernels still run.
TEST_CASE("AOTI CUDA: a call does not wait on the host for the call before it",
          "[aoti][cuda][hazards][async]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "slow_cuda");
  runner<> r(model_spec::from_directory(dir), c10::Device("cuda:0"));
  const auto x = torch::rand({2048, 2048}, torch::kCUDA);
  for (int i = 0; i < 2; ++i) (void)r.run_tensors({x});
  torch::cuda::synchronize();
  const c10::Stream stream = pool_cuda_stream();
  const c10::StreamGuard on(stream);
  const cudaStream_t s = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream).stream();
  cudaEvent_t first_done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&first_done, cudaEventDisableTiming) == cudaSuccess);
  for (const bool tensors : {true, false}) {
    INFO((tensors ? "run_tensors" : "run"));
    if (tensors) {
      (void)r.run_tensors({x});
    } else {
      (void)r.run({x});
    }
    REQUIRE(cudaEventRecord(first_done, s) == cudaSuccess);
    if (tensors) {
      (void)r.run_tensors({x});
    } else {
      (void)r.run({x});
    }
    // The first call's kernels take milliseconds: a host wait for them would have ended them.
    CHECK(cudaEventQuery(first_done) == cudaErrorNotReady);
    torch::cuda::synchronize();
  }
  (void)cudaEventDestroy(first_done);
}
#endif

// ---------------------------------------------------------------------------------------
// Triton's torch_aoti repositories: packages made with plain aoti_compile_and_package (a
// torchvision ResNet, a Hugging Face BERT, the dict-in/dict-out model of Triton's README) and
// config.pbtxt files as Triton's documentation writes them, named by Triton 26.05's rules.

namespace {

struct repository_case {
  const char* fixture;
  std::vector<std::string> inputs;   // forward-based names, in the call spec's order
  std::vector<std::string> outputs;  // forward-based names, in the call spec's order
  std::vector<std::string> config_outputs;  // the config's name for each output, same order
  double tolerance;
};

const std::vector<repository_case>& repository_cases() {
  static const std::vector<repository_case> cases = {
      {"resnet_aoti", {"ARGS[0]"}, {"RESULT"}, {"OUTPUT__0"}, 1e-3},
      {"bert_aoti",
       {"KWARGS[input_ids]", "KWARGS[attention_mask]"},
       {"RESULT[last_hidden_state]", "RESULT[pooler_output]"},
       {"RESULT[last_hidden_state]", "RESULT[pooler_output]"},
       1e-4},
      {"dict_io_aoti",
       {"ARGS[0]", "ARGS[1]", "ARGS[2][keyA]", "ARGS[2][key2]", "KWARGS[kwarg1]",
        "KWARGS[kw_arg2]"},
       {"RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]", "RESULT[CCC][keyA]",
        "RESULT[CCC][key2]", "RESULT[DDD][KA]", "RESULT[DDD][KB]"},
       {"RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]", "RESULT[CCC][keyA]",
        "RESULT[CCC][key2]", "RESULT[DDD][KA]", "RESULT[DDD][KB]"},
       1e-3},
  };
  return cases;
}

bool close_to(const at::Tensor& got, const at::Tensor& want, double tolerance) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return false;
  return torch::allclose(got.cpu().to(torch::kDouble), want.cpu().to(torch::kDouble), tolerance,
                         tolerance);
}

// The references were computed without TF32 (cuDNN's convolutions use it by default).
struct no_tf32 {
  bool before = at::globalContext().allowTF32CuDNN();
  no_tf32() { at::globalContext().setAllowTF32CuDNN(false); }
  ~no_tf32() { at::globalContext().setAllowTF32CuDNN(before); }
};

// Loads the repository `dir` with model_runner<aoti_loader, no_hook, Stream, Residency> on
// the GPU its instance_group names, and checks run() and run_named() (forward-based and
// ordinal names in, the config's names out) against the eager reference.
template <class Stream, class Residency>
void check_repository(const repository_case& c, const fs::path& dir) {
  INFO(c.fixture << " with " << typeid(Stream).name() << ", " << typeid(Residency).name());
  using runner_type = torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook, Stream,
                                              Residency>;
  model_spec spec = model_spec::from_directory(dir);
  REQUIRE(spec.platform.name == "torch_aoti");
  REQUIRE(torchloom::loader_for(spec) == torchloom::loader_kind::aoti);
  if constexpr (std::is_same_v<Stream, torchloom::green_context_stream>) {
    spec.set("GREEN_CONTEXT_SM_COUNT", "16");
  }
  const reference ref = read_reference(dir);
  REQUIRE(ref.inputs.size() == c.inputs.size());
  REQUIRE(ref.outputs.size() == c.outputs.size());
  runner_type r(spec);
  CHECK(r.device() == c10::Device("cuda:0"));  // instance_group KIND_GPU gpus [0]
  CHECK(r.names().inputs == c.inputs);
  CHECK(r.names().outputs == c.outputs);
  const auto check_outputs = [&](const std::vector<at::Tensor>& got) {
    REQUIRE(got.size() == ref.outputs.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("output " << i << " (" << c.outputs[i] << ")");
      CHECK(got[i].device() == c10::Device("cuda:0"));
      CHECK(close_to(got[i], ref.outputs[i], c.tolerance));
    }
  };
  check_outputs(r.run(ref.inputs));  // CPU inputs, moved
  check_outputs(r.run(on(ref.inputs, c10::Device("cuda:0"))));
  std::map<std::string, c10::IValue> forward;
  std::map<std::string, c10::IValue> ordinal;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    forward[c.inputs[i]] = ref.inputs[i];
    ordinal["INPUT__" + std::to_string(i)] = ref.inputs[i];
  }
  for (const auto& named : {r.run_named(forward), r.run_named(ordinal)}) {
    REQUIRE(named.size() == c.config_outputs.size());
    std::vector<at::Tensor> got;
    for (const auto& n : c.config_outputs) {
      INFO(n);
      REQUIRE(named.count(n) == 1);
      got.push_back(named.at(n).toTensor());
    }
    check_outputs(got);
  }
  for (std::size_t i = 0; i < c.outputs.size(); ++i) {
    CHECK(r.output_index(c.outputs[i]) == i);
    CHECK(r.output_index("OUTPUT__" + std::to_string(i)) == i);
  }
  if constexpr (std::is_same_v<Residency, torchloom::shared_weights>) {
    runner_type second(spec);  // the same package's weights, shared
    check_outputs(second.run(ref.inputs));
  }
}

template <class Stream>
void check_repositories() {
  TORCHLOOM_REQUIRE_CUDA();
  const no_tf32 exact;
  for (const auto& c : repository_cases()) {
    const auto found = torchloom_test::aoti_fixture(c.fixture);
    if (!found) {
      TORCHLOOM_CATCH_SKIP(std::string("no AOTI fixture '") + c.fixture + "' in " +
                           torchloom_test::aoti_fixture_root().string() +
                           "; run scripts/make_aoti_fixtures.py DIR and set "
                           "TORCHLOOM_AOTI_FIXTURES");
    }
    const fs::path dir = *found;
    check_repository<Stream, torchloom::resident_weights>(c, dir);
    check_repository<Stream, torchloom::shared_weights>(c, dir);
#if TORCHLOOM_HAS_CUDA
    check_repository<Stream, torchloom::mapped_weights>(c, dir);
#endif
  }
}

}  // namespace

TEST_CASE("torch_aoti CUDA: Triton's repositories through caller_stream", "[aoti][cuda][triton]") {
  check_repositories<torchloom::caller_stream>();
}
TEST_CASE("torch_aoti CUDA: Triton's repositories through pool_stream", "[aoti][cuda][triton]") {
  check_repositories<torchloom::pool_stream>();
}
TEST_CASE("torch_aoti CUDA: Triton's repositories through adaptive_stream",
          "[aoti][cuda][triton]") {
  check_repositories<torchloom::adaptive_stream>();
}
#if TORCHLOOM_HAS_CUDA
TEST_CASE("torch_aoti CUDA: Triton's repositories through green_context_stream",
          "[aoti][cuda][triton]") {
  check_repositories<torchloom::green_context_stream>();
}
#endif

TEST_CASE("torch_aoti CUDA: a dynamic batch dimension serves batches up to max_batch_size",
          "[aoti][cuda][triton][batch]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "resnet_aoti");
  const no_tf32 exact;
  const reference ref = read_reference(dir);  // a batch of 8
  const at::Tensor x = ref.inputs.front().toTensor();
  const at::Tensor want = ref.outputs.front();
  REQUIRE(x.size(0) == 8);
  runner<torchloom::pool_stream> r(model_spec::from_directory(dir));
  REQUIRE(r.inputs().size() == 1);
  CHECK(r.inputs()[0].max_batch_size == 8);  // config.pbtxt's max_batch_size
  CHECK(r.inputs()[0].shape == std::vector<std::int64_t>{-1, 3, 64, 64});
  for (const std::int64_t b : {1, 3, 5, 8}) {
    INFO("batch " << b);
    const auto out = r.run_tensors({x.narrow(0, 0, b)});
    REQUIRE(out.size() == 1);
    CHECK(out[0].size(0) == b);
    CHECK(close_to(out[0], want.narrow(0, 0, b), 1e-3));
    // The batches a dynamic batcher gathers: rows from several requests, one call.
    const auto named = r.run_named({{"INPUT__0", x.narrow(0, 8 - b, b)}});
    CHECK(close_to(named.at("OUTPUT__0").toTensor(), want.narrow(0, 8 - b, b), 1e-3));
  }
  CHECK_TORCHLOOM_ERROR(r.run({torch::cat({x, x.narrow(0, 0, 1)})}), errc::bad_input,
                        "input 0", "has a batch of 9", "max_batch_size is 8");
  CHECK_TORCHLOOM_ERROR(r.run({x.narrow(1, 0, 2)}), errc::bad_input, "shape [-1, 3, 64, 64]");
  // Requests of different batch sizes from several threads at once.
  std::vector<at::Tensor> expected;
  for (std::int64_t b = 1; b <= 8; ++b) expected.push_back(r.run_tensors({x.narrow(0, 0, b)})[0]);
  torch::cuda::synchronize();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      c10::StreamGuard guard(pool_cuda_stream());
      for (int i = 0; i < 20; ++i) {
        const std::int64_t b = 1 + (t * 3 + i) % 8;
        const auto out = r.run_tensors({x.narrow(0, 0, b)})[0];
        if (!close_to(out, expected[static_cast<std::size_t>(b - 1)], 1e-5)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
}

TEST_CASE("torch_aoti CUDA: the package's names, the fixed keyword argument, and the wrong loader",
          "[aoti][cuda][triton]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "bert_aoti");
  const reference ref = read_reference(dir);
  runner<> r(model_spec::from_directory(dir));
  // return_dict=True was fixed at export: a leaf of the call spec, not an input.
  CHECK(r.names().fixed_inputs == std::vector<std::string>{"KWARGS[return_dict]"});
  REQUIRE(r.inputs().size() == 2);
  // torch 2.11 names the package's graph inputs arg<N>_<M>: the config's names, which also
  // say which of the three leaves are inputs, are theirs.
  CHECK(r.inputs()[0].name == "KWARGS[input_ids]");
  CHECK(r.inputs()[0].dtype == c10::ScalarType::Long);  // from config.pbtxt
  CHECK(r.input_index("KWARGS[input_ids]") == 0u);
  CHECK(r.input_index("KWARGS[attention_mask]") == 1u);
  CHECK_TORCHLOOM_ERROR(r.run_named({{"KWARGS[input_ids]", ref.inputs[0]},
                                     {"KWARGS[attention_mask]", ref.inputs[1]},
                                     {"KWARGS[return_dict]", ref.inputs[1]}}),
                        errc::bad_input, "'KWARGS[return_dict]'",
                        "fixed when the model was exported");
  CHECK_TORCHLOOM_ERROR(r.run({ref.inputs[0].toTensor().to(torch::kInt32), ref.inputs[1]}),
                        errc::bad_input, "input 0 ('KWARGS[input_ids]') must be int64");
  // The repository is torch_aoti: a TorchScript runner refuses it, naming both.
  CHECK_TORCHLOOM_ERROR(
      torchloom::model_runner<torchloom::torchscript_loader>(model_spec::from_directory(dir)),
      errc::invalid_option, "platform 'torch_aoti' calls for an AOTInductor package",
      "use model_runner<aoti_loader, ...>");
  // Chosen at run time, as the CLI and the backend choose it.
  const auto spec = model_spec::from_directory(dir);
  torchloom::policy_choice choice;
  choice.loader = torchloom::loader_for(spec);
  choice.stream = torchloom::stream_kind::pool;
  const auto out = torchloom::with_runner_type(choice, [&](auto type) {
    typename decltype(type)::type chosen(spec);
    return chosen.run(ref.inputs);
  });
  REQUIRE(out.size() == 2);
  CHECK(close_to(out[1], ref.outputs[1], 1e-4));
}

#endif  // TORCHLOOM_TORCH_VERSION >= 20600
