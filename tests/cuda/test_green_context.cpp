// green_context_stream: kernels launched through the policy run only on the partition's SMs
// (a kernel reports %smid), the complement takes the other SMs, impossible SM counts are
// refused with what is possible, a runner gives the CPU runner's outputs, and green contexts
// are destroyed with their runner.
#include "support/fixtures.hpp"

#include <torchloom/cuda/green_context.hpp>
#include <torchloom/stream/green_context.hpp>
#include <torchloom/torchloom.hpp>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

// tests/cuda/smid.cu: block i writes the id of the SM it ran on to out[i].
void launch_smid_kernel(unsigned* out, int blocks, cudaStream_t stream);

using torchloom::errc;
using torchloom::green_context_complement_stream;
using torchloom::green_context_stream;
using torchloom::model_spec;
using torchloom::cuda::sm_split_part;
using torchloom_test::temp_dir;

namespace {

const c10::Device gpu(c10::kCUDA, 0);

template <class Stream>
using runner = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, Stream>;

// A Triton-layout model directory; spec() sets GREEN_CONTEXT_SM_COUNT when given.
struct model_dir {
  temp_dir dir;
  torch::jit::Module module;

  explicit model_dir(torch::jit::Module m) : module(std::move(m)) {
    torchloom_test::write_triton_model(dir / "linear", module);
  }
  model_spec spec(std::optional<int> sm_count) const {
    auto s = model_spec::from_directory(dir / "linear");
    if (sm_count) s.set("GREEN_CONTEXT_SM_COUNT", std::to_string(*sm_count));
    return s;
  }
};

// x * 2 + 1: no cuBLAS, whose per-stream workspaces torch keeps for the life of the process
// and would hide (or fake) a leak of our own.
torch::jit::Module make_affine() {
  torch::jit::Module m("affine");
  m.define(R"(
def forward(self, x):
    return x * 2 + 1
)");
  return m;
}

// The policy as a runner makes it, from the spec's options.
template <class Policy>
std::unique_ptr<Policy> make_policy(const model_spec& s) {
  return std::make_unique<Policy>(torchloom::model_context{s.name, s.directory, gpu, s.options,
                                                                  s.version_directory});
}

// The smallest SM count >= `at_least` that the device splits off exactly for `part`.
int smallest_possible(int at_least, sm_split_part part) {
  const auto counts = torchloom::cuda::possible_sm_counts(0, part);
  const auto it = std::lower_bound(counts.begin(), counts.end(), at_least);
  REQUIRE(it != counts.end());
  return *it;
}

int device_sm_count() { return torchloom::cuda::sm_resource_of(0).sm_count; }

std::set<unsigned> to_set(const at::Tensor& ids_on_cpu) {
  std::set<unsigned> out;
  const auto* p = ids_on_cpu.data_ptr<int>();
  for (std::int64_t i = 0; i < ids_on_cpu.numel(); ++i) {
    REQUIRE(p[i] >= 0);  // every block wrote its SM id
    out.insert(static_cast<unsigned>(p[i]));
  }
  return out;
}

at::Tensor smid_buffer(int blocks) {
  return torch::full({blocks}, -1, torch::dtype(torch::kInt32).device(gpu));
}

// The SMs that `blocks` spinning blocks ran on, launched in the policy's execute() body on the
// stream it chose, and read back on the caller's stream right after execute() returns.
template <class Policy>
std::set<unsigned> sms_used_through(Policy& policy, int blocks) {
  const at::Tensor out = smid_buffer(blocks);
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(0);
  policy.execute(gpu, std::vector<c10::IValue>{out}, [&](const torchloom::run_context& rc,
                                                         std::vector<c10::IValue>&&) {
    CHECK(rc.stream != caller.unwrap());
    CHECK(rc.stream == c10::cuda::getCurrentCUDAStream(0).unwrap());  // current during the body
    launch_smid_kernel(reinterpret_cast<unsigned*>(out.data_ptr<int>()), blocks,
                       c10::cuda::CUDAStream(rc.stream).stream());
    return c10::IValue();
  });
  CHECK(c10::cuda::getCurrentCUDAStream(0) == caller);  // restored
  return to_set(out.cpu());
}

// The same launch on an ordinary stream: every SM of the device may take blocks.
std::set<unsigned> sms_used_on_plain_stream(int blocks) {
  const at::Tensor out = smid_buffer(blocks);
  launch_smid_kernel(reinterpret_cast<unsigned*>(out.data_ptr<int>()), blocks,
                     c10::cuda::getCurrentCUDAStream(0).stream());
  return to_set(out.cpu());
}

std::size_t free_device_memory() {
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  std::size_t free = 0;
  std::size_t total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return free;
}

}  // namespace

