#pragma once
// Timing loops: one call timed on the host, and the paired loop that alternates a raw call and
// a runner call (PERF.md: both sides see the same drift), with the counters it reports.
#include "stats.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace torchloom_bench {

//! Wall time of `call()` in microseconds. Whatever the call returns is destroyed inside the
//! timed region, so both sides of a pair count the same work.
template <class Fn>
double time_call_us(Fn&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(stop - start).count();
}

//! `calls` untimed calls of `call`.
template <class Fn>
void warm_up(int calls, Fn&& call) {
  for (int i = 0; i < calls; ++i) call();
}

//! The benchmark's timed loop: one `call()` per iteration.
template <class Fn>
void time_each_iteration(benchmark::State& state, Fn&& call) {
  for (auto _ : state) call();
}

//! Per-call times of the two sides of a paired benchmark, in microseconds.
struct paired_samples {
  std::vector<double> raw_us;
  std::vector<double> runner_us;
};

//! One raw call and one runner call per iteration, each timed on its own. Which side goes
//! first swaps every iteration: the second call of a pair finds caches (and on CUDA, the
//! launch queue) warmed by the first.
template <class Raw, class Runner>
paired_samples time_paired(benchmark::State& state, Raw&& raw_once, Runner&& runner_once) {
  paired_samples s;
  s.raw_us.reserve(static_cast<std::size_t>(state.max_iterations));
  s.runner_us.reserve(static_cast<std::size_t>(state.max_iterations));
  bool raw_first = true;
  for (auto _ : state) {
    if (raw_first) {
      s.raw_us.push_back(time_call_us(raw_once));
      s.runner_us.push_back(time_call_us(runner_once));
    } else {
      s.runner_us.push_back(time_call_us(runner_once));
      s.raw_us.push_back(time_call_us(raw_once));
    }
    raw_first = !raw_first;
  }
  return s;
}

//! The medians of a paired benchmark's two sides.
struct paired_medians {
  double raw_us = 0.0;
  double runner_us = 0.0;
};

//! Sets the counters scripts/report.py reads from a paired benchmark: per-call medians, their
//! ratio (runner / raw), p99s, and the calls per side. Plain values (kDefaults): per call
//! already, so not to be divided by the iteration count.
inline paired_medians set_paired_counters(benchmark::State& state, paired_samples& s) {
  std::sort(s.raw_us.begin(), s.raw_us.end());
  std::sort(s.runner_us.begin(), s.runner_us.end());
  const paired_medians m{median_of_sorted(s.raw_us), median_of_sorted(s.runner_us)};
  using counter = benchmark::Counter;
  state.counters["raw_median_us"] = counter(m.raw_us, counter::kDefaults);
  state.counters["runner_median_us"] = counter(m.runner_us, counter::kDefaults);
  state.counters["ratio"] =
      counter(m.raw_us > 0.0 ? m.runner_us / m.raw_us : 0.0, counter::kDefaults);
  state.counters["raw_p99_us"] = counter(nearest_rank(s.raw_us, 0.99), counter::kDefaults);
  state.counters["runner_p99_us"] = counter(nearest_rank(s.runner_us, 0.99), counter::kDefaults);
  state.counters["calls"] = counter(static_cast<double>(s.raw_us.size()), counter::kDefaults);
  return m;
}

//! One host-time part: the counter it sets, and one call of it.
using host_part = std::pair<const char*, std::function<void()>>;

//! Sets, for each part, its counter to the mean host time of one call in microseconds, over
//! batches of `batch_calls` calls, one batch per part in each iteration, with `settle()` (not
//! timed: a device synchronisation, say) before each batch. Plain values, per call already.
template <class Settle>
void time_host_parts(benchmark::State& state, const std::vector<host_part>& parts,
                     Settle&& settle, int batch_calls = 100) {
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
    state.counters[parts[p].first] =
        benchmark::Counter(calls > 0 ? total_us[p] / calls : 0.0, benchmark::Counter::kDefaults);
  }
}

}  // namespace torchloom_bench
