// streamed_weights with the AOTInductor loader, on packages exported for streaming
// (scripts/torchloom_export.py; the fixtures stream_mlp_cuda and stream_fused_cuda): outputs
// bitwise equal to the same package with its weights resident, device memory after load, the
// budget, a kernel that reads three weights at once, and packages that cannot stream. Needs
// LibTorch >= 2.6, a GPU and the fixtures; otherwise the cases skip.
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600 && TORCHLOOM_HAS_CUDA

#include "../../support/aoti_fixtures.hpp"
#include "../../support/fixtures.hpp"

#include <torchloom/torchloom.hpp>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;

namespace {

template <class Residency>
using aoti_runner = torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook,
                                            torchloom::caller_stream, Residency>;

constexpr std::int64_t mib = std::int64_t{1} << 20;

// Device memory in use, as the driver sees it, with the caching allocator's free blocks
// given back first.
std::int64_t device_used() {
  (void)cudaDeviceSynchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  std::size_t free = 0;
  std::size_t total = 0;
  (void)cudaMemGetInfo(&free, &total);
  return static_cast<std::int64_t>(total - free);
}

// What torch's caching allocator has handed out on cuda:0: now, and at most since its peak
// was reset.
struct allocated {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};
allocated torch_allocated() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return {stats.allocated_bytes[0].current, stats.allocated_bytes[0].peak};  // [0]: all pools
}

model_spec with_budget(const std::filesystem::path& dir, int mb) {
  return model_spec::from_directory(dir).set("WEIGHT_OFFLOAD_BUDGET_MB", std::to_string(mb));
}

}  // namespace

TEST_CASE("AOTI streamed: weights 4x the budget, bitwise equal to the package run resident "
          "over 100 runs; the device holds the arena",
          "[aoti][cuda][streamed][device_memory]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "stream_mlp_cuda");
  const c10::Device gpu(c10::kCUDA, 0);
  // 8 layers of 2048 x 2048 fp32: 128 MiB of weights (and 64 KiB of biases).
  constexpr std::int64_t weights = 8 * (2048 * 2048 + 2048) * 4;
  aoti_runner<torchloom::resident_weights> resident(model_spec::from_directory(dir), gpu);
  // The package installs weights.pt on the device: memory() counts them.
  CHECK(resident.memory().device_bytes == weights);

  // The process's one-time CUDA costs come first (cuBLAS's workspace for this stream, the
  // kernels the first run at load uses, loaded on first use): a first streamed runner, gone
  // before the one measured.
  (void)resident.run({torch::randn({4, 2048}, gpu)});
  {
    aoti_runner<torchloom::streamed_weights> first(with_budget(dir, 32), gpu);
    (void)first.run({torch::randn({4, 2048}, gpu)});
  }
  const std::int64_t before = device_used();
  const auto torch_before = torch_allocated();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  aoti_runner<torchloom::streamed_weights> streamed(with_budget(dir, 32), gpu);
  const std::int64_t held = device_used() - before;
  const auto torch_after = torch_allocated();
  const auto loaded = streamed.memory();
  INFO("device bytes after load " << held << " (torch's allocator: +"
                                  << torch_after.current - torch_before.current << ", peak +"
                                  << torch_after.peak - torch_before.current << "), arena "
                                  << loaded.device_bytes);
  CHECK(loaded.device_bytes <= 32 * mib);
  // The arena, plus a stated slack for the package's own kernels and buffers: 8 MiB.
  CHECK(held <= loaded.device_bytes + 8 * mib);
  CHECK(held < weights / 2);

  int equal = 0;
  for (int run = 0; run < 100; ++run) {
    // Large batches now and then: each product then outlasts the next weight's copy, so a
    // copy that did not wait for the kernels reading its bytes would overwrite them.
    const std::int64_t rows = run % 4 == 0 ? 2048 : 1 + run % 7;
    const auto x = torch::randn({rows, 2048}, gpu) * (run % 2 == 0 ? 1.0 : -0.5);
    const auto want = resident.run({x})[0];
    const auto got = streamed.run({x})[0];
    equal += torch::equal(got, want) ? 1 : 0;
  }
  CHECK(equal == 100);
  const auto mem = streamed.memory();
  CHECK(mem.budget_bytes == 32 * mib);
  CHECK(mem.high_water_bytes > 0);
  CHECK(mem.high_water_bytes <= mem.budget_bytes);
  CHECK(mem.budget_violations == 0);
  CHECK(mem.host_bytes >= weights);
  // At least what does not fit the budget is copied every run.
  CHECK(mem.copied_bytes >= 100 * (weights - 32 * mib));
}

TEST_CASE("AOTI streamed: a model larger than the device's free memory loads and runs",
          "[aoti][cuda][streamed][device_memory]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "stream_mlp_cuda");
  const c10::Device gpu(c10::kCUDA, 0);
  constexpr std::int64_t weights = 8 * (2048 * 2048 + 2048) * 4;
  const auto x = torch::randn({3, 2048}, gpu);
  at::Tensor want;
  {
    aoti_runner<torchloom::resident_weights> resident(model_spec::from_directory(dir), gpu);
    want = resident.run({x})[0];
    // The one-time costs (see above) are paid before the device is taken.
    aoti_runner<torchloom::streamed_weights> first(with_budget(dir, 32), gpu);
    (void)first.run({x});
  }
  // Take all but 96 MiB of the device, outside torch's allocator: the 128 MiB of weights do
  // not fit beside the rest; the 32 MiB arena, the first run's temporary copies and the
  // activations do.
  (void)device_used();
  std::size_t free = 0;
  std::size_t total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  void* hog = nullptr;
  const std::size_t left = 96 * mib;
  REQUIRE(free > left);
  REQUIRE(cudaMalloc(&hog, free - left) == cudaSuccess);
  struct release {
    void* p;
    ~release() { (void)cudaFree(p); }
  } releasing{hog};
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  CHECK(static_cast<std::int64_t>(free) < weights);
  aoti_runner<torchloom::streamed_weights> streamed(with_budget(dir, 32), gpu);
  for (int run = 0; run < 5; ++run) REQUIRE(torch::equal(streamed.run({x})[0], want));
  CHECK(streamed.memory().budget_violations == 0);
}

