// T1 and T10 (PERF.md) for AOTInductor packages: the per-call cost of
// model_runner<aoti_loader> (no_hook, caller_stream, resident_weights) against the call a user
// writes by hand, `AOTIModelPackageLoader::run(inputs, stream)`, and the runner's construction
// against the package loader's, on the MLP packages scripts/make_aoti_fixtures.py makes
// (mlp_cpu, mlp_cuda). Same method as bm_overhead: separate raw and runner benchmarks, plus
// BM_paired_aoti, which alternates raw and runner calls in one loop and decides T1.
//
// Without the packages every benchmark reports a skip that says how to make them; with a
// LibTorch older than 2.6 nothing is registered.
#include <torchloom/torchloom.hpp>

#include <benchmark/benchmark.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdio>

#if TORCHLOOM_TORCH_VERSION >= 20600

#include <torch/cuda.h>
#include <torch/script.h>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
using runner_type = torchloom::model_runner<torchloom::aoti_loader>;
using package_loader = torch::inductor::AOTIModelPackageLoader;

constexpr std::int64_t feature_count = 64;  // the MLP packages' input: float32 [batch, 64]
constexpr int warmup_calls = 5;
constexpr int repetitions = 30;
constexpr double min_time_s = 0.1;
constexpr benchmark::IterationCount paired_calls_cpu = 20000;
constexpr benchmark::IterationCount paired_calls_cuda = 5000;
constexpr int paired_repetitions = 3;
// Construction extracts the package, loads its library and its weights: tens of ms.
constexpr benchmark::IterationCount load_iterations = 3;
constexpr int load_repetitions = 10;
constexpr benchmark::IterationCount paired_load_iterations = 20;
constexpr int paired_load_repetitions = 5;

c10::Device device_for(std::int64_t arg) {
  return arg == 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
}

fs::path fixture_dir(c10::Device device) {
  const char* env = std::getenv("TORCHLOOM_AOTI_FIXTURES");
  const fs::path root = env != nullptr && *env != 0 ? fs::path(env) : TORCHLOOM_AOTI_FIXTURE_DIR;
  return root / (device.is_cuda() ? "mlp_cuda" : "mlp_cpu");
}

fs::path package_file(c10::Device device) { return fixture_dir(device) / "1" / "model.pt2"; }

