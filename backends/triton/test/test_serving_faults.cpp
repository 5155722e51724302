// Faults through torchloom's Triton backend: unload/reload cycles that must give back the
// memory they took (Triton's users report growth on load/unload with its PyTorch backend), a
// run that fails for want of memory and fails only its own request, and malformed requests
// that Triton answers INVALID_ARG before they reach the backend (or the GPU). On the CPU the
// process's resident memory is measured; on the GPU ([cuda]) the device's used memory.
#include "serving_core.hpp"

#include <torchloom/detail/config.hpp>

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#endif

namespace torchloom_serving_test {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t mib = std::int64_t{1} << 20;
constexpr int reload_cycles = 50;
// Cycles before the starting value is taken: the first loads make what a process keeps for
// good (torch's thread pools and kernels, a green context per partition, allocator pools).
constexpr int warm_cycles = 5;
// The slack allows 4 copies of the weights model's 16 MiB: a leak of one copy per cycle would
// add 45 x 16 MiB = 720 MiB.
constexpr std::int64_t memory_slack = 64 * mib;

// The process's resident memory, after handing freed heap memory back to the system.
std::int64_t resident_bytes() {
  ::malloc_trim(0);
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0;
  std::int64_t resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

#if TORCHLOOM_HAS_CUDA
// GPU 0's used memory as the driver counts it (what nvidia-smi shows), after torch's caching
// allocator has given its unused blocks back.
std::int64_t device_used_bytes() {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  c10::cuda::CUDACachingAllocator::emptyCache();
  std::size_t free = 0;
  std::size_t total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return static_cast<std::int64_t>(total - free);
}

// Bytes torch's caching allocator has handed out on GPU 0 and not had back.
std::int64_t torch_allocated_bytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}
#endif

// Loads, serves three requests (checked against torch's own answer) and unloads `model`,
// `reload_cycles` times; `measure()` is taken after `warm_cycles` and at the end. Returns the
// growth.
template <class Measure>
std::int64_t reload_cycles_growth(const std::string& model, Measure&& measure) {
  torch::manual_seed(9);
  const at::Tensor x = torch::rand({2, weights_width});
  const at::Tensor expected = weights_reference(x);
  std::int64_t start = 0;
  for (int cycle = 0; cycle < reload_cycles; ++cycle) {
    INFO(model << ", cycle " << cycle);
    require_load(model);
    // Three requests: graphed_caller captures a graph at the third, and must free it too.
    for (int i = 0; i < 3; ++i) check_weights_answer(model, x, expected);
    core().server->unload(model);
    REQUIRE_FALSE(core().server->ready(model));
    if (cycle + 1 == warm_cycles) start = measure();
  }
  return measure() - start;
}

// The residency configurations of the cycles: name and parameters.
struct residency_case {
  std::string name;
  std::string parameters;
};

std::vector<residency_case> cpu_residencies() {
  return {{"resident", parameter("TORCHLOOM_RESIDENCY", "resident")},
          {"shared", parameter("TORCHLOOM_RESIDENCY", "shared")}};
}

}  // namespace

TEST_CASE("50 unload/reload cycles per residency policy give the process's memory back",
          "[faults]") {
  for (const auto& c : cpu_residencies()) {
    const std::string model = "reload_cpu_" + c.name;
    write_weights(model, false, c.parameters);
    const std::int64_t growth = reload_cycles_growth(model, resident_bytes);
    // Shown in every run: the figure the slack is judged on.
    WARN(model << ": resident memory grew by " << growth / mib << " MiB over "
               << reload_cycles - warm_cycles << " cycles (slack " << memory_slack / mib
               << " MiB)");
    CHECK(growth <= memory_slack);
  }
}

