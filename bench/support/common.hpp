#pragma once
// What every benchmark program shares: statistics (PERF.md's method: medians and p99s, nearest
// rank), the timing loops, registration and main, skips that say why, and objects kept for the
// whole run.
#include <torchloom/torchloom.hpp>

#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace torchloom_bench {

namespace fs = std::filesystem;
using steady = std::chrono::steady_clock;

//! Nearest-rank percentile q (0 < q <= 1) of a sample in any order; 0 for an empty one.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[rank == 0 ? 0 : rank - 1];
}

//! The median of a sample in any order (the mean of the middle two for an even count).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2.0;
}

//! The 99th percentile (nearest rank); also a Google Benchmark statistic over repetitions.
inline double p99(const std::vector<double>& v) { return percentile(v, 0.99); }

//! The smallest and largest value (0 for an empty sample): the spread over repetitions.
inline double min_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}
inline double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

//! Microseconds from `start` to now.
inline double us_since(steady::time_point start) {
  return std::chrono::duration<double, std::micro>(steady::now() - start).count();
}

//! Wall time of `call()` in microseconds. Whatever the call returns is destroyed inside the
//! timed region, so both sides of a pair count the same work.
template <class Fn>
double time_call_us(Fn&& call) {
  const auto start = steady::now();
  call();
  return us_since(start);
}

//! `calls` untimed calls of `call`.
template <class Fn>
void warm_up(int calls, Fn&& call) {
  for (int i = 0; i < calls; ++i) call();
}

//! The GPU every GPU benchmark runs on.
inline const c10::Device gpu(c10::kCUDA, 0);

//! Benchmark argument 0 is the CPU, any other the GPU.
inline c10::Device device_for(std::int64_t arg) { return arg == 0 ? c10::Device(c10::kCPU) : gpu; }

