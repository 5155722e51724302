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
// its own, so the medians and the p99s are per call. As in bm_aoti, the raw calls of
// BM_paired_torchscript go to the runner's own loaded module: both sides run the same graph
// on the same weights, so what differs is the runner's code alone. Two loads of one file differ
// in where their weights and plans land; two diagnostics (no target) show by how much:
// BM_paired_torchscript_two_loads_only times the runner against a module loaded apart (as the
// user's own load would be), and BM_paired_torchscript_raw_vs_raw_only the raw call on that
// module against the raw call on the runner's, with no runner code on either side.
#include <torchloom/torchloom.hpp>

#include "bench/support/fixtures.hpp"
#include "bench/support/registration.hpp"
#include "bench/support/timing.hpp"

#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchloom_bench {
namespace {

using runner_type = torchloom::model_runner<torchloom::torchscript_loader>;

constexpr int warmup_calls = 5;             // untimed calls before each timed loop
constexpr int repetitions = 30;
constexpr double min_time_s = 0.1;  // per repetition
// BM_paired_*: calls per side and repetition. Fixed, so every repetition has the same number
// of samples; the median moves by well under 1% between repetitions at these counts, and the
// whole binary stays within about a minute on the GPU machine.
constexpr benchmark::IterationCount paired_calls_cpu = 20000;
constexpr benchmark::IterationCount paired_calls_cuda = 5000;
constexpr int paired_repetitions = 3;  // enough to show the ratio's spread

// The process's models, one per device. Cleared by main() before it returns.
per_device<torch::jit::Module> raw_modules;
per_device<runner_type> runners;

// What a user writes by hand: load on the device, switch to eval mode.
torch::jit::Module& raw_module(c10::Device device) {
  return raw_modules.get(device, [](c10::Device d) {
    const auto file = std::filesystem::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt";
    auto m = std::make_unique<torch::jit::Module>(torch::jit::load(file.string(), d));
    m->eval();
    return m;
  });
}

runner_type& runner(c10::Device device) {
  return runners.get(device, [](c10::Device d) {
    return std::make_unique<runner_type>(
        torchloom::model_spec::from_directory(TORCHLOOM_BUNDLED_MODEL_DIR), d);
  });
}

// One hand-written call, as the runner makes it: InferenceMode per call, inputs copied
// (forward takes its vector by value).
c10::IValue raw_call(torch::jit::Module& m, const std::vector<c10::IValue>& inputs) {
  c10::InferenceMode inference;
  return m.forward(inputs);
}

// Random inputs already on the device (never zeros: PERF.md), the same on both sides.
std::vector<c10::IValue> make_inputs(c10::Device device, std::int64_t batch) {
  return {bundled_input(device, batch)};
}

void bm_raw_torchscript(benchmark::State& state, std::int64_t device_arg, std::int64_t batch) {
  const c10::Device device = device_for(device_arg);
  if (device_missing(state, device)) return;
  torch::jit::Module& m = raw_module(device);
  const std::vector<c10::IValue> inputs = make_inputs(device, batch);
  const auto call = [&] {
    c10::IValue out = raw_call(m, inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  };
  warm_up(warmup_calls, call);
  time_each_iteration(state, call);
}

// Only time the runner when it computes what the hand-written call computes.
bool same_output(benchmark::State& state, c10::Device device, runner_type& r,
                 const std::vector<c10::IValue>& inputs) {
  const at::Tensor expected = raw_call(raw_module(device), inputs).toTensor();
  const std::vector<at::Tensor> got = r.run(inputs);
  sync(device);
  if (got.size() != 1 || !torch::equal(got.front(), expected)) {
    state.SkipWithError("runner output differs from the raw TorchScript output");
    return false;
  }
  return true;
}

void bm_runner_torchscript(benchmark::State& state, std::int64_t device_arg,
                           std::int64_t batch) {
  const c10::Device device = device_for(device_arg);
  if (device_missing(state, device)) return;
  runner_type& r = runner(device);
  const std::vector<c10::IValue> inputs = make_inputs(device, batch);
  const auto call = [&] {
    std::vector<at::Tensor> out = r.run(inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  };
  warm_up(warmup_calls, call);
  if (!same_output(state, device, r, inputs)) return;
  time_each_iteration(state, call);
}

// What a paired benchmark puts side by side (see the top of the file).
enum class pairing {
  runner,           // T1: the raw call on the runner's own module, and the runner
  two_loads,        // the raw call on a module loaded apart, and the runner
  raw_vs_raw,       // the raw call on a module loaded apart, and on the runner's module
};

// One repetition of a paired measurement: max_iterations calls of each side, interleaved
// (time_paired), each timed on its own.
void bm_paired_torchscript(benchmark::State& state, std::int64_t device_arg, std::int64_t batch,
                           pairing what) {
  const c10::Device device = device_for(device_arg);
  if (device_missing(state, device)) return;
  runner_type& r = runner(device);
  // A handle to the runner's module (torch::jit::Module is one), not a copy of it.
  torch::jit::Module own = r.model().module;
  torch::jit::Module& m = what == pairing::runner ? own : raw_module(device);
  const std::vector<c10::IValue> inputs = make_inputs(device, batch);
  const auto raw_once = [&] {
    c10::IValue out = raw_call(m, inputs);
    sync(device);
    benchmark::DoNotOptimize(out);
  };
  const auto runner_once = [&] {
    if (what == pairing::raw_vs_raw) {
      c10::IValue out = raw_call(own, inputs);
      sync(device);
      benchmark::DoNotOptimize(out);
    } else {
      std::vector<at::Tensor> out = r.run(inputs);
      sync(device);
      benchmark::DoNotOptimize(out);
    }
  };
  warm_up(warmup_calls, [&] {
    raw_once();
    runner_once();
  });
  if (!same_output(state, device, r, inputs)) return;
  paired_samples samples = time_paired(state, raw_once, runner_once);
  set_paired_counters(state, samples);
}

// Without a device a benchmark only reports its skip: once, not once per repetition.
bool runnable(std::int64_t device_arg) { return device_arg == 0 || torch::cuda::is_available(); }

// Names pair up in the report: BM_raw_<x>/<suffix> with BM_runner_<x>/<suffix>; the report's
// "T1 paired" table reads BM_paired_<x>/<suffix>.
void register_benchmarks() {
  for (const std::int64_t device_arg : {0, 1}) {
    const std::string device_name = device_arg == 0 ? "cpu" : "cuda:0";
    const bool can = runnable(device_arg);
    for (const std::int64_t batch : {1, 32}) {
      const std::string suffix =
          "/device:" + device_name + "/batch:" + std::to_string(batch);
      for (const auto& [name, fn] : {std::pair{"BM_raw_torchscript", &bm_raw_torchscript},
                                     std::pair{"BM_runner_torchscript", &bm_runner_torchscript}}) {
        auto* b = benchmark::RegisterBenchmark((name + suffix).c_str(), fn, device_arg, batch);
        with_p99(b->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(min_time_s),
                 can ? repetitions : 1);
      }
      for (const auto& [name, what] :
           {std::pair{"BM_paired_torchscript", pairing::runner},
            std::pair{"BM_paired_torchscript_two_loads_only", pairing::two_loads},
            std::pair{"BM_paired_torchscript_raw_vs_raw_only", pairing::raw_vs_raw}}) {
        auto* b = benchmark::RegisterBenchmark((name + suffix).c_str(), bm_paired_torchscript,
                                               device_arg, batch, what);
        with_spread(b->Unit(benchmark::kMicrosecond)
                        ->UseRealTime()
                        ->Iterations(device_arg == 0 ? paired_calls_cpu : paired_calls_cuda),
                    can ? paired_repetitions : 1);
      }
    }
  }
}

// What the benchmarks kept for the whole run, released before CUDA's own teardown at exit.
void teardown() {
  runners.clear();
  raw_modules.clear();
}

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_benchmarks, teardown)