TEST_CASE("AOTI: a package's weights go with its runner, whatever the residency",
          "[aoti][cuda][streamed]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "stream_mlp_cuda");
  const c10::Device gpu(c10::kCUDA, 0);
  const auto x = torch::randn({3, 2048}, gpu);
  // One run first: cuBLAS keeps its workspace for this stream in torch's allocator.
  {
    aoti_runner<torchloom::resident_weights> warm(model_spec::from_directory(dir), gpu);
    (void)warm.run({x});
  }
  (void)cudaDeviceSynchronize();
  const std::int64_t baseline = torch_allocated().current;
  const auto after = [&] {
    (void)cudaDeviceSynchronize();
    return torch_allocated().current - baseline;
  };
  for (int i = 0; i < 3; ++i) {
    {
      aoti_runner<torchloom::resident_weights> r(model_spec::from_directory(dir), gpu);
      (void)r.run({x});
    }
    INFO("resident, load " << i);
    CHECK(after() < mib);
    {
      aoti_runner<torchloom::streamed_weights> r(with_budget(dir, 32), gpu);
      (void)r.run({x});
    }
    INFO("streamed, load " << i);
    CHECK(after() < mib);
    {
      aoti_runner<torchloom::mapped_weights> r(model_spec::from_directory(dir), gpu);
      (void)r.run({x});
    }
    INFO("mapped, load " << i);
    CHECK(after() < mib);
  }
}

TEST_CASE("AOTI streamed: a budget below the schedule's minimum fails at load, naming it",
          "[aoti][cuda][streamed]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "stream_mlp_cuda");
  const c10::Device gpu(c10::kCUDA, 0);
  // One 16 MiB weight must be on the device while its product runs.
  CHECK_TORCHLOOM_ERROR(aoti_runner<torchloom::streamed_weights>(with_budget(dir, 8), gpu),
                        errc::budget_too_small, "WEIGHT_OFFLOAD_BUDGET_MB=8", "at least");
  CHECK_TORCHLOOM_ERROR(
      aoti_runner<torchloom::streamed_weights>(model_spec::from_directory(dir), gpu),
      errc::invalid_option, "needs WEIGHT_OFFLOAD_BUDGET_MB");
}

TEST_CASE("AOTI streamed: a kernel that reads three weights at once, at the smallest budget "
          "(2 MiB)",
          "[aoti][cuda][streamed]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "stream_fused_cuda");
  const c10::Device gpu(c10::kCUDA, 0);
  aoti_runner<torchloom::resident_weights> resident(model_spec::from_directory(dir), gpu);
  CHECK_TORCHLOOM_ERROR(aoti_runner<torchloom::streamed_weights>(with_budget(dir, 1), gpu),
                        errc::budget_too_small, "at least 2 MiB");
  aoti_runner<torchloom::streamed_weights> streamed(with_budget(dir, 2), gpu);
  aoti_runner<torchloom::mapped_weights> mapped(model_spec::from_directory(dir), gpu);
  for (int run = 0; run < 20; ++run) {
    const auto x = torch::randn({1 + run, 512}, gpu);
    const auto want = resident.run({x})[0];
    REQUIRE(torch::equal(streamed.run({x})[0], want));
    REQUIRE(torch::equal(mapped.run({x})[0], want));
  }
  const auto mem = streamed.memory();
  CHECK(mem.budget_violations == 0);
  CHECK(mem.high_water_bytes <= mem.budget_bytes);
  CHECK(mapped.memory().device_bytes == 0);
}

TEST_CASE("AOTI streamed: a package not exported for streaming is unsupported, naming the "
          "export helper; mapped_weights still maps it",
          "[aoti][cuda][streamed]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cuda");
  const c10::Device gpu(c10::kCUDA, 0);
  CHECK_TORCHLOOM_ERROR(aoti_runner<torchloom::streamed_weights>(with_budget(dir, 4), gpu),
                        errc::unsupported, "was not exported for streaming",
                        "torchloom_export.py");
  aoti_runner<torchloom::mapped_weights> mapped(model_spec::from_directory(dir), gpu);
  CHECK(mapped.run({torch::randn({2, 64}, gpu)})[0].sizes() == c10::IntArrayRef{2, 16});
}

TEST_CASE("AOTI streamed: a weights file that does not match the package is load_failed "
          "naming the weight",
          "[aoti][cuda][streamed]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "stream_fused_cuda");
  const c10::Device gpu(c10::kCUDA, 0);
  torchloom_test::temp_dir tmp;
  const auto copy = tmp.path() / "stream_fused_cuda";
  std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
  // The other fixture's weights: other names, sizes and count.
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(other, "stream_mlp_cuda");
  std::filesystem::copy_file(other / "1" / "weights.pt", copy / "1" / "weights.pt",
                             std::filesystem::copy_options::overwrite_existing);
  CHECK_TORCHLOOM_ERROR(aoti_runner<torchloom::resident_weights>(model_spec::from_directory(copy),
                                                                 gpu),
                        errc::load_failed, "weights.pt");
  std::filesystem::remove(copy / "1" / "weights.pt");
  CHECK_TORCHLOOM_ERROR(aoti_runner<torchloom::streamed_weights>(with_budget(copy, 4), gpu),
                        errc::load_failed, "cannot read the package's weights");
}

#endif
