// T3 (PERF.md): a latency-sensitive victim's p99 under a saturating co-tenant in the same
// process, with and without green contexts.
//
// Victim: a TorchScript MLP of 4 fp32 linear layers of 2048 (ReLU between), built here with
// Module::define, batch 64 on cuda:0: tens of µs on a whole H100, a few hundred on 16 SMs.
// Each call is run() then a sync of the victim's stream, timed with steady_clock.
// Co-tenant: a thread in the same process issuing bf16 8192x8192 GEMMs back to back, with a
// bounded queue (it waits for the GEMM issued `cotenant_queue_depth` earlier before issuing the
// next, so the device never drains and the queue never grows).
//
// Scenarios, one self-contained benchmark each (random interleaving may run them in any
// order): every contended scenario first measures its own victim alone, then starts its
// co-tenant, measures again and stops it; ratio_vs_alone is contended p99 / alone p99 of the
// same victim runner in the same benchmark.
//   BM_alone_plain             victim with caller_stream on a pool stream, no co-tenant
//   BM_alone_green             victim with green_context_stream (16 SMs), no co-tenant
//   BM_cotenant_plain_streams  victim caller_stream; co-tenant torch::matmul on its own pool
//                              stream: the control (PERF.md: no isolation)
//   BM_cotenant_green_contexts victim green_context_stream (16 SMs); co-tenant through a
//                              runner with green_context_complement_stream (the other SMs): T3
//   BM_cotenant_green_victim_only  victim green_context_stream; co-tenant on a plain stream
//                              (PERF.md: no isolation unless both sides are partitioned)
#include <torchloom/detail/config.hpp>
#include <torchloom/torchloom.hpp>

#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/script.h>

#if TORCHLOOM_HAS_CUDA
#include <unistd.h>
#include "bench/support/cuda.hpp"
#endif

#include "bench/support/fixtures.hpp"
#include "bench/support/gpu_clock.hpp"
#include "bench/support/registration.hpp"
#include "bench/support/stats.hpp"
#include "tests/support/linear_mlp.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom_bench {
namespace {

#if TORCHLOOM_HAS_CUDA

constexpr std::int64_t victim_batch = 64;
constexpr std::int64_t victim_width = 2048;
constexpr std::int64_t gemm_size = 8192;  // the co-tenant's square bf16 GEMM
constexpr const char* green_sm_count = "16";
constexpr int green_sm_count_value = 16;
constexpr int victim_warmup_calls = 50;     // alone, before the alone samples
constexpr int contended_warmup_calls = 10;  // after the co-tenant saturates
constexpr int victim_calls = 2000;          // per phase, unless the phase's deadline comes first
// Caps a phase's wall time: under a plain-stream co-tenant a victim call can take ~20 ms
// (PERF.md), so the two unprotected scenarios end by time with about 1000 calls.
constexpr double alone_deadline_s = 5.0;
constexpr double contended_deadline_s = 20.0;
constexpr int cotenant_queue_depth = 3;
constexpr auto cotenant_start_timeout = std::chrono::seconds(30);

template <class S>
using runner_type = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, S>;

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(0).stream(); }

// The process's models, inputs and streams, built on first use; main() clears them before it
// returns, so no CUDA tensor outlives the CUDA runtime's teardown, and removes the files.
struct process_state {
  std::filesystem::path dir;
  std::filesystem::path victim_file;
  std::filesystem::path gemm_file;
  std::vector<c10::IValue> victim_inputs;
  std::vector<c10::IValue> gemm_inputs;
  std::optional<c10::cuda::CUDAStream> victim_stream;
  std::optional<c10::cuda::CUDAStream> cotenant_stream;
  std::vector<std::function<void()>> cleanups;
  std::string error;
  bool ready = false;
};

process_state& state_of_process() {
  static process_state s;
  return s;
}

void write_models(process_state& s) {
  s.dir = std::filesystem::temp_directory_path() /
          ("torchloom_bm_isolation_" + std::to_string(::getpid()));
  std::filesystem::create_directories(s.dir);
  s.victim_file = s.dir / "victim.pt";
  s.gemm_file = s.dir / "gemm.pt";
  torch::manual_seed(0);
  torch::jit::Module victim = torchloom_test::linear_mlp("isolation_victim", victim_width);
  victim.save(s.victim_file.string());
  torch::jit::Module gemm("isolation_gemm");
  gemm.define(R"(
def forward(self, a, b):
    return torch.matmul(a, b)
)");
  gemm.save(s.gemm_file.string());
}

