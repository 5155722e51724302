// streamed_weights with the AOTInductor loader, on packages exported for streaming
// (scripts/torchloom_export.py; the fixtures stream_mlp_cuda and stream_fused_cuda): outputs
// bitwise equal to the same package with its weights resident, device memory after load, the
// budget, a kernel that reads three weights at once, and packages that cannot stream. Then
// the architectures people offload (scripts/make_transformer_fixtures.py: GPT-2, BERT, a
// Llama decoder, T5 and a torchvision MobileNet, random-init): resident against eager
// PyTorch, streamed at the smallest budget the error names, the resident share, six threads
// on pool streams and mapped_weights, all bitwise equal to resident. Needs LibTorch >= 2.6, a
// GPU and the fixtures; otherwise the cases skip.
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600 && TORCHLOOM_HAS_CUDA

#include "../../support/aoti_fixtures.hpp"
#include "../../support/fixtures.hpp"

#include <torchloom/torchloom.hpp>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;

namespace {

template <class Residency, class Stream = torchloom::caller_stream>
using aoti_runner =
    torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook, Stream, Residency>;

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


// ---------------------------------------------------------------------------------------
// The architectures people offload (scripts/make_transformer_fixtures.py).

namespace {

// What the fixture script saved next to each package: its inputs (in0, ... in the package's
// order) and the eager model's outputs on them (out0, ...).
struct eager_reference {
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;
};

eager_reference read_eager_reference(const std::filesystem::path& dir, c10::Device device) {
  const auto holder = torch::jit::load((dir / "reference.pt").string());
  eager_reference ref;
  for (const auto& b : holder.named_buffers()) {
    if (b.name.rfind("in", 0) == 0) ref.inputs.push_back(b.value.to(device));
    if (b.name.rfind("out", 0) == 0) ref.outputs.push_back(b.value);
  }
  return ref;
}

// Other valid inputs of the same shapes: token ids reversed (still in the vocabulary), masks
// as they are, floating inputs scaled.
std::vector<at::Tensor> other_inputs(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> out;
  for (const auto& t : inputs) {
    if (t.is_floating_point()) {
      out.push_back(t * -0.5);
    } else if (t.max().item<std::int64_t>() > 1) {
      out.push_back(t.flip(-1).contiguous());
    } else {
      out.push_back(t);
    }
  }
  return out;
}

bool all_equal(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!torch::equal(got[i], want[i])) return false;
  }
  return true;
}

// The smallest WEIGHT_OFFLOAD_BUDGET_MB streamed_weights accepts for the package, from the
// error a runner without a budget raises ("set it to at least N MiB").
std::int64_t named_minimum_mb(const std::filesystem::path& dir, c10::Device gpu) {
  const auto e = torchloom_test::capture_error(
      [&] { aoti_runner<torchloom::streamed_weights>(model_spec::from_directory(dir), gpu); });
  INFO(e.what());
  REQUIRE(e.code() == errc::invalid_option);
  const std::string message = e.what();
  const auto at = message.find("at least ");
  REQUIRE(at != std::string::npos);
  return std::stoll(message.substr(at + 9));
}