TEST_CASE(
    "on the GPU, 50 unload/reload cycles per residency and stream policy give the "
    "device's memory back",
    "[faults][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  if (!core_has_gpu) TORCHLOOM_CATCH_SKIP("the Triton kit is a CPU-only build");
#if TORCHLOOM_HAS_CUDA
  std::vector<residency_case> cases = cpu_residencies();
  cases.push_back({"streamed", parameter("TORCHLOOM_RESIDENCY", "streamed") +
                                   parameter("WEIGHT_OFFLOAD_BUDGET_MB", "12")});
  cases.push_back({"mapped", parameter("TORCHLOOM_RESIDENCY", "mapped")});
  cases.push_back({"graphed", parameter("TORCHLOOM_STREAM", "graphed_caller")});
  cases.push_back({"green", parameter("TORCHLOOM_STREAM", "green") +
                                parameter("GREEN_CONTEXT_SM_COUNT", "16")});
  for (const auto& c : cases) {
    const std::string model = "reload_gpu_" + c.name;
    write_weights(model, true, c.parameters);
    std::optional<std::int64_t> torch_start;  // taken with the first measurement
    const std::int64_t growth = reload_cycles_growth(model, [&] {
      const std::int64_t used = device_used_bytes();
      if (!torch_start) torch_start = torch_allocated_bytes();
      return used;
    });
    const std::int64_t torch_growth = torch_allocated_bytes() - torch_start.value_or(0);
    WARN(model << ": device memory in use grew by " << growth / mib << " MiB, torch's "
               << "allocated bytes by " << torch_growth / mib << " MiB over "
               << reload_cycles - warm_cycles << " cycles (slack " << memory_slack / mib
               << " MiB)");
    CHECK(growth <= memory_slack);
    CHECK(torch_growth <= memory_slack);
  }
#else
  TORCHLOOM_CATCH_SKIP("built without CUDA");
#endif
}

namespace {

// forward(x, n): x + the sum of n ones made on x's device; n decides how much memory a run
// takes.
void write_hungry(const std::string& name, bool gpu) {
  static const fs::path file = [] {
    torch::jit::Module m("serving_hungry");
    m.define(R"(
def forward(self, x, n):
    ones = torch.ones([int(n.item())], device=x.device)
    return x + ones.sum()
)");
    return save_model(m, core().repository.parent_path() / "files" / "hungry");
  }();
  tt::write_model(core().repository, name, "torchloom",
                  "max_batch_size: 0\n"
                  "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] },\n"
                  "        { name: \"n\" data_type: TYPE_INT64 dims: [ 1 ] } ]\n"
                  "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n" +
                      std::string("instance_group [ { kind: ") +
                      (gpu ? "KIND_GPU gpus: [ 0 ]" : "KIND_CPU") + " count: 1 } ]\n",
                  file);
}

void check_out_of_memory(const std::string& model) {
  require_load(model);
  const at::Tensor x = torch::tensor({1.f, 2.f, 3.f, 4.f});
  const at::Tensor small = torch::tensor({std::int64_t{3}});
  // 2^46 floats (256 TiB): more than any host or device has.
  const at::Tensor huge = torch::tensor({std::int64_t{1} << 46});
  const auto ok = core().server->infer(model, {input("x", x), input("n", small)});
  REQUIRE_FALSE(ok.error.has_value());
  CHECK(torch::equal(tensor_of(ok.outputs[0]), x + 3));
  const auto failed = core().server->infer(model, {input("x", x), input("n", huge)});
  REQUIRE(failed.error.has_value());
  INFO(failed.error->message);
  CHECK(failed.error->code == TRITONSERVER_ERROR_INTERNAL);
  CHECK(failed.error->message.find("model '" + model + "'") != std::string::npos);
  CHECK(failed.error->message.find("memory") != std::string::npos);
  CHECK(core().server->ready(model));
  const auto next = core().server->infer(model, {input("x", x), input("n", small)});
  INFO((next.error ? next.error->message : std::string()));
  REQUIRE_FALSE(next.error.has_value());
  CHECK(torch::equal(tensor_of(next.outputs[0]), x + 3));
}

}  // namespace

TEST_CASE(
    "a run that runs out of memory fails its request with the message; the model then "
    "serves the next one",
    "[faults]") {
  write_hungry("hungry_cpu", false);
  check_out_of_memory("hungry_cpu");
}

TEST_CASE(
    "on the GPU, a run that runs out of device memory fails its request with the "
    "message; the model then serves the next one",
    "[faults][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  if (!core_has_gpu) TORCHLOOM_CATCH_SKIP("the Triton kit is a CPU-only build");
  write_hungry("hungry_gpu", true);
  check_out_of_memory("hungry_gpu");
}

