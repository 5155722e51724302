// T1 (PERF.md): the per-call cost of model_runner<torchscript_loader> (no_hook, caller_stream,
// resident_weights) against the LibTorch call a user would write by hand, on the bundled tiny
// MLP, on CPU and on cuda:0, side by side in one run.
//
// Each pair is registered next to each other (raw, then runner, per device and batch), so
// machine noise drifts over both alike. The models are loaded once per device and kept for
// the whole run: Google Benchmark calls a benchmark function several times per repetition,
// and a load (or a fresh profiling executor) is not what T1 measures.
//
// The separate raw and runner benchmarks differ by more than T1's 2% between runs of the same
// binary (slow drift: clocks, caches, other tenants). BM_paired_* decides T1: one loop
// alternates a raw and a runner call, so both sides see the same drift, and times each call on
// its own, so the medians and the p99s are per call.
#include <torchloom/torchloom.hpp>

#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using runner_type = torchloom::model_runner<torchloom::torchscript_loader>;

constexpr std::int64_t feature_count = 64;  // the bundled model's input: float32 [batch, 64]
constexpr int warmup_calls = 5;             // untimed calls before each timed loop
constexpr int repetitions = 30;
constexpr double min_time_s = 0.1;  // per repetition
// BM_paired_*: calls per side and repetition. Fixed, so every repetition has the same number
// of samples; the median moves by well under 1% between repetitions at these counts, and the
// whole binary stays within about a minute on the GPU machine.
constexpr benchmark::IterationCount paired_calls_cpu = 20000;
constexpr benchmark::IterationCount paired_calls_cuda = 5000;
constexpr int paired_repetitions = 3;  // enough to show the ratio's spread

c10::Device device_for(std::int64_t arg) {
  return arg == 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
}

// The process's models, one per device. Cleared by main() before it returns, so no CUDA
// tensor outlives the CUDA runtime's own teardown at exit.
struct loaded_models {
  std::map<std::string, torch::jit::Module> raw;
  std::map<std::string, std::unique_ptr<runner_type>> runners;
};

loaded_models& models() {
  static loaded_models m;
  return m;
}

// What a user writes by hand: load on the device, switch to eval mode.
torch::jit::Module& raw_module(c10::Device device) {
  auto& raw = models().raw;
  auto it = raw.find(device.str());
  if (it == raw.end()) {
    const auto file = std::filesystem::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt";
    torch::jit::Module m = torch::jit::load(file.string(), device);
    m.eval();
    it = raw.emplace(device.str(), std::move(m)).first;
  }
  return it->second;
}

runner_type& runner(c10::Device device) {
  auto& runners = models().runners;
  auto it = runners.find(device.str());
  if (it == runners.end()) {
    auto r = std::make_unique<runner_type>(
        torchloom::model_spec::from_directory(TORCHLOOM_BUNDLED_MODEL_DIR), device);
    it = runners.emplace(device.str(), std::move(r)).first;
  }
  return *it->second;
}

// One hand-written call, as the runner makes it: InferenceMode per call, inputs copied
// (forward takes its vector by value).
c10::IValue raw_call(torch::jit::Module& m, const std::vector<c10::IValue>& inputs) {
  c10::InferenceMode inference;
  return m.forward(inputs);
}

