// T3 (PERF.md): a latency-sensitive victim's p99 under a saturating co-tenant in the same
// process, with and without green contexts.
//
// Victim: a TorchScript MLP of 4 fp32 linear layers of 2048 (ReLU between), batch 64 on cuda:0:
// tens of µs on a whole H100, a few hundred on 16 SMs. Each call is run() then a sync of the
// victim's stream, timed with steady_clock. Co-tenant: a thread in the same process issuing
// bf16 8192x8192 GEMMs back to back, at most `cotenant_queue_depth` ahead of the device (so the
// device never drains and the queue never grows). Each scenario measures its own victim alone,
// then beside its co-tenant (measure_contention), so that any order of runs is fair:
//   BM_alone_plain / BM_alone_green  caller_stream on a pool stream / green_context_stream
//                              (16 SMs), no co-tenant
//   BM_cotenant_plain_streams  victim caller_stream; co-tenant torch::matmul on its own pool
//                              stream: the control (PERF.md: no isolation)
//   BM_cotenant_green_contexts victim green_context_stream (16 SMs); co-tenant through a
//                              runner with green_context_complement_stream (the other SMs): T3
//   BM_cotenant_green_victim_only  victim green_context_stream; co-tenant on a plain stream
//                              (PERF.md: no isolation unless both sides are partitioned)
#include "bench/support/contention.hpp"

#if TORCHLOOM_HAS_CUDA
#include <array>

#include "bench/support/cuda.hpp"
#include "tests/support/linear_mlp.hpp"
#include "tests/support/temp_dir.hpp"
#endif

