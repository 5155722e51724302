// The runner with the AOTInductor loader: outputs against the Python reference, inputs
// checked from what the package declares, concurrent run(), every stream policy, files that
// are not packages (Triton's torch_aoti repositories: test_torch_aoti.cpp). Needs LibTorch
// >= 2.6; with an older one this file compiles to nothing. The packages come from
// scripts/make_aoti_fixtures.py (TORCHLOOM_AOTI_FIXTURES or the build tree's aoti_fixtures/);
// without them the cases that need one are skipped.
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600

#include "../../support/aoti_fixtures.hpp"
#include "../../support/aoti_reference.hpp"
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
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;
using reference = torchloom_test::aoti_reference;
using torchloom_test::current_cuda_stream;
using torchloom_test::on_device;
using torchloom_test::pool_cuda_stream;
using torchloom_test::read_aoti_reference;
using torchloom_test::temp_dir;

namespace {

namespace fs = std::filesystem;

template <class Stream = torchloom::caller_stream>
using runner = torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook, Stream>;

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
  const reference ref = read_aoti_reference(dir);
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
  const reference ref = read_aoti_reference(dir);
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
  const reference ref = read_aoti_reference(dir);
  runner<> r(model_spec::from_directory(dir).set("WARMUP_ITERATIONS", "3"));
  CHECK(matches(r.run(ref.inputs), ref.outputs));
}

TEST_CASE("AOTI: concurrent run() from 8 threads with AOTI_NUM_RUNNERS=4 (CPU)",
          "[aoti][concurrency]") {
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cpu");
  const reference ref = read_aoti_reference(dir);
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
  const reference ref = read_aoti_reference(dir);
  runner<> r(model_spec::from_directory(dir), c10::Device("cuda:0"));
  REQUIRE(r.inputs().size() == 1);
  CHECK(r.inputs()[0].name == "x");
  CHECK(r.inputs()[0].dtype == c10::ScalarType::Float);
  CHECK(r.inputs()[0].shape == std::vector<std::int64_t>{-1, 64});
  const auto out = r.run(on_device(ref.inputs, c10::Device("cuda:0")));
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
  const reference ref = read_aoti_reference(dir);
  REQUIRE(ref.inputs.size() == 2);
  runner<> r(model_spec::from_directory(dir).set("WARMUP_ITERATIONS", "2"), c10::Device("cuda:0"));
  REQUIRE(r.inputs().size() == 2);
  CHECK(r.inputs()[0].name == "x");
  CHECK(r.inputs()[1].name == "ids");
  CHECK(r.inputs()[0].dtype == c10::ScalarType::Float);
  CHECK(r.inputs()[1].dtype == c10::ScalarType::Long);
  const auto inputs = on_device(ref.inputs, c10::Device("cuda:0"));
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
  const reference ref = read_aoti_reference(cpu_dir);
  runner<> cpu(model_spec::from_directory(cpu_dir));
  CHECK_TORCHLOOM_ERROR(cpu.run(on_device(ref.inputs, c10::Device("cuda:0"))), errc::bad_input,
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
  const reference ref = read_aoti_reference(dir);
  const c10::Device gpu("cuda:0");
  using mapped_runner =
      torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook,
                              torchloom::caller_stream, torchloom::mapped_weights>;
  runner<> resident(model_spec::from_directory(dir), gpu);
  mapped_runner mapped(model_spec::from_directory(dir), gpu);
  const auto inputs = on_device(ref.inputs, gpu);
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
  const reference ref = read_aoti_reference(dir);
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
  const reference ref = read_aoti_reference(dir);
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

#endif  // TORCHLOOM_TORCH_VERSION >= 20600
