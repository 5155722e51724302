#pragma once
// How the benchmarks are registered and run: the repetitions and the aggregates
// scripts/report.py reads, and the program's main.
#include "stats.hpp"

#include <benchmark/benchmark.h>

namespace torchloom_bench {

//! A separately timed benchmark: `repetitions` repetitions, reported as their aggregates only,
//! the median (built in) and the p99. A benchmark that cannot run here (no device, no model)
//! is given 1, so that it reports its skip once, not once per repetition.
template <class Benchmark>
Benchmark* with_p99(Benchmark* b, int repetitions) {
  return b->Repetitions(repetitions)->DisplayAggregatesOnly(true)->ComputeStatistics("p99", p99);
}

//! A paired benchmark, whose counters are its result: the min and max aggregates give the
//! report the ratio's spread over the repetitions (the median aggregate is built in).
template <class Benchmark>
Benchmark* with_spread(Benchmark* b, int repetitions) {
  return b->Repetitions(repetitions)
      ->DisplayAggregatesOnly(true)
      ->ComputeStatistics("min", min_of)
      ->ComputeStatistics("max", max_of);
}

//! A benchmark program's main: Google Benchmark's flags, `register_benchmarks()`, the runs
//! the flags select, then `teardown()` (what the benchmarks kept for the whole run, released
//! before the CUDA runtime's own teardown at exit).
template <class Register, class Teardown>
int run_main(int argc, char** argv, Register&& register_benchmarks, Teardown&& teardown) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  teardown();
  benchmark::Shutdown();
  return 0;
}

}  // namespace torchloom_bench

//! Defines main() for a benchmark program (as BENCHMARK_MAIN does): run_main with the
//! functions `register_fn` and `teardown_fn` of namespace torchloom_bench.
#define TORCHLOOM_BENCH_MAIN(register_fn, teardown_fn)                                 \
  int main(int argc, char** argv) {                                                   \
    return ::torchloom_bench::run_main(argc, argv, ::torchloom_bench::register_fn,    \
                                       ::torchloom_bench::teardown_fn);               \
  }