// GPU time is part of a call on both sides alike: wait for the device after each call.
void sync(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Random inputs already on the device (never zeros: PERF.md), the same on both sides.
std::vector<c10::IValue> make_inputs(c10::Device device, std::int64_t batch) {
  torch::manual_seed(42);
  return {torch::rand({batch, feature_count}, torch::TensorOptions().device(device))};
}

// Skips (with an error, so the report shows why) when the device is not there.
bool device_missing(benchmark::State& state, c10::Device device) {
  if (device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

void bm_raw_torchscript(benchmark::State& state, std::int64_t device_arg, std::int64_t batch) {
  const c10::Device device = device_for(device_arg);
  if (device_missing(state, device)) return;
  torch::jit::Module& m = raw_module(device);
  const std::vector<c10::IValue> inputs = make_inputs(device, batch);
  for (int i = 0; i < warmup_calls; ++i) {
    c10::IValue out = raw_call(m, inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  }
  for (auto _ : state) {
    c10::IValue out = raw_call(m, inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  }
}

void bm_runner_torchscript(benchmark::State& state, std::int64_t device_arg,
                           std::int64_t batch) {
  const c10::Device device = device_for(device_arg);
  if (device_missing(state, device)) return;
  runner_type& r = runner(device);
  const std::vector<c10::IValue> inputs = make_inputs(device, batch);
  for (int i = 0; i < warmup_calls; ++i) {
    std::vector<at::Tensor> out = r.run(inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  }
  // Only time the runner when it computes what the hand-written call computes.
  const at::Tensor expected = raw_call(raw_module(device), inputs).toTensor();
  const std::vector<at::Tensor> got = r.run(inputs);
  sync(device);
  if (got.size() != 1 || !torch::equal(got.front(), expected)) {
    state.SkipWithError("runner output differs from the raw TorchScript output");
    return;
  }
  for (auto _ : state) {
    std::vector<at::Tensor> out = r.run(inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  }
}

// Nearest-rank percentile q (0 < q <= 1) of an ascending sample.
double nearest_rank(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[rank == 0 ? 0 : rank - 1];
}

// The 99th percentile of the repetitions' per-call times (nearest rank).
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

// Wall time of one call in microseconds. The call's result is destroyed inside the timed
// region, as in the separate benchmarks' loops, so both measurements count the same work.
template <class Fn>
double time_call_us(Fn&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(stop - start).count();
}

// One repetition of the paired T1 measurement: max_iterations raw calls and as many runner
// calls, interleaved. Which side goes first swaps every iteration: the second call of a pair
// finds caches (and on CUDA, the launch queue) warmed by the first.
void bm_paired_torchscript(benchmark::State& state, std::int64_t device_arg, std::int64_t batch) {
  const c10::Device device = device_for(device_arg);
  if (device_missing(state, device)) return;
  torch::jit::Module& m = raw_module(device);
  runner_type& r = runner(device);
  const std::vector<c10::IValue> inputs = make_inputs(device, batch);
  for (int i = 0; i < warmup_calls; ++i) {
    c10::IValue raw_out = raw_call(m, inputs);
    std::vector<at::Tensor> runner_out = r.run(inputs);
    sync(device);
    benchmark::DoNotOptimize(raw_out);
    benchmark::DoNotOptimize(runner_out);
  }
  const at::Tensor expected = raw_call(m, inputs).toTensor();
  const std::vector<at::Tensor> got = r.run(inputs);
  sync(device);
  if (got.size() != 1 || !torch::equal(got.front(), expected)) {
    state.SkipWithError("runner output differs from the raw TorchScript output");
    return;
  }

  const auto raw_once = [&] {
    c10::IValue out = raw_call(m, inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  };
  const auto runner_once = [&] {
    std::vector<at::Tensor> out = r.run(inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  };
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

  std::sort(raw_us.begin(), raw_us.end());
  std::sort(runner_us.begin(), runner_us.end());
  const double raw_median = median_of_sorted(raw_us);
  const double runner_median = median_of_sorted(runner_us);
  // Plain values (kDefaults): per call already, so not to be divided by the iteration count.
  using counter = benchmark::Counter;
  state.counters["raw_median_us"] = counter(raw_median, counter::kDefaults);
  state.counters["runner_median_us"] = counter(runner_median, counter::kDefaults);
  state.counters["ratio"] =
      counter(raw_median > 0.0 ? runner_median / raw_median : 0.0, counter::kDefaults);
  state.counters["raw_p99_us"] = counter(nearest_rank(raw_us, 0.99), counter::kDefaults);
  state.counters["runner_p99_us"] = counter(nearest_rank(runner_us, 0.99), counter::kDefaults);
  state.counters["calls"] =
      counter(static_cast<double>(raw_us.size()), counter::kDefaults);  // per side
}

double min_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

template <class Fn>
void register_one(const std::string& name, Fn fn, std::int64_t device_arg, std::int64_t batch) {
  // Without a device the benchmark only reports its skip: once, not once per repetition.
  const bool runnable = device_arg == 0 || torch::cuda::is_available();
  benchmark::RegisterBenchmark(name.c_str(), fn, device_arg, batch)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime()
      ->MinTime(min_time_s)
      ->Repetitions(runnable ? repetitions : 1)
      ->DisplayAggregatesOnly(true)
      ->ComputeStatistics("p99", p99);
}

// The paired benchmark's counters are its result; the min and max aggregates give the report
// the ratio's spread over the repetitions (the median aggregate is built in).
void register_paired(const std::string& name, std::int64_t device_arg, std::int64_t batch) {
  const bool runnable = device_arg == 0 || torch::cuda::is_available();
  benchmark::RegisterBenchmark(name.c_str(), bm_paired_torchscript, device_arg, batch)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime()
      ->Iterations(device_arg == 0 ? paired_calls_cpu : paired_calls_cuda)
      ->Repetitions(runnable ? paired_repetitions : 1)
      ->DisplayAggregatesOnly(true)
      ->ComputeStatistics("min", min_of)
      ->ComputeStatistics("max", max_of);
}

// Names pair up in the report: BM_raw_<x>/<suffix> with BM_runner_<x>/<suffix>; the report's
// "T1 paired" table reads BM_paired_<x>/<suffix>.
void register_benchmarks() {
  for (const std::int64_t device_arg : {0, 1}) {
    const std::string device_name = device_arg == 0 ? "cpu" : "cuda:0";
    for (const std::int64_t batch : {1, 32}) {
      const std::string suffix =
          "/device:" + device_name + "/batch:" + std::to_string(batch);
      register_one("BM_raw_torchscript" + suffix, bm_raw_torchscript, device_arg, batch);
      register_one("BM_runner_torchscript" + suffix, bm_runner_torchscript, device_arg, batch);
      register_paired("BM_paired_torchscript" + suffix, device_arg, batch);
    }
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