// Model files, inputs (random, never zeros: PERF.md) and the two threads' streams.
process_state* setup(std::string& error) {
  process_state& s = state_of_process();
  if (!s.ready && s.error.empty()) {
    try {
      write_models(s);
      const auto on_device = torch::TensorOptions().device(torch::kCUDA, 0);
      torch::manual_seed(42);
      s.victim_inputs = {torch::rand({victim_batch, victim_width}, on_device)};
      const auto bf16 = on_device.dtype(torch::kBFloat16);
      s.gemm_inputs = {torch::randn({gemm_size, gemm_size}, bf16),
                       torch::randn({gemm_size, gemm_size}, bf16)};
      s.victim_stream = c10::cuda::getStreamFromPool(false, 0);
      s.cotenant_stream = c10::cuda::getStreamFromPool(false, 0);
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      s.ready = true;
    } catch (const std::exception& e) {
      s.error = e.what();
    }
  }
  error = s.error;
  return s.ready ? &s : nullptr;
}

void teardown() {
  process_state& s = state_of_process();
  for (auto& c : s.cleanups) c();
  s.cleanups.clear();
  s.victim_inputs.clear();
  s.gemm_inputs.clear();
  if (!s.dir.empty()) {
    std::error_code ec;
    std::filesystem::remove(s.victim_file, ec);
    std::filesystem::remove(s.gemm_file, ec);
    std::filesystem::remove(s.dir, ec);
  }
}

enum class model_kind { victim, gemm };

// The runner of `model` with stream policy S, built (and warmed up) on first use; nullptr
// with `error` set when it cannot be built (e.g. green contexts unsupported here).
template <class S, model_kind Model>
runner_type<S>* runner(bool green, std::string& error) {
  static built_once<runner_type<S>> slot;
  process_state* p = setup(error);
  if (p == nullptr) return nullptr;
  return slot.get(error, [p, green](std::optional<runner_type<S>>& r) {
    const bool is_victim = Model == model_kind::victim;
    auto spec = torchloom::model_spec::from_file(is_victim ? p->victim_file : p->gemm_file);
    if (green) spec.set("GREEN_CONTEXT_SM_COUNT", green_sm_count);
    r.emplace(std::move(spec), c10::Device(c10::kCUDA, 0));
    p->cleanups.push_back([] { slot.reset(); });
    const auto& inputs = is_victim ? p->victim_inputs : p->gemm_inputs;
    for (int i = 0; i < (is_victim ? victim_warmup_calls : 3); ++i) r->run(inputs);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
}

int device_sm_count() {
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0),
             "cudaDeviceGetAttribute");
  return n;
}

// SMs a green policy really gets with GREEN_CONTEXT_SM_COUNT = 16 (a throw-away instance:
// the runner does not expose its stream policy); -1 when it cannot be built.
template <class P>
int green_sm_count_of() {
  static const int n = [] {
    try {
      const std::string name = "isolation_probe";
      const std::filesystem::path dir = state_of_process().dir;
      torchloom::runner_options options;
      options.green_context_sm_count = green_sm_count_value;
      P policy(torchloom::model_context{name, dir, c10::Device(c10::kCUDA, 0), options, dir});
      return static_cast<int>(policy.sm_count());
    } catch (const std::exception&) {
      return -1;
    }
  }();
  return n;
}

