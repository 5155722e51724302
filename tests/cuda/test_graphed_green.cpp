// graphed<green_context_stream>: a replayed graph's kernels run on the partition's SMs only
// (a kernel reports %smid), as the eager run's do: the graph is captured in the green
// context, whose kernels it keeps.
#include "support/fixtures.hpp"

#include <torchloom/cuda/green_context.hpp>
#include <torchloom/stream/graphed.hpp>
#include <torchloom/stream/green_context.hpp>
#include <torchloom/torchloom.hpp>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

// tests/cuda/smid.cu: block i writes the id of the SM it ran on to out[i].
void launch_smid_kernel(unsigned* out, int blocks, cudaStream_t stream);

namespace {

const c10::Device gpu(c10::kCUDA, 0);

std::set<unsigned> sm_set(const at::Tensor& ids) {
  const at::Tensor cpu = ids.cpu();
  std::set<unsigned> out;
  const auto* p = cpu.data_ptr<int>();
  for (std::int64_t i = 0; i < cpu.numel(); ++i) {
    REQUIRE(p[i] >= 0);  // every block wrote its SM id
    out.insert(static_cast<unsigned>(p[i]));
  }
  return out;
}

}  // namespace

TEST_CASE("graphed<green_context_stream>: replayed kernels run only on the partition's SMs",
          "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  const auto counts = torchloom::cuda::possible_sm_counts(0, torchloom::cuda::sm_split_part::group);
  const auto it = std::lower_bound(counts.begin(), counts.end(), 16);
  REQUIRE(it != counts.end());
  torchloom_test::temp_dir dir;
  auto module = torchloom_test::make_linear();
  torchloom_test::write_triton_model(dir / "linear", module);
  auto spec = torchloom::model_spec::from_directory(dir / "linear");
  spec.set("GREEN_CONTEXT_SM_COUNT", std::to_string(*it));
  torchloom::graphed<torchloom::green_context_stream> policy(torchloom::model_context{
      spec.name, spec.directory, gpu, spec.options, spec.version_directory});
  const int sm_total = torchloom::cuda::sm_resource_of(0).sm_count;
  const int blocks = 4 * sm_total;

  // The "model": the smid kernel writing into its input, which it returns.
  const auto launch = [&](const torchloom::run_context& rc, const at::Tensor& ids) {
    launch_smid_kernel(reinterpret_cast<unsigned*>(ids.data_ptr<int>()), blocks,
                       c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, rc.stream).stream());
    return c10::IValue(ids);
  };
  const at::Tensor mine = torch::full({blocks}, -1, torch::dtype(torch::kInt32).device(gpu));
  std::set<unsigned> replayed;
  for (int i = 0; i < 5; ++i) {
    const c10::IValue out = policy.execute(
        gpu, std::vector<c10::IValue>{torch::full_like(mine, -1)},
        [&](const torchloom::run_context& rc, std::vector<c10::IValue>&& in) {
          return launch(rc, in[0].toTensor());
        });
    if (i >= torchloom::graph_eager_runs_before_capture) {
      const auto ids = sm_set(out.toTensor());
      replayed.insert(ids.begin(), ids.end());
    }
  }
  const auto s = policy.stats();
  CHECK(s.captures == 1);
  CHECK(s.uncapturable == 0);
  CHECK(s.replays == 5 - torchloom::graph_eager_runs_before_capture);
  INFO("partition of " << *it << " SMs; replays used " << replayed.size() << " of " << sm_total);
  CHECK(!replayed.empty());
  CHECK(static_cast<int>(replayed.size()) <= *it);

  // The same graph launched through a plain graphed<caller_stream> spreads wider, so the
  // check above can fail.
  torchloom::graphed<torchloom::caller_stream> plain(torchloom::model_context{
      spec.name, spec.directory, gpu, spec.options, spec.version_directory});
  std::set<unsigned> wide;
  for (int i = 0; i < 4; ++i) {
    const c10::IValue out = plain.execute(
        gpu, std::vector<c10::IValue>{torch::full_like(mine, -1)},
        [&](const torchloom::run_context& rc, std::vector<c10::IValue>&& in) {
          return launch(rc, in[0].toTensor());
        });
    const auto ids = sm_set(out.toTensor());
    wide.insert(ids.begin(), ids.end());
  }
  CHECK(static_cast<int>(wide.size()) > *it);
}

// Every runner of one green-context configuration shares the context's stream: a capture on
// that stream would take in the kernels other threads launch there meanwhile (their callers
// would get garbage, and later replays would write into their freed memory), and another
// thread's wait on it would end the capture. Threads alternating two input shapes through
// one runner, with at most one graph kept (so captures keep happening while others run),
// must each get the eager run's outputs, and no capture may fail.
TEST_CASE("graphed<green_context_stream>: runs of other threads during a capture are not "
          "captured",
          "[stream][graphs][cuda][hazards]") {
  TORCHLOOM_REQUIRE_CUDA();
  const auto counts = torchloom::cuda::possible_sm_counts(0, torchloom::cuda::sm_split_part::group);
  const auto it = std::lower_bound(counts.begin(), counts.end(), 16);
  REQUIRE(it != counts.end());
  torchloom_test::temp_dir dir;
  auto module = torchloom_test::make_linear(256, 256);
  torchloom_test::write_triton_model(dir / "linear", module);
  using plain_t = torchloom::model_runner<torchloom::torchscript_loader>;
  using green_t =
      torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook,
                              torchloom::graphed<torchloom::green_context_stream>>;
  plain_t plain(torchloom::model_spec::from_directory(dir / "linear"), gpu);
  constexpr int threads = 4;
  constexpr int runs = 40;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> expected;
  for (int t = 0; t < threads; ++t) {
    for (const std::int64_t batch : {8, 24}) {
      torch::manual_seed(100 + t * 2 + static_cast<int>(batch));
      inputs.push_back(torch::randn({batch, 256}, torch::kCUDA));
      expected.push_back(plain.run({inputs.back()})[0]);
    }
  }
  torch::cuda::synchronize();
  int wrong = 0;
  std::int64_t captures = 0;
  std::int64_t uncapturable = 0;
  for (int round = 0; round < 6; ++round) {
    auto spec = torchloom::model_spec::from_directory(dir / "linear");
    spec.set("GREEN_CONTEXT_SM_COUNT", std::to_string(*it));
    spec.set("CUDA_GRAPH_MAX_SHAPES", "1");
    green_t g(spec, gpu);
    std::atomic<int> round_wrong{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        // Each caller on a stream of its own, as a server's threads are.
        c10::StreamGuard guard(c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStreamFromGlobalPool(gpu));
        for (int i = 0; i < runs; ++i) {
          // Three runs of one shape, then the other: each shape is captured again and again.
          const std::size_t k = static_cast<std::size_t>(t * 2 + (i / 3 + t) % 2);
          const auto out = g.run({inputs[k]})[0];
          // Close, not bitwise: the partition's kernels may split the work differently.
          if (!torch::allclose(out, expected[k], 1e-4, 1e-4)) ++round_wrong;
        }
      });
    }
    for (auto& th : pool) th.join();
    wrong += round_wrong.load();
    const auto s = g.stream().stats();
    captures += s.captures;
    uncapturable += s.uncapturable;
  }
  INFO(captures << " captures, " << uncapturable << " failed");
  CHECK(wrong == 0);
  CHECK(uncapturable == 0);
  CHECK(captures > 0);
}
