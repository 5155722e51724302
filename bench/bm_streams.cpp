// T2 (PERF.md): the per-call cost of the fenced stream policies (pool_stream, adaptive_stream,
// green_context_stream) over caller_stream, on the bundled tiny MLP at batch 8 on cuda:0.
//
// Every repetition of BM_<policy> measures the policy's runner and a caller_stream runner of
// the same model side by side, alternating blocks of calls, so both see the same drift and the
// delta is taken within one repetition. Per call it measures:
//  - CPU time: the host time of run() alone (the output is destroyed inside the timed region,
//    since freeing a tensor that crossed streams is part of a fenced policy's cost). No device
//    sync inside the timed region; the caller's stream is synchronised every `block_calls`
//    calls, outside it.
//  - GPU time: CUDA events on the caller's stream before and after run(), the stream held
//    until run() has enqueued everything (event_timer::gated_us).
// Each policy's output is checked bitwise against caller_stream's before it is timed.
#include "bench/support/models.hpp"

#if TORCHLOOM_HAS_CUDA
#include "bench/support/cuda.hpp"
#endif

#include <type_traits>

namespace torchloom_bench {
namespace {

#if TORCHLOOM_HAS_CUDA

constexpr std::int64_t batch = 8;
// Above the pool's 32 streams per priority, so every pool stream has run the model (and has
// its allocator blocks) before anything is timed.
constexpr int process_warmup_calls = 100;
constexpr int repetition_warmup_calls = 16;  // per side, before each repetition's samples
constexpr int block_calls = 64;              // CPU samples per block; sync between blocks
constexpr int cpu_blocks = 8;                // per side and repetition: 512 CPU samples
constexpr int gpu_samples = 64;              // per side and repetition
constexpr int repetitions = 30;

template <class S>
using runner_type = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, S>;

// The runner for policy S, built on first use and kept (a load and the executor's profiling
// runs are not what T2 measures); nullptr (and `error` set) when it cannot be built.
template <class S>
runner_type<S>* runner(std::string& error) {
  static built_once<runner_type<S>> slot;
  return slot.get(error, [](std::optional<runner_type<S>>& r) {
    auto spec = bundled_spec();
#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
    // About half an H100.
    if constexpr (std::is_same_v<S, torchloom::green_context_stream>) {
      spec.set("GREEN_CONTEXT_SM_COUNT", "64");
    }
#endif
    r.emplace(std::move(spec), gpu);
    const std::vector<c10::IValue> inputs{bundled_input(gpu, batch)};
    for (int i = 0; i < process_warmup_calls; ++i) r->run(inputs);
    sync_current_stream();
  });
}

// A non-default stream for the "caller on its own stream" case, the same for every call.
c10::cuda::CUDAStream side_stream() {
  static const c10::cuda::CUDAStream s = c10::cuda::getStreamFromPool(false, 0);
  return s;
}

// One call, its output destroyed.
template <class R>
void run_once(R& r, const std::vector<c10::IValue>& inputs) {
  benchmark::DoNotOptimize(r.run(inputs));
}

// `block_calls` calls, each timed on the host alone; then the stream is drained, untimed.
template <class R>
void time_cpu_block(R& r, const std::vector<c10::IValue>& inputs, std::vector<double>& us) {
  for (int i = 0; i < block_calls; ++i) us.push_back(time_call_us([&] { run_once(r, inputs); }));
  sync_current_stream();
}

struct samples {
  std::vector<double> cpu_us;
  std::vector<double> gpu_us;
};

// One benchmark per policy S. `caller_on_side_stream`: the caller runs on a non-default stream
// (for adaptive_stream, which then stays on it). For S = caller_stream there is only one side.
template <class S>
void bm_policy(benchmark::State& state, bool caller_on_side_stream) {
  if (skip_if(state, no_device(gpu))) return;
  constexpr bool paired = !std::is_same_v<S, torchloom::caller_stream>;
  std::string error;
  auto* base = runner<torchloom::caller_stream>(error);
  if (skip_if(state, base == nullptr ? "caller_stream runner: " + error : "")) return;
  auto* policy = runner<S>(error);
  if (skip_if(state, policy == nullptr ? "policy runner: " + error : "")) return;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (caller_on_side_stream) guard.emplace(side_stream());
  guarded(state, [&] {
    const std::vector<c10::IValue> inputs{bundled_input(gpu, batch)};
    if constexpr (paired) {
      // Only time the policy when it computes what caller_stream computes, bit for bit.
      const at::Tensor expected = base->run(inputs).at(0).cpu();
      const at::Tensor got = policy->run(inputs).at(0).cpu();
      if (!torch::equal(got, expected)) {
        state.SkipWithError("policy output differs from the caller_stream output");
        return;
      }
    }
    for (int i = 0; i < repetition_warmup_calls; ++i) {
      base->run(inputs);
      if constexpr (paired) policy->run(inputs);
    }
    sync_current_stream();
    event_timer events;
    const auto time_gpu_call = [&](auto& r) {
      return events.gated_us(
          current_stream(), [&] { run_once(r, inputs); },
          "run() waited for the device while its stream was held");
    };
    samples b;
    samples p;
    for (auto _ : state) {
      for (int blk = 0; blk < cpu_blocks; ++blk) {
        // Alternate which side goes first, so neither always follows a sync.
        if (!paired || blk % 2 == 0) {
          time_cpu_block(*base, inputs, b.cpu_us);
          if constexpr (paired) time_cpu_block(*policy, inputs, p.cpu_us);
        } else {
          time_cpu_block(*policy, inputs, p.cpu_us);
          time_cpu_block(*base, inputs, b.cpu_us);
        }
      }
      for (int i = 0; i < gpu_samples; ++i) {
        b.gpu_us.push_back(time_gpu_call(*base));
        if constexpr (paired) p.gpu_us.push_back(time_gpu_call(*policy));
      }
      state.SetIterationTime(median(paired ? p.cpu_us : b.cpu_us) * 1e-6);
    }
    const samples& shown = paired ? p : b;
    set_counters(state, {{"cpu_us_median", median(shown.cpu_us)},
                         {"cpu_us_p99", p99(shown.cpu_us)},
                         {"gpu_us_median", median(shown.gpu_us)},
                         {"gpu_us_p99", p99(shown.gpu_us)}});
    if constexpr (paired) {
      set_counters(state, {{"caller_cpu_us_median", median(b.cpu_us)},
                           {"caller_gpu_us_median", median(b.gpu_us)},
                           {"cpu_us_delta", median(p.cpu_us) - median(b.cpu_us)},
                           {"gpu_us_delta", median(p.gpu_us) - median(b.gpu_us)}});
    }
  });
}

// For reference, not a target: where a fenced run's extra host time goes (T2's CPU delta), per
// operation: the pieces run_fenced adds to a caller_stream run (recording an event, making a
// stream wait for one, recording a caller's tensor on its own stream, switching the current
// stream and back), the allocator's cost of an output made on the pool stream when it is
// recorded on the caller's stream before it is freed (an event recorded at the free, queried
// by later allocations) against one that is not, and whole runs of the caller_stream and
// pool_stream runners, outputs freed.
void bm_fence_host_parts(benchmark::State& state) {
  if (skip_if(state, no_device(gpu))) return;
  std::string error;
  auto* caller_runner = runner<torchloom::caller_stream>(error);
  auto* pool_runner = caller_runner != nullptr ? runner<torchloom::pool_stream>(error) : nullptr;
  if (skip_if(state, pool_runner == nullptr ? error : "")) return;
  guarded(state, [&] {
    const auto* impl = c10::impl::getDeviceGuardImpl(gpu.type());
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(0);
    const c10::cuda::CUDAStream work = c10::cuda::getStreamFromPool(false, 0);
    const std::vector<c10::IValue> inputs{bundled_input(gpu, batch)};
    const at::Tensor mine = torch::empty({batch, 16}, torch::TensorOptions().device(gpu));
    const auto options = mine.options();
    const torchloom::cuda::event ev("bm_fence_host_parts");
    const auto made_on_work = [&] {
      const c10::cuda::CUDAStreamGuard on_work(work);
      return at::empty({batch, 16}, options);
    };
    const std::vector<host_part> parts = {
        {"event_record_us",
         [&] { check_cuda(cudaEventRecord(ev.get(), caller.stream()), "cudaEventRecord"); }},
        {"stream_wait_us",
         [&] {
           check_cuda(cudaStreamWaitEvent(work.stream(), ev.get(), 0), "cudaStreamWaitEvent");
         }},
        {"record_own_stream_us",
         [&] { impl->recordDataPtrOnStream(mine.storage().data_ptr(), caller.unwrap()); }},
        {"stream_switch_us", [&] { const c10::StreamGuard on_work(work.unwrap()); }},
        {"output_plain_us", [&] { benchmark::DoNotOptimize(made_on_work()); }},
        {"output_crossing_us",
         [&] {
           const at::Tensor out = made_on_work();
           impl->recordDataPtrOnStream(out.storage().data_ptr(), caller.unwrap());
         }},
        {"caller_run_us", [&] { run_once(*caller_runner, inputs); }},
        {"pool_run_us", [&] { run_once(*pool_runner, inputs); }},
    };
    time_host_parts(state, parts, [&] {
      sync_current_stream();
      check_cuda(cudaStreamSynchronize(work.stream()), "cudaStreamSynchronize");
    });
    torch::cuda::synchronize(0);
  });
}

// For reference, not a target: the GPU cost of a fenced hop, stream by stream, without
// torchloom. A caller stream and 16 work streams, created in a row; for each work stream, the
// device time between events on the caller's stream of three small kernels run on the work
// stream behind an event wait both ways (as run_fenced does), gated as a policy's GPU time is,
// less the same kernels run on the caller's stream. Counters: base_us, hop_<k>_us (the median
// extra per work stream) and slow_streams (those over 1 µs). Which streams are slow is fixed
// for the life of the process and depends on the hardware queue each stream was given
// (CUDA_DEVICE_MAX_CONNECTIONS), so a policy's GPU delta depends on the stream it got.
void bm_stream_hops(benchmark::State& state) {
  if (skip_if(state, no_device(gpu))) return;
  constexpr int work_streams = 16;
  constexpr int hop_samples = 100;
  guarded(state, [&] {
    const auto new_stream = [] {
      cudaStream_t s = nullptr;
      check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      return torchloom::cuda::owned_stream(s);
    };
    const torchloom::cuda::owned_stream caller_stream = new_stream();
    const cudaStream_t caller = caller_stream.get();
    std::vector<torchloom::cuda::owned_stream> work;
    for (int k = 0; k < work_streams; ++k) work.push_back(new_stream());
    const torchloom::cuda::event before("bm_stream_hops");
    const torchloom::cuda::event after("bm_stream_hops");
    const at::Tensor x = torch::zeros({64}, torch::TensorOptions().device(gpu));
    torch::cuda::synchronize(0);
    event_timer events;
    const auto kernels_on = [&](cudaStream_t s) {
      const c10::cuda::CUDAStreamGuard on(c10::cuda::getStreamFromExternal(s, 0));
      for (int k = 0; k < 3; ++k) x.add_(1.0);
    };
    // One gated sample: the hop through `w`, or the kernels on the caller's stream alone.
    const auto sample_us = [&](cudaStream_t w) {
      return events.gated_us(
          caller,
          [&] {
            if (w == nullptr) {
              kernels_on(caller);
            } else {
              check_cuda(cudaEventRecord(before.get(), caller), "cudaEventRecord");
              check_cuda(cudaStreamWaitEvent(w, before.get(), 0), "cudaStreamWaitEvent");
              kernels_on(w);
              check_cuda(cudaEventRecord(after.get(), w), "cudaEventRecord");
              check_cuda(cudaStreamWaitEvent(caller, after.get(), 0), "cudaStreamWaitEvent");
            }
          },
          "the gate timed out");
    };
    // The kernels' first launches, ungated: CUDA may load a kernel's module on its first
    // launch, which waits for streams a host function holds.
    kernels_on(caller);
    for (const auto& w : work) kernels_on(w.get());
    torch::cuda::synchronize(0);
    const auto median_us = [&](cudaStream_t w) {
      std::vector<double> v;
      for (int i = 0; i < hop_samples + 10; ++i) {
        const double us = sample_us(w);
        if (i >= 10) v.push_back(us);
      }
      return median(v);
    };
    for (auto _ : state) {
      const double base = median_us(nullptr);
      state.counters["base_us"] = base;
      int slow = 0;
      for (int k = 0; k < work_streams; ++k) {
        const double extra = median_us(work[static_cast<std::size_t>(k)].get()) - base;
        slow += extra > 1.0 ? 1 : 0;
        state.counters[(k < 10 ? "hop_0" : "hop_") + std::to_string(k) + "_us"] = extra;
      }
      state.counters["slow_streams"] = slow;
    }
    (void)cudaDeviceSynchronize();
  });
}

template <class Fn, class... Args>
void register_one(const char* name, bool runnable, Fn fn, Args... args) {
  // Without a device the benchmark only reports its skip: once, not once per repetition.
  runnable = runnable && torch::cuda::is_available();
  benchmark::RegisterBenchmark(name, fn, args...)
      ->Unit(benchmark::kMicrosecond)
      ->UseManualTime()
      ->Iterations(1)
      ->Repetitions(runnable ? repetitions : 1)
      ->DisplayAggregatesOnly(true);
}

void register_benchmarks() {
  using namespace torchloom;
  register_one("BM_caller_stream", true, bm_policy<caller_stream>, false);
  register_one("BM_pool_stream", true, bm_policy<pool_stream>, false);
  register_one("BM_adaptive_stream", true, bm_policy<adaptive_stream>, false);
  register_one("BM_adaptive_stream_nondefault", true, bm_policy<adaptive_stream>, true);
#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
  register_one("BM_green_context_stream", true, bm_policy<green_context_stream>, false);
#else
  register_one("BM_green_context_stream", false, skip_with(no_green_context));
#endif
  register_once("BM_stream_hops", 1, bm_stream_hops);
  register_once("BM_fence_host_parts", 20, bm_fence_host_parts);
}

#else  // !TORCHLOOM_HAS_CUDA

void register_benchmarks() {
  benchmark::RegisterBenchmark("BM_streams", skip_with("built without CUDA"));
}

#endif

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_benchmarks)
