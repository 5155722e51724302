// T1 (PERF.md): the per-call cost of model_runner<torchscript_loader> (no_hook, caller_stream,
// resident_weights) against the LibTorch call a user would write by hand, on the bundled tiny
// MLP, on CPU and on cuda:0, side by side in one run.
//
// BM_raw_torchscript and BM_runner_torchscript are timed separately, registered next to each
// other; the models are loaded once per device and kept (a load, or a fresh profiling executor,
// is not what T1 measures). The two differ by more than T1's 2% between runs of one binary
// (clocks, caches, other tenants), so BM_paired_torchscript decides T1: its raw calls go to the
// runner's own loaded module, so both sides run the same graph on the same weights. Two loads of
// one file differ in where their weights and plans land; two diagnostics (no target) show by
// how much: *_two_loads_only times the runner against a module loaded apart (as the user's own
// load would be), *_raw_vs_raw_only the raw call on that module against the raw call on the
// runner's, with no runner code on either side.
#include "bench/support/models.hpp"

namespace torchloom_bench {
namespace {

using runner_type = torchloom::model_runner<torchloom::torchscript_loader>;

// The process's models, one per device.
per_device<torch::jit::Module> raw_module([](c10::Device d) {
  return std::make_unique<torch::jit::Module>(load_module(bundled_file(), d));
});
per_device<runner_type> runner([](c10::Device d) {
  return std::make_unique<runner_type>(bundled_spec(), d);
});

// Only time the runner when it computes what the hand-written call computes.
bool same_output(benchmark::State& state, c10::Device device, runner_type& r,
                 const std::vector<c10::IValue>& inputs) {
  const at::Tensor expected = raw_call(raw_module(device), inputs).toTensor();
  const std::vector<at::Tensor> got = r.run(inputs);
  sync(device);
  if (got.size() == 1 && torch::equal(got.front(), expected)) return true;
  state.SkipWithError("runner output differs from the raw TorchScript output");
  return false;
}

void bm_separate(benchmark::State& state, std::int64_t device_arg, std::int64_t batch,
                 bool is_runner) {
  const c10::Device device = device_for(device_arg);
  if (skip_if(state, no_device(device))) return;
  if (!is_runner) {
    torch::jit::Module& m = raw_module(device);
    const std::vector<c10::IValue> inputs{bundled_input(device, batch)};
    time_separately(
        state, [&] { call_synced(device, [&] { return raw_call(m, inputs); }); },
        [] { return true; });
    return;
  }
  runner_type& r = runner(device);
  const std::vector<c10::IValue> inputs{bundled_input(device, batch)};
  time_separately(
      state, [&] { call_synced(device, [&] { return r.run(inputs); }); },
      [&] { return same_output(state, device, r, inputs); });
}

// What a paired benchmark puts side by side (see the top of the file).
enum class pairing {
  t1,          // T1: the raw call on the runner's own module, and the runner
  two_loads,   // the raw call on a module loaded apart, and the runner
  raw_vs_raw,  // the raw call on a module loaded apart, and on the runner's module
};

void bm_paired(benchmark::State& state, std::int64_t device_arg, std::int64_t batch, pairing what) {
  const c10::Device device = device_for(device_arg);
  if (skip_if(state, no_device(device))) return;
  runner_type& r = runner(device);
  // A handle to the runner's module (torch::jit::Module is one), not a copy of it.
  torch::jit::Module own = r.model().module;
  torch::jit::Module& m = what == pairing::t1 ? own : raw_module(device);
  const std::vector<c10::IValue> inputs{bundled_input(device, batch)};
  time_paired_checked(
      state, [&] { call_synced(device, [&] { return raw_call(m, inputs); }); },
      [&] {
        if (what == pairing::raw_vs_raw) {
          call_synced(device, [&] { return raw_call(own, inputs); });
        } else {
          call_synced(device, [&] { return r.run(inputs); });
        }
      },
      [&] { return same_output(state, device, r, inputs); });
}

void register_benchmarks() {
  for (const std::int64_t device_arg : {0, 1}) {
    register_t1("torchscript", device_arg, no_device(device_for(device_arg)).empty(), bm_separate,
                bm_paired,
                {std::pair{"BM_paired_torchscript", pairing::t1},
                 std::pair{"BM_paired_torchscript_two_loads_only", pairing::two_loads},
                 std::pair{"BM_paired_torchscript_raw_vs_raw_only", pairing::raw_vs_raw}});
  }
}

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_benchmarks)