TEST_CASE("green_context_stream: kernels run only on the partition's SMs", "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  const int asked = smallest_possible(16, sm_split_part::group);
  model_dir m(torchloom_test::make_linear());
  const auto policy = make_policy<green_context_stream>(m.spec(asked));
  CHECK(policy->sm_count() == asked);
  REQUIRE(policy->context() != nullptr);

  const int blocks = 4 * device_sm_count();
  const auto green = sms_used_through(*policy, blocks);
  const auto plain = sms_used_on_plain_stream(blocks);
  INFO("asked " << asked << " SMs; the green launch used " << green.size() << ", the plain one "
                << plain.size() << " of " << device_sm_count());
  CHECK(!green.empty());
  CHECK(static_cast<int>(green.size()) <= policy->sm_count());
  // The same launch outside the partition spreads wider: the check above can fail.
  CHECK(static_cast<int>(plain.size()) > policy->sm_count());
}

TEST_CASE("green_context_complement_stream takes the SMs the first partition leaves",
          "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  const int asked = smallest_possible(16, sm_split_part::remaining);
  model_dir m(torchloom_test::make_linear());
  const auto first = make_policy<green_context_stream>(m.spec(asked));
  const auto rest = make_policy<green_context_complement_stream>(m.spec(asked));
  const int sms = device_sm_count();
  CHECK(first->sm_count() == asked);
  CHECK(rest->sm_count() > 0);
  CHECK(first->sm_count() + rest->sm_count() <= sms);

  const auto a = sms_used_through(*first, 4 * sms);
  const auto b = sms_used_through(*rest, 4 * sms);
  std::vector<unsigned> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  std::set<unsigned> all = a;
  all.insert(b.begin(), b.end());
  INFO("first: " << a.size() << " SMs of " << first->sm_count() << "; complement: " << b.size()
                 << " SMs of " << rest->sm_count() << "; shared: " << both.size());
  CHECK(!a.empty());
  CHECK(!b.empty());
  CHECK(both.empty());
  CHECK(static_cast<int>(a.size()) <= first->sm_count());
  CHECK(static_cast<int>(b.size()) <= rest->sm_count());
  CHECK(static_cast<int>(all.size()) <= sms);
}

TEST_CASE("green_context_stream refuses SM counts the device cannot split, saying what works",
          "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  const auto info = torchloom::cuda::sm_resource_of(0);
  const auto possible = torchloom::cuda::possible_sm_counts(0, sm_split_part::group);
  REQUIRE(!possible.empty());
  const std::string lowest = std::to_string(possible.front());
  const std::string highest = std::to_string(possible.back());
  model_dir m(torchloom_test::make_linear());
  using first = runner<green_context_stream>;
  using complement = runner<green_context_complement_stream>;
  INFO("device: " << info.sm_count << " SMs, min partition " << info.min_partition << ", alignment "
                  << info.alignment);

  const auto refused = [&](int count) {
    INFO("GREEN_CONTEXT_SM_COUNT=" << count);
    CHECK(std::find(possible.begin(), possible.end(), count) == possible.end());
    CHECK_TORCHLOOM_ERROR(first(m.spec(count), gpu), errc::invalid_option, "model 'linear'",
                          "GREEN_CONTEXT_SM_COUNT=" + std::to_string(count) + " is not possible",
                          "on cuda:0 (", std::to_string(info.sm_count) + " SMs)", "use ", lowest,
                          highest);
  };
  if (info.min_partition > 1) refused(1);  // below the smallest partition
  if (info.alignment > 1) refused(possible.front() + info.alignment / 2);  // e.g. 12 for 8
  refused(std::min(info.sm_count + 1, 1024));  // more SMs than the device has

  // The complement must keep SMs of its own.
  CHECK_TORCHLOOM_ERROR(complement(m.spec(info.sm_count), gpu), errc::invalid_option,
                        "model 'linear'", "is not possible", "left over");

  CHECK_TORCHLOOM_ERROR(first(m.spec(std::nullopt), gpu), errc::invalid_option, "model 'linear'",
                        "GREEN_CONTEXT_SM_COUNT is not set", "green_context_stream");
  CHECK_TORCHLOOM_ERROR(complement(m.spec(std::nullopt), gpu), errc::invalid_option,
                        "GREEN_CONTEXT_SM_COUNT is not set", "green_context_complement_stream");
  // On CPU the policy is a no-op and needs no option.
  runner<green_context_stream> cpu(m.spec(std::nullopt));
  CHECK(cpu.run({torch::randn({2, 8})}).size() == 1);
}