//! GPU time is part of a call on both sides alike: waits for the device after a call.
inline void sync(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

//! One call of `f`, then a wait for `device`; the output is destroyed after the wait.
template <class F>
void call_synced(c10::Device device, F&& f) {
  auto out = f();
  sync(device);
  benchmark::DoNotOptimize(out);
}

//! Skips (with an error, so the report shows why) when `why` is not empty.
inline bool skip_if(benchmark::State& state, const std::string& why) {
  if (!why.empty()) state.SkipWithError(why.c_str());
  return !why.empty();
}

//! A benchmark function, of any arguments, that only reports why it cannot run in this build.
inline auto skip_with(std::string why) {
  return [why](benchmark::State& state, auto&&...) { state.SkipWithError(why.c_str()); };
}

//! "no CUDA device" when `device` is a GPU and there is none, else "".
inline std::string no_device(c10::Device device) {
  return device.is_cuda() && !torch::cuda::is_available() ? "no CUDA device" : "";
}

//! Runs `body`; what it throws becomes the benchmark's skip.
template <class Body>
void guarded(benchmark::State& state, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

//! What the benchmarks keep for the whole run, each released by a function here: main()
//! calls them after the runs (last kept, first released), so no CUDA tensor outlives the CUDA
//! runtime's own teardown at exit.
inline std::vector<std::function<void()>>& at_teardown() {
  static std::vector<std::function<void()>> releases;
  return releases;
}

//! The process's one T, made by `make()` (a std::unique_ptr<T>) on first use and kept.
template <class T, class Make>
T& kept(Make&& make) {
  static std::unique_ptr<T> p;
  if (!p) {
    p = make();
    at_teardown().push_back([] { p.reset(); });
  }
  return *p;
}

//! One T per device, made by `make(device)` (a std::unique_ptr<T>) on first use and kept for
//! the whole run: a load is not what a per-call benchmark measures.
template <class T>
class per_device {
 public:
  explicit per_device(std::function<std::unique_ptr<T>(c10::Device)> make)
      : make_(std::move(make)) {}

  T& operator()(c10::Device device) {
    if (items_.empty()) at_teardown().push_back([this] { items_.clear(); });
    auto& p = items_[device.str()];
    if (!p) p = make_(device);
    return *p;
  }

 private:
  std::function<std::unique_ptr<T>(c10::Device)> make_;
  std::map<std::string, std::unique_ptr<T>> items_;
};

//! A T built once per process on first use and kept for the whole run, or why it could not
//! be built.
template <class T>
class built_once {
 public:
  //! The object, built by `build(slot)` (which emplaces into the std::optional<T> slot) the
  //! first time; nullptr, with `error` set to what building threw, when it failed.
  template <class Build>
  T* get(std::string& error, Build&& build) {
    if (!tried_) {
      tried_ = true;
      try {
        build(value_);
        at_teardown().push_back([this] { value_.reset(); });
      } catch (const std::exception& e) {
        value_.reset();
        error_ = e.what();
      }
    }
    error = error_;
    return value_ ? &*value_ : nullptr;
  }

 private:
  std::optional<T> value_;
  std::string error_;
  bool tried_ = false;
};

//! Sets plain counters (kDefaults: per call or per run already, not divided by iterations).
inline void set_counters(benchmark::State& state,
                         std::initializer_list<std::pair<const char*, double>> counters) {
  for (const auto& [name, value] : counters) state.counters[name] = value;
}

//! The medians of a paired benchmark's two sides.
struct paired_medians {
  double raw_us = 0.0;
  double runner_us = 0.0;
};

//! One raw call and one runner call per iteration, each timed on its own. Which side goes
//! first swaps every iteration: the second call of a pair finds caches (and on CUDA, the
//! launch queue) warmed by the first. Sets the counters scripts/report.py reads: per-call
//! medians, their ratio (runner / raw), p99s, and the calls per side.
template <class Raw, class Runner>
paired_medians time_paired(benchmark::State& state, Raw&& raw_once, Runner&& runner_once) {
  std::vector<double> raw;
  std::vector<double> runner;
  raw.reserve(static_cast<std::size_t>(state.max_iterations));
  runner.reserve(static_cast<std::size_t>(state.max_iterations));
  bool raw_first = true;
  for (auto _ : state) {
    if (raw_first) {
      raw.push_back(time_call_us(raw_once));
      runner.push_back(time_call_us(runner_once));
    } else {
      runner.push_back(time_call_us(runner_once));
      raw.push_back(time_call_us(raw_once));
    }
    raw_first = !raw_first;
  }
  const paired_medians m{median(raw), median(runner)};
  set_counters(state, {{"raw_median_us", m.raw_us},
                       {"runner_median_us", m.runner_us},
                       {"ratio", m.raw_us > 0.0 ? m.runner_us / m.raw_us : 0.0},
                       {"raw_p99_us", p99(raw)},
                       {"runner_p99_us", p99(runner)},
                       {"calls", static_cast<double>(raw.size())}});
  return m;
}

//! One host-time part: the counter it sets, and one call of it.
using host_part = std::pair<const char*, std::function<void()>>;

//! Sets, for each part, its counter to the mean host time of one call in microseconds, over
//! batches of `batch_calls` calls, one batch per part in each iteration, with `settle()` (not
//! timed: a device synchronisation, say) before each batch.
template <class Settle>
void time_host_parts(benchmark::State& state, const std::vector<host_part>& parts, Settle&& settle,
                     int batch_calls = 100) {
  std::vector<double> total_us(parts.size(), 0.0);
  std::int64_t batches = 0;
  for (auto _ : state) {
    for (std::size_t p = 0; p < parts.size(); ++p) {
      settle();
      total_us[p] += time_call_us([&] {
        for (int i = 0; i < batch_calls; ++i) parts[p].second();
      });
    }
    ++batches;
  }
  const double calls = static_cast<double>(batches) * batch_calls;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    state.counters[parts[p].first] = calls > 0 ? total_us[p] / calls : 0.0;
  }
}

//! A separately timed benchmark: `repetitions` repetitions, reported as their aggregates only,
//! the median (built in) and the p99. A benchmark that cannot run here (no device, no model)
//! is given 1, so that it reports its skip once, not once per repetition.
template <class B>
B* with_p99(B* b, int repetitions) {
  return b->Repetitions(repetitions)->DisplayAggregatesOnly(true)->ComputeStatistics("p99", p99);
}

//! A paired benchmark, whose counters are its result: the min and max aggregates give the
//! report the ratio's spread over the repetitions (the median aggregate is built in).
template <class B>
B* with_spread(B* b, int repetitions) {
  return b->Repetitions(repetitions)
      ->DisplayAggregatesOnly(true)
      ->ComputeStatistics("min", min_of)
      ->ComputeStatistics("max", max_of);
}

//! A benchmark of `iterations` iterations and one repetition, real time in microseconds.
template <class... Args>
auto register_once(const std::string& name, benchmark::IterationCount iterations,
                   Args&&... fn_and_args) {
  return benchmark::RegisterBenchmark(name.c_str(), std::forward<Args>(fn_and_args)...)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime()
      ->Iterations(iterations)
      ->Repetitions(1);
}

//! A benchmark of one iteration and one repetition, timed by SetIterationTime.
template <class... Args>
auto register_manual(const std::string& name, benchmark::TimeUnit unit, Args&&... fn_and_args) {
  return benchmark::RegisterBenchmark(name.c_str(), std::forward<Args>(fn_and_args)...)
      ->Unit(unit)
      ->UseManualTime()
      ->Iterations(1)
      ->Repetitions(1);
}

// T1: a raw call against the runner's, per call (bm_overhead, bm_aoti).
constexpr int t1_warmup_calls = 5;  // untimed calls before each timed loop

//! A separately timed side: warm-up calls of `once`, then, when `check()` holds (the runner
//! computes what the raw call computes), one `once()` per iteration.
template <class Once, class Check>
void time_separately(benchmark::State& state, Once&& once, Check&& check) {
  warm_up(t1_warmup_calls, once);
  if (!check()) return;
  for (auto _ : state) once();
}

//! A paired benchmark: warm-up calls of both sides, then, when `check()` holds, time_paired.
template <class Raw, class Runner, class Check>
void time_paired_checked(benchmark::State& state, Raw&& raw_once, Runner&& runner_once,
                         Check&& check) {
  warm_up(t1_warmup_calls, [&] {
    raw_once();
    runner_once();
  });
  if (!check()) return;
  time_paired(state, raw_once, runner_once);
}

//! Registers, for the device of `device_arg` (0: cpu, else cuda:0) at batch 1 and 32:
//! BM_raw_<x> and BM_runner_<x>, `separate(state, device_arg, batch, is_runner)`, 30
//! repetitions of at least 0.1 s; then, for each (name, arm) of `arms`, <name>,
//! `paired(state, device_arg, batch, arm)`, 3 repetitions of a fixed count of calls per side
//! (the median moves by well under 1% between repetitions at these counts). The report pairs
//! BM_raw_<x>/<suffix> with BM_runner_<x>/<suffix>; BM_paired_<x>/<suffix> has a table of its
//! own. Without `can` (no device, no model) each reports its skip once.
template <class Separate, class Paired, class Arm>
void register_t1(const std::string& x, std::int64_t device_arg, bool can, Separate separate,
                 Paired paired, std::initializer_list<std::pair<const char*, Arm>> arms) {
  for (const std::int64_t batch : {1, 32}) {
    const std::string suffix = std::string("/device:") + (device_arg == 0 ? "cpu" : "cuda:0") +
                               "/batch:" + std::to_string(batch);
    for (const bool is_runner : {false, true}) {
      const std::string name = (is_runner ? "BM_runner_" : "BM_raw_") + x + suffix;
      auto* b = benchmark::RegisterBenchmark(name.c_str(), separate, device_arg, batch, is_runner);
      with_p99(b->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1), can ? 30 : 1);
    }
    for (const auto& [name, arm] : arms) {
      auto* b =
          benchmark::RegisterBenchmark((name + suffix).c_str(), paired, device_arg, batch, arm);
      const benchmark::IterationCount calls = device_arg == 0 ? 20000 : 5000;
      with_spread(b->Unit(benchmark::kMicrosecond)->UseRealTime()->Iterations(calls), can ? 3 : 1);
    }
  }
}

//! A benchmark program's main: Google Benchmark's flags, `register_benchmarks()`, the runs
//! the flags select, then what the benchmarks kept is released (at_teardown).
template <class Register>
int run_main(int argc, char** argv, Register&& register_benchmarks) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  auto& releases = at_teardown();
  while (!releases.empty()) {
    releases.back()();
    releases.pop_back();
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace torchloom_bench

//! Defines main() for a benchmark program: run_main with `register_fn` of torchloom_bench.
#define TORCHLOOM_BENCH_MAIN(register_fn)                                           \
  int main(int argc, char** argv) {                                                 \
    return ::torchloom_bench::run_main(argc, argv, ::torchloom_bench::register_fn); \
  }