namespace torchloom_bench {
namespace {

#if TORCHLOOM_HAS_CUDA

constexpr int victim_warmup_calls = 50;  // alone, before the alone samples
constexpr int cotenant_queue_depth = 3;
// A phase is 2000 calls, or less when its deadline comes first: under a plain-stream
// co-tenant a victim call can take ~20 ms (PERF.md), so the two unprotected scenarios end by
// time with about 1000 calls.
constexpr contention phases{.calls = 2000,
                            .alone_deadline_s = 5.0,
                            .contended_deadline_s = 20.0,
                            .alone_warmup = victim_warmup_calls,
                            .contended_warmup = 10,
                            .saturated_after = cotenant_queue_depth + 1,
                            .start_timeout = std::chrono::seconds(30),
                            .poll = std::chrono::milliseconds(1),
                            .flop_per_completion = 2.0 * gemm_size * gemm_size * gemm_size};

template <class S>
using runner_type = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, S>;

// The process's model files (and their directory), inputs and streams.
struct process_state {
  torchloom_test::temp_dir dir{"torchloom_bm_isolation"};
  std::vector<c10::IValue> victim_inputs;
  std::vector<c10::IValue> gemm_inputs;
  std::optional<c10::cuda::CUDAStream> victim_stream;
  std::optional<c10::cuda::CUDAStream> cotenant_stream;
};

built_once<process_state> the_process;

// Model files, inputs (random, never zeros: PERF.md) and the two threads' streams.
process_state* setup(std::string& error) {
  return the_process.get(error, [](std::optional<process_state>& slot) {
    process_state& s = slot.emplace();
    torch::manual_seed(0);
    torchloom_test::linear_mlp("isolation_victim", victim_width)
        .save((s.dir / "victim.pt").string());
    torch::jit::Module gemm("isolation_gemm");
    gemm.define("def forward(self, a, b):\n    return torch.matmul(a, b)\n");
    gemm.save((s.dir / "gemm.pt").string());
    const auto on_device = torch::TensorOptions().device(gpu);
    torch::manual_seed(42);
    s.victim_inputs = {torch::rand({64, victim_width}, on_device)};
    const auto bf16 = on_device.dtype(torch::kBFloat16);
    s.gemm_inputs = {torch::randn({gemm_size, gemm_size}, bf16),
                     torch::randn({gemm_size, gemm_size}, bf16)};
    s.victim_stream = c10::cuda::getStreamFromPool(false, 0);
    s.cotenant_stream = c10::cuda::getStreamFromPool(false, 0);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
}

// The runner of the victim or the GEMM model with stream policy S (on 16 SMs when `green`),
// built and warmed up on first use; nullptr with `error` set when it cannot be built.
template <class S, bool Victim>
runner_type<S>* runner(bool green, std::string& error) {
  static built_once<runner_type<S>> slot;
  process_state* p = setup(error);
  if (p == nullptr) return nullptr;
  return slot.get(error, [p, green](std::optional<runner_type<S>>& r) {
    auto spec = torchloom::model_spec::from_file(p->dir / (Victim ? "victim.pt" : "gemm.pt"));
    if (green) spec.set("GREEN_CONTEXT_SM_COUNT", green_sms);
    r.emplace(std::move(spec), gpu);
    const auto& inputs = Victim ? p->victim_inputs : p->gemm_inputs;
    for (int i = 0; i < (Victim ? victim_warmup_calls : 3); ++i) r->run(inputs);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
}

#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
// SMs a green policy really gets for green_sms (a throw-away instance: the runner does not
// expose its stream policy); -1 when it cannot be built.
template <class P>
int green_sm_count_of() {
  static const int n = [] {
    try {
      std::string error;
      const fs::path dir = setup(error)->dir.path();
      torchloom::runner_options options;
      options.green_context_sm_count = std::atoi(green_sms);
      P policy(torchloom::model_context{"isolation_probe", dir, gpu, options, dir});
      return static_cast<int>(policy.sm_count());
    } catch (const std::exception&) {
      return -1;
    }
  }();
  return n;
}
#endif

// The co-tenant's thread: `launch` issues one GEMM on its stream (the co-tenant's), at most
// `cotenant_queue_depth` ahead of the GEMMs the device has finished.
std::unique_ptr<cotenant_threads> start_cotenant(c10::cuda::CUDAStream stream,
                                                 std::function<void()> launch) {
  return std::make_unique<cotenant_threads>(
      1, [stream, launch](const std::atomic<bool>& stop, std::atomic<std::int64_t>& completed) {
        c10::cuda::CUDAStreamGuard guard(stream);
        c10::InferenceMode inference;
        // Timing-free events recorded on the co-tenant's stream, round robin.
        std::array<torchloom::cuda::event, cotenant_queue_depth> ring;
        for (auto& e : ring) e = torchloom::cuda::event("isolation_cotenant");
        for (std::int64_t i = 0; !stop.load(); ++i) {
          const cudaEvent_t slot = ring[static_cast<std::size_t>(i % cotenant_queue_depth)].get();
          if (i >= cotenant_queue_depth) {
            check_cuda(cudaEventSynchronize(slot), "cudaEventSynchronize");
            completed.fetch_add(1);
          }
          launch();
          check_cuda(cudaEventRecord(slot, stream.stream()), "cudaEventRecord");
        }
        check_cuda(cudaStreamSynchronize(stream.stream()), "cudaStreamSynchronize");
      });
}

enum class cotenant_kind { none, plain, green };

template <class VictimPolicy>
void bm_isolation(benchmark::State& state, cotenant_kind kind) {
  if (skip_if(state, no_device(gpu))) return;
  constexpr bool green_victim = !std::is_same_v<VictimPolicy, torchloom::caller_stream>;
  std::string error;
  process_state* p = setup(error);
  if (skip_if(state, p == nullptr ? "set-up: " + error : "")) return;
  auto* victim = runner<VictimPolicy, true>(green_victim, error);
  if (skip_if(state, victim == nullptr ? "victim runner: " + error : "")) return;
  contention c = phases;
  // The co-tenant's GEMM on its current stream: a plain torch::matmul, or a run of the GEMM
  // model through a green_context_complement_stream runner (fenced with that stream).
  std::function<void()> launch;
  if (kind == cotenant_kind::plain) {
    launch = [p] {
      benchmark::DoNotOptimize(
          torch::matmul(p->gemm_inputs[0].toTensor(), p->gemm_inputs[1].toTensor()));
    };
    c.cotenant_sms = device_sm_count();
  } else if (kind == cotenant_kind::green) {
#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
    using complement = torchloom::green_context_complement_stream;
    auto* gemm = runner<complement, false>(true, error);
    if (skip_if(state, gemm == nullptr ? "co-tenant runner: " + error : "")) return;
    launch = [p, gemm] { benchmark::DoNotOptimize(gemm->run(p->gemm_inputs)); };
    c.cotenant_sms = green_sm_count_of<complement>();
#else
    state.SkipWithError(no_green_context);
    return;
#endif
  }
  c.victim_sms = device_sm_count();
#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
  if constexpr (green_victim) c.victim_sms = green_sm_count_of<torchloom::green_context_stream>();
#endif
  c10::cuda::CUDAStreamGuard guard(*p->victim_stream);
  const cudaStream_t s = current_stream();
  guarded(state, [&] {
    measure_contention(
        state, c,
        [&] {
          benchmark::DoNotOptimize(victim->run(p->victim_inputs));
          check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        },
        [&](int calls) {
          for (int i = 0; i < calls; ++i) victim->run(p->victim_inputs);
          sync_current_stream();
        },
        kind == cotenant_kind::none
            ? std::function<std::unique_ptr<cotenant_threads>()>()
            : [p, launch] { return start_cotenant(*p->cotenant_stream, launch); });
  });
}

void register_benchmarks() {
  using enum cotenant_kind;
#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
  const auto green_victim = bm_isolation<torchloom::green_context_stream>;
#else
  const auto green_victim = skip_with(no_green_context);
#endif
  const auto plain_victim = bm_isolation<torchloom::caller_stream>;
  register_manual("BM_alone_plain", benchmark::kMicrosecond, plain_victim, none);
  register_manual("BM_cotenant_plain_streams", benchmark::kMicrosecond, plain_victim, plain);
  register_manual("BM_alone_green", benchmark::kMicrosecond, green_victim, none);
  register_manual("BM_cotenant_green_contexts", benchmark::kMicrosecond, green_victim, green);
  register_manual("BM_cotenant_green_victim_only", benchmark::kMicrosecond, green_victim, plain);
}

#else  // !TORCHLOOM_HAS_CUDA

void register_benchmarks() {
  benchmark::RegisterBenchmark("BM_isolation", skip_with("built without CUDA"));
}

#endif

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_benchmarks)