TEST_CASE(
    "green_context_stream: a runner's outputs match the CPU runner's, read on the "
    "caller's stream right after run()",
    "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  const int asked = smallest_possible(16, sm_split_part::group);
  model_dir m(torchloom_test::make_linear());
  runner<green_context_stream> green(m.spec(asked), gpu);
  runner<torchloom::caller_stream> cpu(m.spec(std::nullopt));

  // The caller works on a side stream with a long kernel queued before each input is
  // written: a green stream that did not wait for the caller would read the input early, and
  // a caller that did not wait for the green stream would read the output early.
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  const c10::cuda::CUDAStreamGuard guard(side);
  const auto slow = torch::rand({2048, 2048}, torch::dtype(torch::kFloat32).device(gpu));
  int wrong = 0;
  for (int i = 0; i < 1000; ++i) {
    const auto x_cpu = torch::randn({16, 8});
    const auto busy = at::matmul(slow, slow);
    const auto x = x_cpu.to(gpu) + busy.narrow(0, 0, 16).narrow(1, 0, 8) * 0;
    const auto out = green.run({x});
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].device() == gpu);
    const auto got = out[0].cpu();  // on the side stream: the caller's
    const auto expected = cpu.run({x_cpu})[0];
    if (!torch::allclose(got, expected, 1e-4, 1e-4)) ++wrong;
  }
  CHECK(wrong == 0);
}

TEST_CASE("green_context_stream: 50 runners made and destroyed share one context per "
          "configuration and leak no device memory",
          "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  using torchloom::cuda::green_context;
  const int asked = smallest_possible(16, sm_split_part::remaining);
  model_dir m(make_affine());
  const auto x = torch::arange(1024, torch::dtype(torch::kFloat32).device(gpu));
  const auto expected = (x * 2 + 1).cpu();
  {
    // The first runner of each configuration creates its green context (and the first use
    // loads modules and fills allocator pools): not a leak.
    runner<green_context_stream> first(m.spec(asked), gpu);
    runner<green_context_complement_stream> rest(m.spec(asked), gpu);
    CHECK(torch::equal(first.run({x})[0].cpu(), expected));
    CHECK(torch::equal(rest.run({x})[0].cpu(), expected));
  }
  const int live_before = green_context::live_count();
  CHECK(live_before >= 2);
  const std::size_t free_before = free_device_memory();
  for (int i = 0; i < 50; ++i) {
    if (i % 2 == 0) {
      runner<green_context_stream> r(m.spec(asked), gpu);
      CHECK(torch::equal(r.run({x})[0].cpu(), expected));
    } else {
      runner<green_context_complement_stream> r(m.spec(asked), gpu);
      CHECK(torch::equal(r.run({x})[0].cpu(), expected));
    }
    CHECK(green_context::live_count() == live_before);  // reused, not made again
  }
  const std::size_t free_after = free_device_memory();
  const auto shrink =
      static_cast<std::int64_t>(free_before) - static_cast<std::int64_t>(free_after);
  INFO("free device memory shrank by " << shrink << " bytes across 50 runners");
  CHECK(shrink <= std::int64_t{8} << 20);
}