// `cotenant_queue_depth` timing-free events recorded on the co-tenant's stream, round robin.
struct event_ring {
  std::array<cudaEvent_t, cotenant_queue_depth> events{};
  event_ring() {
    for (auto& e : events) {
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
  }
  event_ring(const event_ring&) = delete;
  event_ring& operator=(const event_ring&) = delete;
  ~event_ring() {
    for (auto& e : events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
};

// A thread that keeps the device saturated with GEMMs until destroyed. `launch` issues one
// GEMM on the thread's current stream (the co-tenant's stream).
class cotenant {
 public:
  cotenant(c10::cuda::CUDAStream stream, std::function<void()> launch)
      : stream_(stream), launch_(std::move(launch)), thread_([this] { loop(); }) {}
  cotenant(const cotenant&) = delete;
  cotenant& operator=(const cotenant&) = delete;
  ~cotenant() { stop(); }

  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  //! True once the queue is full and GEMMs have been completing; false on error or timeout.
  bool wait_until_saturating() {
    const auto deadline = std::chrono::steady_clock::now() + cotenant_start_timeout;
    while (completed_.load() < cotenant_queue_depth + 1) {
      if (failed_.load() || std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  std::int64_t completed() const { return completed_.load(); }

  std::string error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  void loop() noexcept {
    try {
      c10::cuda::CUDAStreamGuard guard(stream_);
      c10::InferenceMode inference;
      event_ring ring;
      for (std::int64_t i = 0; !stop_.load(); ++i) {
        cudaEvent_t& slot = ring.events[static_cast<std::size_t>(i % cotenant_queue_depth)];
        if (i >= cotenant_queue_depth) {
          check_cuda(cudaEventSynchronize(slot), "cudaEventSynchronize");
          completed_.fetch_add(1);
        }
        launch_();
        check_cuda(cudaEventRecord(slot, stream_.stream()), "cudaEventRecord");
      }
      check_cuda(cudaStreamSynchronize(stream_.stream()), "cudaStreamSynchronize");
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = e.what();
      failed_.store(true);
    }
  }

  c10::cuda::CUDAStream stream_;
  std::function<void()> launch_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<std::int64_t> completed_{0};
  std::mutex mutex_;
  std::string error_;
  std::thread thread_;  // last: starts after everything it uses exists
};

struct phase {
  std::vector<double> us;
  double seconds = 0.0;
};

// Up to `calls` victim calls, each run() then a sync of the caller's stream.
template <class R>
phase measure(R& r, const std::vector<c10::IValue>& inputs, int calls, double deadline_s) {
  phase p;
  p.us.reserve(static_cast<std::size_t>(calls));
  const cudaStream_t s = current_stream();
  const auto begin = std::chrono::steady_clock::now();
  const auto deadline = begin + std::chrono::duration<double>(deadline_s);
  for (int i = 0; i < calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (start > deadline) break;
    {
      std::vector<at::Tensor> out = r.run(inputs);
      benchmark::DoNotOptimize(out);
    }
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const auto stop = std::chrono::steady_clock::now();
    p.us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
  }
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return p;
}

enum class cotenant_kind { none, plain, green };

template <class VictimPolicy>
constexpr bool is_green_victim = !std::is_same_v<VictimPolicy, torchloom::caller_stream>;

template <class VictimPolicy>
void bm_isolation(benchmark::State& state, cotenant_kind kind) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  constexpr bool green_victim = is_green_victim<VictimPolicy>;
  std::string error;
  process_state* p = setup(error);
  if (p == nullptr) {
    state.SkipWithError(("set-up: " + error).c_str());
    return;
  }
  auto* victim = runner<VictimPolicy, model_kind::victim>(green_victim, error);
  if (victim == nullptr) {
    state.SkipWithError(("victim runner: " + error).c_str());
    return;
  }
  // The co-tenant's GEMM on its current stream: a plain torch::matmul, or a run of the GEMM
  // model through a green_context_complement_stream runner (fenced with that stream).
  std::function<void()> launch;
  int cotenant_sms = 0;
  if (kind == cotenant_kind::plain) {
    launch = [p] {
      at::Tensor c = torch::matmul(p->gemm_inputs[0].toTensor(), p->gemm_inputs[1].toTensor());
      benchmark::DoNotOptimize(c);
    };
    cotenant_sms = device_sm_count();
  } else if (kind == cotenant_kind::green) {
#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
    using complement = torchloom::green_context_complement_stream;
    auto* gemm = runner<complement, model_kind::gemm>(true, error);
    if (gemm == nullptr) {
      state.SkipWithError(("co-tenant runner: " + error).c_str());
      return;
    }
    launch = [p, gemm] {
      std::vector<at::Tensor> c = gemm->run(p->gemm_inputs);
      benchmark::DoNotOptimize(c);
    };
    cotenant_sms = green_sm_count_of<complement>();
#else
    state.SkipWithError("torchloom/stream/green_context.hpp is not in this build");
    return;
#endif
  }
  int victim_sms = device_sm_count();
#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
  if constexpr (green_victim) victim_sms = green_sm_count_of<torchloom::green_context_stream>();
#endif
  c10::cuda::CUDAStreamGuard guard(*p->victim_stream);
  try {
    for (auto _ : state) {
      for (int i = 0; i < victim_warmup_calls; ++i) victim->run(p->victim_inputs);
      check_cuda(cudaStreamSynchronize(current_stream()), "cudaStreamSynchronize");
      clock_sampler clocks;
      clocks.start();
      const phase alone = measure(*victim, p->victim_inputs, victim_calls, alone_deadline_s);
      const clock_sampler::summary alone_clock = clocks.stop();
      clock_sampler::summary clock = alone_clock;
      const double alone_p50 = percentile(alone.us, 0.50);
      const double alone_p99 = percentile(alone.us, 0.99);
      phase measured = alone;
      double tflops = 0.0;
      if (kind != cotenant_kind::none) {
        cotenant co(*p->cotenant_stream, launch);
        if (!co.wait_until_saturating()) {
          co.stop();
          const std::string why = co.error().empty() ? "timed out" : co.error();
          state.SkipWithError(("co-tenant did not start: " + why).c_str());
          break;
        }
        for (int i = 0; i < contended_warmup_calls; ++i) victim->run(p->victim_inputs);
        check_cuda(cudaStreamSynchronize(current_stream()), "cudaStreamSynchronize");
        const std::int64_t gemms_before = co.completed();
        clocks.start();
        measured = measure(*victim, p->victim_inputs, victim_calls, contended_deadline_s);
        clock = clocks.stop();
        const std::int64_t gemms = co.completed() - gemms_before;
        co.stop();
        if (const std::string why = co.error(); !why.empty()) {
          state.SkipWithError(("co-tenant failed: " + why).c_str());
          break;
        }
        const double flop = 2.0 * std::pow(static_cast<double>(gemm_size), 3.0);
        tflops = static_cast<double>(gemms) * flop / measured.seconds / 1e12;
      }
      const double p50 = percentile(measured.us, 0.50);
      const double p99 = percentile(measured.us, 0.99);
      state.SetIterationTime(p50 * 1e-6);
      state.counters["p50_us"] = p50;
      state.counters["p99_us"] = p99;
      state.counters["calls"] = static_cast<double>(measured.us.size());
      state.counters["alone_p50_us"] = alone_p50;
      state.counters["alone_p99_us"] = alone_p99;
      state.counters["ratio_vs_alone"] = alone_p99 > 0.0 ? p99 / alone_p99 : 0.0;
      state.counters["victim_sms"] = victim_sms;
      state.counters["cotenant_sms"] = cotenant_sms;
      state.counters["cotenant_tflops"] = tflops;
      set_clock_counters(state, clocks, alone_clock, clock, alone_p99, p99);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
using green_victim_policy = torchloom::green_context_stream;
#else
void bm_green_missing(benchmark::State& state, cotenant_kind) {
  state.SkipWithError("torchloom/stream/green_context.hpp is not in this build");
}
#endif

template <class Fn>
void register_one(const char* name, Fn fn, cotenant_kind kind) {
  benchmark::RegisterBenchmark(name, fn, kind)
      ->Unit(benchmark::kMicrosecond)
      ->UseManualTime()
      ->Iterations(1)
      ->Repetitions(1);
}

void register_benchmarks() {
  using enum cotenant_kind;
  register_one("BM_alone_plain", bm_isolation<torchloom::caller_stream>, none);
  register_one("BM_cotenant_plain_streams", bm_isolation<torchloom::caller_stream>, plain);
#ifdef TORCHLOOM_BENCH_HAS_GREEN_CONTEXT
  register_one("BM_alone_green", bm_isolation<green_victim_policy>, none);
  register_one("BM_cotenant_green_contexts", bm_isolation<green_victim_policy>, green);
  register_one("BM_cotenant_green_victim_only", bm_isolation<green_victim_policy>, plain);
#else
  register_one("BM_alone_green", bm_green_missing, none);
  register_one("BM_cotenant_green_contexts", bm_green_missing, green);
  register_one("BM_cotenant_green_victim_only", bm_green_missing, plain);
#endif
}

#else  // !TORCHLOOM_HAS_CUDA

void bm_isolation(benchmark::State& state) { state.SkipWithError("built without CUDA"); }

void register_benchmarks() { benchmark::RegisterBenchmark("BM_isolation", bm_isolation); }

void teardown() {}

#endif

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_benchmarks, teardown)