namespace {

// Untouched, unreserved zero pages of `bytes` bytes (no resident memory until read).
struct lazy_buffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit lazy_buffer(std::size_t n) : bytes(n) {
    data = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data == MAP_FAILED) data = nullptr;
  }
  lazy_buffer(const lazy_buffer&) = delete;
  lazy_buffer& operator=(const lazy_buffer&) = delete;
  ~lazy_buffer() {
    if (data != nullptr) ::munmap(data, bytes);
  }
};

// Malformed requests to `model` (the bundled MLP: x FP32 [64], max_batch_size 8): each gets
// INVALID_ARG and none reaches the backend (its execution count does not move); a good request
// is then served.
void check_malformed(const std::string& model) {
  require_load(model);
  const at::Tensor x = torch::rand({1, 64});
  const auto good = core().server->infer(model, {input("x", x)});
  REQUIRE_FALSE(good.error.has_value());
  const std::uint64_t executions = core().server->counter(model, "execution_count");

  const at::Tensor as_long = torch::randint(0, 9, {1, 64}, torch::kLong);
  const at::Tensor narrow = torch::rand({1, 63});
  const at::Tensor nine = torch::rand({9, 64});
  lazy_buffer gib(std::size_t{1} << 30);
  REQUIRE(gib.data != nullptr);
  struct malformed {
    std::string what;
    std::vector<tt::tensor_in> inputs;
  };
  const std::vector<malformed> cases = {
      {"wrong data type", {input("x", as_long)}},
      {"wrong shape", {input("x", narrow)}},
      {"batch beyond max_batch_size", {input("x", nine)}},
      {"missing input", {}},
      {"unknown input", {input("x", x), input("z", x)}},
      {"fewer bytes than the shape",
       {{"x", TRITONSERVER_TYPE_FP32, {2, 64}, x.data_ptr(), x.nbytes()}}},
      {"a 1 GiB batch",
       {{"x", TRITONSERVER_TYPE_FP32, {std::int64_t{1} << 22, 64}, gib.data, gib.bytes}}},
  };
  for (const auto& c : cases) {
    INFO(model << ": " << c.what);
    const auto r = core().server->infer(model, c.inputs);
    REQUIRE(r.error.has_value());
    INFO(r.error->message);
    CHECK(r.error->code == TRITONSERVER_ERROR_INVALID_ARG);
    CHECK_FALSE(r.error->message.empty());
  }
  CHECK(core().server->counter(model, "execution_count") == executions);
  const auto after = core().server->infer(model, {input("x", x)});
  CHECK_FALSE(after.error.has_value());
}

std::string strict_body(bool gpu) {
  return "max_batch_size: 8\n"
         "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 64 ] } ]\n"
         "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n" +
         std::string("instance_group [ { kind: ") + (gpu ? "KIND_GPU gpus: [ 0 ]" : "KIND_CPU") +
         " count: 1 } ]\n";
}

}  // namespace

TEST_CASE("malformed requests get INVALID_ARG and never reach the backend", "[faults]") {
  tt::write_model(core().repository, "strict_cpu", "torchloom", strict_body(false),
                  fs::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt");
  check_malformed("strict_cpu");
}

TEST_CASE(
    "on the GPU, malformed requests get INVALID_ARG and never reach the backend or the "
    "device",
    "[faults][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  if (!core_has_gpu) TORCHLOOM_CATCH_SKIP("the Triton kit is a CPU-only build");
  tt::write_model(core().repository, "strict_gpu", "torchloom", strict_body(true),
                  fs::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt");
#if TORCHLOOM_HAS_CUDA
  require_load("strict_gpu");
  // One request first: what torch keeps after a first run (cuBLAS's workspace for the
  // instance's stream) is not the malformed requests'.
  const at::Tensor x = torch::rand({1, 64});
  REQUIRE_FALSE(core().server->infer("strict_gpu", {input("x", x)}).error.has_value());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::int64_t before = torch_allocated_bytes();
  check_malformed("strict_gpu");
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  // The good requests' tensors are freed by now: nothing of the malformed ones stayed.
  CHECK(torch_allocated_bytes() == before);
#else
  check_malformed("strict_gpu");
#endif
}

}  // namespace torchloom_serving_test