// Skips (with an error, so the report shows why) without the device or the package.
bool cannot_run(benchmark::State& state, c10::Device device) {
  if (device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  std::error_code ec;
  if (!fs::is_regular_file(package_file(device), ec)) {
    const std::string why = "no package " + package_file(device).string() +
                            "; run scripts/make_aoti_fixtures.py (or set TORCHLOOM_AOTI_FIXTURES)";
    state.SkipWithError(why.c_str());
    return true;
  }
  return false;
}

// What a user writes by hand: the package on the runner's device, one call at a time.
std::unique_ptr<package_loader> make_raw(c10::Device device) {
  return torchloom::detail::make_package_loader<package_loader>(
      "bm_aoti", package_file(device).string(), "model", 1, device);
}

std::unique_ptr<runner_type> make_runner(c10::Device device) {
  return std::make_unique<runner_type>(torchloom::model_spec::from_directory(fixture_dir(device)),
                                       device);
}

// The process's loaded packages, one per device, kept for the whole run. Cleared by main()
// before it returns, so nothing on the GPU outlives the CUDA runtime's teardown.
struct loaded_models {
  std::map<std::string, std::unique_ptr<package_loader>> raw;
  std::map<std::string, std::unique_ptr<runner_type>> runners;
};

loaded_models& models() {
  static loaded_models m;
  return m;
}

package_loader& raw_package(c10::Device device) {
  auto& p = models().raw[device.str()];
  if (!p) p = make_raw(device);
  return *p;
}

runner_type& runner(c10::Device device) {
  auto& r = models().runners[device.str()];
  if (!r) r = make_runner(device);
  return *r;
}

// One hand-written call, as the runner makes it: InferenceMode per call, the caller's current
// stream passed explicitly.
std::vector<at::Tensor> raw_call(package_loader& p, const std::vector<at::Tensor>& inputs,
                                 c10::Device device) {
  c10::InferenceMode inference;
  void* stream = nullptr;
#if TORCHLOOM_HAS_CUDA
  if (device.is_cuda()) stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;  // without CUDA headers: AOTI takes the current stream itself
#endif
  return p.run(inputs, stream);
}

void sync(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

std::vector<at::Tensor> make_tensors(c10::Device device, std::int64_t batch) {
  torch::manual_seed(42);
  return {torch::rand({batch, feature_count}, torch::TensorOptions().device(device))};
}

std::vector<c10::IValue> as_ivalues(const std::vector<at::Tensor>& tensors) {
  return {tensors.begin(), tensors.end()};
}

// Only time the runner when it computes what the hand-written call computes.
bool same_outputs(benchmark::State& state, c10::Device device,
                  const std::vector<at::Tensor>& tensors) {
  const auto expected = raw_call(raw_package(device), tensors, device);
  const auto got = runner(device).run(as_ivalues(tensors));
  sync(device);
  if (got.size() != expected.size() || !torch::equal(got.front(), expected.front())) {
    state.SkipWithError("runner output differs from the raw AOTI output");
    return false;
  }
  return true;
}

void bm_raw_aoti(benchmark::State& state, std::int64_t device_arg, std::int64_t batch) {
  const c10::Device device = device_for(device_arg);
  if (cannot_run(state, device)) return;
  package_loader& p = raw_package(device);
  const auto tensors = make_tensors(device, batch);
  for (int i = 0; i < warmup_calls; ++i) {
    auto out = raw_call(p, tensors, device);
    sync(device);
    benchmark::DoNotOptimize(out);
  }
  for (auto _ : state) {
    auto out = raw_call(p, tensors, device);
    sync(device);
    benchmark::DoNotOptimize(out);
  }
}

void bm_runner_aoti(benchmark::State& state, std::int64_t device_arg, std::int64_t batch) {
  const c10::Device device = device_for(device_arg);
  if (cannot_run(state, device)) return;
  runner_type& r = runner(device);
  const auto tensors = make_tensors(device, batch);
  for (int i = 0; i < warmup_calls; ++i) {
    auto out = r.run_tensors(tensors);
    sync(device);
    benchmark::DoNotOptimize(out);
  }
  if (!same_outputs(state, device, tensors)) return;
  for (auto _ : state) {
    auto out = r.run_tensors(tensors);
    sync(device);
    benchmark::DoNotOptimize(out);
  }
}

double nearest_rank(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[rank == 0 ? 0 : rank - 1];
}

double p99(const std::vector<double>& v) {
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  return nearest_rank(sorted, 0.99);
}

double median_of_sorted(const std::vector<double>& sorted) {
  if (sorted.empty()) return 0.0;
  const std::size_t mid = sorted.size() / 2;
  return sorted.size() % 2 == 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0;
}

double min_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

template <class Fn>
double time_call_us(Fn&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(stop - start).count();
}

// T1, paired: raw and runner calls alternate in one loop (which goes first swaps every
// iteration), each timed on its own; the counters are per-call medians and p99s.
void set_paired_counters(benchmark::State& state, std::vector<double>& raw_us,
                         std::vector<double>& runner_us);

// The second arm: the runner's run_tensors() (T1), or, as diagnostics that split the cost,
// the runner's boxed run() (IValues in and out) or the loader's boxed run() alone.
enum class second_arm { run_tensors, boxed_run, boxed_loader };

void bm_paired_aoti(benchmark::State& state, std::int64_t device_arg, std::int64_t batch,
                    second_arm arm) {
  const c10::Device device = device_for(device_arg);
  if (cannot_run(state, device)) return;
  runner_type& r = runner(device);
  // The raw calls go to the runner's own loaded package, so both sides run the same code
  // and constants (two loads of one package differ in where they land).
  package_loader& p = *r.model().package;
  const auto tensors = make_tensors(device, batch);
  const auto inputs = as_ivalues(tensors);
  const auto raw_once = [&] {
    auto out = raw_call(p, tensors, device);
    sync(device);
    benchmark::DoNotOptimize(out);
  };
  const torchloom::aoti_loader loader;
  auto& model = const_cast<torchloom::aoti_model&>(r.model());
  const c10::Stream stream = device.is_cuda()
                                 ? c10::impl::getDeviceGuardImpl(device.type())->getStream(device)
                                 : c10::Stream(c10::Stream::DEFAULT, device);
  const auto runner_once = [&] {
    if (arm == second_arm::run_tensors) {
      auto out = r.run_tensors(tensors);
      sync(device);
      benchmark::DoNotOptimize(out);
    } else if (arm == second_arm::boxed_loader) {
      c10::InferenceMode inference;
      std::vector<c10::IValue> in(inputs);
      auto out = loader.run(model, std::move(in), torchloom::run_context{device, stream});
      sync(device);
      benchmark::DoNotOptimize(out);
    } else {
      auto out = r.run(inputs);
      sync(device);
      benchmark::DoNotOptimize(out);
    }
  };
  for (int i = 0; i < warmup_calls; ++i) {
    raw_once();
    runner_once();
  }
  if (!same_outputs(state, device, tensors)) return;
  std::vector<double> raw_us;
  std::vector<double> runner_us;
  raw_us.reserve(static_cast<std::size_t>(state.max_iterations));
  runner_us.reserve(static_cast<std::size_t>(state.max_iterations));
  bool raw_first = true;
  for (auto _ : state) {
    if (raw_first) {
      raw_us.push_back(time_call_us(raw_once));
      runner_us.push_back(time_call_us(runner_once));
    } else {
      runner_us.push_back(time_call_us(runner_once));
      raw_us.push_back(time_call_us(raw_once));
    }
    raw_first = !raw_first;
  }
  set_paired_counters(state, raw_us, runner_us);
}

// The paired counters report.py reads: per-call medians, their ratio and p99s.
void set_paired_counters(benchmark::State& state, std::vector<double>& raw_us,
                         std::vector<double>& runner_us) {
  std::sort(raw_us.begin(), raw_us.end());
  std::sort(runner_us.begin(), runner_us.end());
  const double raw_median = median_of_sorted(raw_us);
  const double runner_median = median_of_sorted(runner_us);
  using counter = benchmark::Counter;
  state.counters["raw_median_us"] = counter(raw_median, counter::kDefaults);
  state.counters["runner_median_us"] = counter(runner_median, counter::kDefaults);
  state.counters["ratio"] =
      counter(raw_median > 0.0 ? runner_median / raw_median : 0.0, counter::kDefaults);
  state.counters["raw_p99_us"] = counter(nearest_rank(raw_us, 0.99), counter::kDefaults);
  state.counters["runner_p99_us"] = counter(nearest_rank(runner_us, 0.99), counter::kDefaults);
  state.counters["calls"] = counter(static_cast<double>(raw_us.size()), counter::kDefaults);
}

// T10: construction and destruction of the package loader a user writes by hand, against the
// runner's (model spec, options, file check, load, input signature). One untimed round first:
// the first load in a process pays for torch's and CUDA's own start-up.
void bm_raw_aoti_load(benchmark::State& state, std::int64_t device_arg) {
  const c10::Device device = device_for(device_arg);
  if (cannot_run(state, device)) return;
  make_raw(device).reset();
  for (auto _ : state) {
    auto p = make_raw(device);
    benchmark::DoNotOptimize(p.get());
    p.reset();
  }
}

void bm_runner_aoti_load(benchmark::State& state, std::int64_t device_arg) {
  const c10::Device device = device_for(device_arg);
  if (cannot_run(state, device)) return;
  make_runner(device).reset();
  for (auto _ : state) {
    auto r = make_runner(device);
    benchmark::DoNotOptimize(r.get());
    r.reset();
  }
}

// T10, paired: a raw load and a runner's load alternate (which goes first swaps), each timed,
// so both share the machine's drift (loads take milliseconds and vary run to run).
void bm_paired_aoti_load(benchmark::State& state, std::int64_t device_arg) {
  const c10::Device device = device_for(device_arg);
  if (cannot_run(state, device)) return;
  const auto raw_once = [&] {
    auto p = make_raw(device);
    benchmark::DoNotOptimize(p.get());
  };
  const auto runner_once = [&] {
    auto r = make_runner(device);
    benchmark::DoNotOptimize(r.get());
  };
  raw_once();
  runner_once();
  std::vector<double> raw_us;
  std::vector<double> runner_us;
  bool raw_first = true;
  for (auto _ : state) {
    if (raw_first) {
      raw_us.push_back(time_call_us(raw_once));
      runner_us.push_back(time_call_us(runner_once));
    } else {
      runner_us.push_back(time_call_us(runner_once));
      raw_us.push_back(time_call_us(raw_once));
    }
    raw_first = !raw_first;
  }
  set_paired_counters(state, raw_us, runner_us);
}

bool runnable(std::int64_t device_arg) {
  const c10::Device device = device_for(device_arg);
  std::error_code ec;
  return (device.is_cpu() || torch::cuda::is_available()) &&
         fs::is_regular_file(package_file(device), ec);
}

void register_benchmarks() {
  for (const std::int64_t device_arg : {0, 1}) {
    const std::string device_name = device_arg == 0 ? "cpu" : "cuda:0";
    // Without the device or the package each benchmark only reports its skip, once.
    const bool can = runnable(device_arg);
    for (const std::int64_t batch : {1, 32}) {
      const std::string suffix = "/device:" + device_name + "/batch:" + std::to_string(batch);
      for (const auto& [name, fn] :
           {std::pair{"BM_raw_aoti", &bm_raw_aoti}, std::pair{"BM_runner_aoti", &bm_runner_aoti}}) {
        benchmark::RegisterBenchmark((name + suffix).c_str(), fn, device_arg, batch)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->MinTime(min_time_s)
            ->Repetitions(can ? repetitions : 1)
            ->DisplayAggregatesOnly(true)
            ->ComputeStatistics("p99", p99);
      }
      for (const auto& [name, arm] :
           {std::pair{"BM_paired_aoti", second_arm::run_tensors},
            std::pair{"BM_paired_aoti_boxed_run_only", second_arm::boxed_run},
            std::pair{"BM_paired_aoti_boxed_loader_only", second_arm::boxed_loader}}) {
        benchmark::RegisterBenchmark((name + suffix).c_str(), bm_paired_aoti, device_arg, batch,
                                     arm)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->Iterations(device_arg == 0 ? paired_calls_cpu : paired_calls_cuda)
            ->Repetitions(can ? paired_repetitions : 1)
            ->DisplayAggregatesOnly(true)
            ->ComputeStatistics("min", min_of)
            ->ComputeStatistics("max", max_of);
      }
    }
    for (const auto& [name, fn] : {std::pair{"BM_raw_aoti_load", &bm_raw_aoti_load},
                                   std::pair{"BM_runner_aoti_load", &bm_runner_aoti_load}}) {
      benchmark::RegisterBenchmark((std::string(name) + "/device:" + device_name).c_str(), fn,
                                   device_arg)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(load_iterations)
          ->Repetitions(can ? load_repetitions : 1)
          ->DisplayAggregatesOnly(true)
          ->ComputeStatistics("p99", p99);
    }
    benchmark::RegisterBenchmark(("BM_paired_aoti_load/device:" + device_name).c_str(),
                                 bm_paired_aoti_load, device_arg)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(paired_load_iterations)
        ->Repetitions(can ? paired_load_repetitions : 1)
        ->DisplayAggregatesOnly(true)
        ->ComputeStatistics("min", min_of)
        ->ComputeStatistics("max", max_of);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  models().runners.clear();
  models().raw.clear();
  return 0;
}

#else

// No AOTInductor before LibTorch 2.6: nothing to measure, and no result file, so the report
// has no empty table.
int main() {
  std::puts("bm_aoti: AOTInductor packages need LibTorch >= 2.6; nothing to run");
  return 0;
}

#endif
