// T1 and T10 (PERF.md) for AOTInductor packages: the per-call cost of
// model_runner<aoti_loader> (no_hook, caller_stream, resident_weights) against the call a user
// writes by hand, `AOTIModelPackageLoader::run(inputs, stream)`, and the runner's construction
// against the package loader's, on the MLP packages scripts/make_aoti_fixtures.py makes
// (mlp_cpu, mlp_cuda). Same method as bm_overhead: BM_raw_aoti and BM_runner_aoti timed
// separately, and BM_paired_aoti, which decides T1 (BM_paired_aoti_boxed_*_only: diagnostics).
// BM_*_aoti_load and BM_paired_aoti_load: T10. BM_*_aoti_threads: calls per second from 1, 4
// and 8 threads on streams of their own. With a LibTorch older than 2.6 nothing is registered.
#include "bench/support/models.hpp"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdio>

#if TORCHLOOM_TORCH_VERSION >= 20600

namespace torchloom_bench {
namespace {

using runner_type = torchloom::model_runner<torchloom::aoti_loader>;

// Construction extracts the package, loads its library and its weights: tens of ms.
constexpr benchmark::IterationCount load_iterations = 3;
constexpr int load_repetitions = 10;
constexpr benchmark::IterationCount paired_load_iterations = 20;
constexpr int paired_load_repetitions = 5;

constexpr fixtures aoti_fixtures{"TORCHLOOM_AOTI_FIXTURES", TORCHLOOM_AOTI_FIXTURE_DIR};

const char* package(c10::Device device) { return device.is_cuda() ? "mlp_cuda" : "mlp_cpu"; }

// Why the benchmarks on `device` cannot run here (no device, no package), or "".
std::string missing(c10::Device device) {
  if (auto why = no_device(device); !why.empty()) return why;
  return aoti_fixtures.missing(package(device), "model.pt2", "scripts/make_aoti_fixtures.py");
}

// What a user writes by hand: the package on the runner's device, one call at a time.
std::unique_ptr<package_loader> make_raw(c10::Device device) {
  return load_package(aoti_fixtures.dir(package(device)) / "1" / "model.pt2", device, "bm_aoti");
}

std::unique_ptr<runner_type> make_runner(c10::Device device) {
  return std::make_unique<runner_type>(
      torchloom::model_spec::from_directory(aoti_fixtures.dir(package(device))), device);
}

// The process's loaded packages, one per device, kept for the whole run.
per_device<package_loader> raw_package(make_raw);
per_device<runner_type> runner(make_runner);

// Only time the runner when it computes what the hand-written call computes.
bool same_outputs(benchmark::State& state, c10::Device device,
                  const std::vector<at::Tensor>& tensors) {
  const auto expected = raw_call(raw_package(device), tensors, device);
  const auto got = runner(device).run(std::vector<c10::IValue>(tensors.begin(), tensors.end()));
  sync(device);
  if (got.size() == expected.size() && torch::equal(got.front(), expected.front())) return true;
  state.SkipWithError("runner output differs from the raw AOTI output");
  return false;
}

void bm_separate(benchmark::State& state, std::int64_t device_arg, std::int64_t batch,
                 bool is_runner) {
  const c10::Device device = device_for(device_arg);
  if (skip_if(state, missing(device))) return;
  if (!is_runner) {
    package_loader& p = raw_package(device);
    const std::vector<at::Tensor> tensors{bundled_input(device, batch)};
    time_separately(
        state, [&] { call_synced(device, [&] { return raw_call(p, tensors, device); }); },
        [] { return true; });
    return;
  }
  runner_type& r = runner(device);
  const std::vector<at::Tensor> tensors{bundled_input(device, batch)};
  time_separately(
      state, [&] { call_synced(device, [&] { return r.run_tensors(tensors); }); },
      [&] { return same_outputs(state, device, tensors); });
}

// The second arm: the runner's run_tensors() (T1), or, as diagnostics that split the cost,
// the runner's boxed run() (IValues in and out) or the loader's boxed run() alone.
enum class second_arm { run_tensors, boxed_run, boxed_loader };

void bm_paired(benchmark::State& state, std::int64_t device_arg, std::int64_t batch,
               second_arm arm) {
  const c10::Device device = device_for(device_arg);
  if (skip_if(state, missing(device))) return;
  runner_type& r = runner(device);
  // The raw calls go to the runner's own loaded package, so both sides run the same code
  // and constants (two loads of one package differ in where they land).
  package_loader& p = *r.model().package;
  const std::vector<at::Tensor> tensors{bundled_input(device, batch)};
  const std::vector<c10::IValue> inputs(tensors.begin(), tensors.end());
  const torchloom::aoti_loader loader;
  auto& model = const_cast<torchloom::aoti_model&>(r.model());
  const c10::Stream stream = device.is_cuda()
                                 ? c10::impl::getDeviceGuardImpl(device.type())->getStream(device)
                                 : c10::Stream(c10::Stream::DEFAULT, device);
  time_paired_checked(
      state, [&] { call_synced(device, [&] { return raw_call(p, tensors, device); }); },
      [&] {
        if (arm == second_arm::run_tensors) {
          call_synced(device, [&] { return r.run_tensors(tensors); });
        } else if (arm == second_arm::boxed_loader) {
          c10::InferenceMode inference;
          std::vector<c10::IValue> in(inputs);
          call_synced(device, [&] {
            return loader.run(model, std::move(in), torchloom::run_context{device, stream});
          });
        } else {
          call_synced(device, [&] { return r.run(inputs); });
        }
      },
      [&] { return same_outputs(state, device, tensors); });
}

// Calls per second from several threads at once, each on a pool stream of its own, as a
// server's request threads call: the runner (AOTI_NUM_RUNNERS=1: torch's single-threaded
// runner behind a lock held for the launch only) against the package loader a user writes
// by hand with one runner (torch's threaded container, which waits on the host for the
// previous call's GPU work before it takes the next). Each thread waits for its stream at the
// end, so the count is of finished calls.
template <bool Runner>
void bm_aoti_threads(benchmark::State& state, std::int64_t batch) {
  const c10::Device device = gpu;
  if (skip_if(state, missing(device))) return;
  const c10::Stream stream =
      c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
  const c10::StreamGuard on(stream);
  const std::vector<at::Tensor> tensors{bundled_input(device, batch)};
  const auto call = [&] {
    if constexpr (Runner) {
      benchmark::DoNotOptimize(runner(device).run_tensors(tensors));
    } else {
      benchmark::DoNotOptimize(raw_call(raw_package(device), tensors, device));
    }
  };
  warm_up(t1_warmup_calls, call);
  stream.synchronize();
  for (auto _ : state) call();
  stream.synchronize();
  state.SetItemsProcessed(state.iterations());
}

// T10: construction and destruction of the package loader a user writes by hand, against the
// runner's (model spec, options, file check, load, input signature). One untimed round first:
// the first load in a process pays for torch's and CUDA's own start-up.
template <auto Make>
void bm_aoti_load(benchmark::State& state, std::int64_t device_arg) {
  const c10::Device device = device_for(device_arg);
  if (skip_if(state, missing(device))) return;
  Make(device).reset();
  for (auto _ : state) {
    auto made = Make(device);
    benchmark::DoNotOptimize(made.get());
    made.reset();
  }
}

// T10, paired: a raw load and a runner's load alternate, so both share the machine's drift
// (loads take milliseconds and vary run to run).
void bm_paired_aoti_load(benchmark::State& state, std::int64_t device_arg) {
  const c10::Device device = device_for(device_arg);
  if (skip_if(state, missing(device))) return;
  const auto raw_once = [&] { benchmark::DoNotOptimize(make_raw(device).get()); };
  const auto runner_once = [&] { benchmark::DoNotOptimize(make_runner(device).get()); };
  raw_once();
  runner_once();
  time_paired(state, raw_once, runner_once);
}

void register_benchmarks() {
  for (const std::int64_t device_arg : {0, 1}) {
    const std::string device = std::string("/device:") + (device_arg == 0 ? "cpu" : "cuda:0");
    // Without the device or the package each benchmark only reports its skip, once.
    const bool can = missing(device_for(device_arg)).empty();
    register_t1("aoti", device_arg, can, bm_separate, bm_paired,
                {std::pair{"BM_paired_aoti", second_arm::run_tensors},
                 std::pair{"BM_paired_aoti_boxed_run_only", second_arm::boxed_run},
                 std::pair{"BM_paired_aoti_boxed_loader_only", second_arm::boxed_loader}});
    for (const auto& [name, fn] : {std::pair{"BM_raw_aoti_load", &bm_aoti_load<make_raw>},
                                   std::pair{"BM_runner_aoti_load", &bm_aoti_load<make_runner>}}) {
      auto* b = benchmark::RegisterBenchmark((name + device).c_str(), fn, device_arg);
      with_p99(b->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(load_iterations),
               can ? load_repetitions : 1);
    }
    auto* b = benchmark::RegisterBenchmark(("BM_paired_aoti_load" + device).c_str(),
                                           bm_paired_aoti_load, device_arg);
    with_spread(b->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(paired_load_iterations),
                can ? paired_load_repetitions : 1);
  }
  // Made before the threads start: the benchmarks' threads share them.
  const bool can_cuda = missing(gpu).empty();
  if (can_cuda) {
    (void)raw_package(gpu);
    (void)runner(gpu);
  }
  for (const int threads : {1, 4, 8}) {
    for (const auto& [name, fn] : {std::pair{"BM_raw_aoti_threads", &bm_aoti_threads<false>},
                                   std::pair{"BM_runner_aoti_threads", &bm_aoti_threads<true>}}) {
      auto* b = benchmark::RegisterBenchmark(
          (std::string(name) + "/device:cuda:0/batch:256").c_str(), fn, std::int64_t{256});
      with_p99(b->Unit(benchmark::kMicrosecond)->UseRealTime()->Threads(threads)->MinTime(0.2),
               can_cuda ? 5 : 1);
    }
  }
}

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_benchmarks)

#else

// No AOTInductor before LibTorch 2.6: nothing to measure, and no result file, so the report
// has no empty table.
int main() {
  std::puts("bm_aoti: AOTInductor packages need LibTorch >= 2.6; nothing to run");
  return 0;
}

#endif