// Every check of one architecture: `tolerance` bounds the relative difference between the
// package run resident and the eager model (inductor's kernels are not eager PyTorch's).
void check_architecture(const std::filesystem::path& dir, double tolerance) {
  const c10::Device gpu(c10::kCUDA, 0);
  const eager_reference ref = read_eager_reference(dir, gpu);
  REQUIRE_FALSE(ref.inputs.empty());
  const std::vector<std::vector<at::Tensor>> inputs{ref.inputs, other_inputs(ref.inputs)};

  aoti_runner<torchloom::resident_weights> resident(model_spec::from_directory(dir), gpu);
  std::vector<std::vector<at::Tensor>> want;
  for (const auto& in : inputs) want.push_back(resident.run_tensors(in));
  // Resident against eager PyTorch: the weights reached the package under the right names.
  REQUIRE(want[0].size() == ref.outputs.size());
  for (std::size_t i = 0; i < ref.outputs.size(); ++i) {
    const auto got = want[0][i].cpu().to(at::kFloat);
    const auto eager = ref.outputs[i].to(at::kFloat);
    REQUIRE(got.sizes() == eager.sizes());
    const double diff = (got - eager).norm().item<double>();
    const double scale = eager.norm().item<double>();
    INFO("output " << i << ": |package - eager| / |eager| = " << diff / scale);
    CHECK(diff <= tolerance * scale);
  }
  const std::int64_t weights = resident.memory().device_bytes;
  REQUIRE(weights > 0);

  SECTION("streamed at the smallest budget the error names: bitwise equal to resident") {
    const std::int64_t minimum = named_minimum_mb(dir, gpu);
    if (minimum > 1) {
      CHECK_TORCHLOOM_ERROR(aoti_runner<torchloom::streamed_weights>(
                                with_budget(dir, static_cast<int>(minimum - 1)), gpu),
                            errc::budget_too_small, "at least");
    }
    aoti_runner<torchloom::streamed_weights> streamed(with_budget(dir, static_cast<int>(minimum)),
                                                      gpu);
    for (int run = 0; run < 6; ++run) {
      const std::size_t k = static_cast<std::size_t>(run % 2);
      INFO("run " << run);
      CHECK(all_equal(streamed.run_tensors(inputs[k]), want[k]));
    }
    const auto mem = streamed.memory();
    INFO("weights " << weights << " bytes, budget " << minimum << " MiB");
    CHECK(mem.budget_violations == 0);
    CHECK(mem.high_water_bytes <= mem.budget_bytes);
    CHECK(mem.streamed_bytes > 0);  // the smallest budget holds less than the weights
    CHECK(mem.copied_bytes > 0);
  }

  SECTION("a budget that holds every weight copies nothing per run") {
    const int all = static_cast<int>((weights + mib - 1) / mib) + 1;
    aoti_runner<torchloom::streamed_weights> streamed(with_budget(dir, all), gpu);
    for (int run = 0; run < 4; ++run) {
      const std::size_t k = static_cast<std::size_t>(run % 2);
      CHECK(all_equal(streamed.run_tensors(inputs[k]), want[k]));
    }
    const auto mem = streamed.memory();
    CHECK(mem.streamed_bytes == 0);
    CHECK(mem.copied_bytes == 0);
    CHECK(mem.resident_bytes >= weights);
    CHECK(mem.budget_violations == 0);
  }

  SECTION("six threads on pool streams, streamed at the smallest budget") {
    const std::int64_t minimum = named_minimum_mb(dir, gpu);
    aoti_runner<torchloom::streamed_weights, torchloom::pool_stream> streamed(
        with_budget(dir, static_cast<int>(minimum)), gpu);
    constexpr int threads = 6;
    constexpr int runs = 5;
    std::vector<int> equal(threads, 0);
    std::vector<std::string> failures(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          for (int run = 0; run < runs; ++run) {
            const std::size_t k = static_cast<std::size_t>((t + run) % 2);
            const auto got = streamed.run_tensors(inputs[k]);
            // The outputs are safe on this thread's current stream: compare there.
            equal[static_cast<std::size_t>(t)] += all_equal(got, want[k]) ? 1 : 0;
          }
        } catch (const std::exception& e) {
          failures[static_cast<std::size_t>(t)] = e.what();
        }
      });
    }
    for (auto& th : pool) th.join();
    for (int t = 0; t < threads; ++t) {
      INFO("thread " << t << ": " << failures[static_cast<std::size_t>(t)]);
      CHECK(failures[static_cast<std::size_t>(t)].empty());
      CHECK(equal[static_cast<std::size_t>(t)] == runs);
    }
    CHECK(streamed.memory().budget_violations == 0);
  }

  SECTION("mapped_weights loads the same package without putting its weights on the device") {
    (void)cudaDeviceSynchronize();
    const auto before = torch_allocated();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    aoti_runner<torchloom::mapped_weights> mapped(model_spec::from_directory(dir), gpu);
    (void)cudaDeviceSynchronize();
    const auto after = torch_allocated();
    INFO("weights " << weights << " bytes; torch's allocator during the load: peak +"
                    << after.peak - before.current << ", now +"
                    << after.current - before.current);
    CHECK(after.peak - before.current < weights / 4);
    CHECK(mapped.memory().device_bytes == 0);
    for (int run = 0; run < 4; ++run) {
      const std::size_t k = static_cast<std::size_t>(run % 2);
      CHECK(all_equal(mapped.run_tensors(inputs[k]), want[k]));
    }
  }
}

}  // namespace

TEST_CASE("AOTI streamed: GPT-2 (tied embedding and output projection, fp32)",
          "[aoti][cuda][streamed][mapped][transformers]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "hf_gpt2");
  check_architecture(dir, 1e-3);
}

TEST_CASE("AOTI streamed: BERT (int64 non-persistent buffers, tensor constants made in "
          "forward, two outputs)",
          "[aoti][cuda][streamed][mapped][transformers]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "hf_bert");
  check_architecture(dir, 1e-3);
}

TEST_CASE("AOTI streamed: a Llama decoder (bf16, rotary buffer, grouped-query attention)",
          "[aoti][cuda][streamed][mapped][transformers]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "hf_llama");
  check_architecture(dir, 5e-2);
}

TEST_CASE("AOTI streamed: T5 (one embedding shared by encoder, decoder and output projection)",
          "[aoti][cuda][streamed][mapped][transformers]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "hf_t5");
  check_architecture(dir, 1e-3);
}

TEST_CASE("AOTI streamed: torchvision MobileNetV3 (fp16, batch-norm buffers, biases inductor "
          "writes as code)",
          "[aoti][cuda][streamed][mapped][transformers]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "tv_mobilenet");
  // fp16 through a dozen blocks: inductor rounds fused pointwise chains once, eager per op.
  check_architecture(dir, 1e-1);
}

#endif
