#pragma once
// A latency-sensitive victim alone and then beside a saturating co-tenant (PERF.md T3 in
// bm_isolation, T16 in bm_triton): the phases of victim calls, the co-tenant's threads, the
// GPU's SM clock and board power while a phase runs (NVML, opened at run time, so this
// compiles and links without CUDA), and the counters both report.
#include "common.hpp"

#include <dlfcn.h>

#include <type_traits>

namespace torchloom_bench {

// The victim and co-tenant both benchmarks measure: an MLP of 4 Linear(victim_width) layers at
// batch 64 on `green_sms` SMs when partitioned, beside square bf16 GEMMs of gemm_size.
constexpr std::int64_t victim_width = 2048;
constexpr std::int64_t gemm_size = 8192;
constexpr const char* green_sms = "16";

//! The GPU's SM clock and power while a phase runs, sampled every 20 ms from NVML
//! (libnvidia-ml.so.1, opened at run time; NVML index 0 is taken to be cuda:0, the only device
//! the isolation benchmarks use). A saturating co-tenant can draw the board to its power limit,
//! and the driver then lowers the clock of every SM, the victim's partition included: green
//! contexts divide SMs, not power. Without NVML, available() is false and nothing is sampled.
class clock_sampler {
 public:
  struct summary {
    double sm_mhz = 0;        // mean SM clock
    double power_w = 0;       // mean board power
    double power_capped = 0;  // share of samples with a power-cap clock reason
  };

  clock_sampler() {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    const auto sym = [this](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib_, name));
      return fn != nullptr;
    };
    ok_ = sym(init_, "nvmlInit_v2") && sym(handle_, "nvmlDeviceGetHandleByIndex_v2") &&
          sym(clock_, "nvmlDeviceGetClockInfo") && sym(power_, "nvmlDeviceGetPowerUsage") &&
          sym(reasons_, "nvmlDeviceGetCurrentClocksThrottleReasons") && init_() == 0 &&
          handle_(0, &device_) == 0;
  }
  clock_sampler(const clock_sampler&) = delete;
  clock_sampler& operator=(const clock_sampler&) = delete;
  ~clock_sampler() {
    stop();
    if (lib_ != nullptr) ::dlclose(lib_);
  }

  bool available() const { return ok_; }

  void start() {
    stop();
    sum_ = {};
    count_ = 0;
    if (!ok_) return;
    running_ = true;
    thread_ = std::thread([this] {
      while (running_) {
        unsigned mhz = 0;
        unsigned mw = 0;
        unsigned long long why = 0;
        constexpr int nvml_clock_sm = 1;
        // Power-cap reasons: software power cap (0x4), hardware power brake (0x80).
        constexpr unsigned long long power_cap = 0x4ULL | 0x80ULL;
        if (clock_(device_, nvml_clock_sm, &mhz) == 0 && power_(device_, &mw) == 0 &&
            reasons_(device_, &why) == 0) {
          std::lock_guard lock(mutex_);
          sum_.sm_mhz += static_cast<double>(mhz);
          sum_.power_w += mw / 1000.0;
          sum_.power_capped += (why & power_cap) != 0 ? 1.0 : 0.0;
          ++count_;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }

  //! The means over the samples since start().
  summary stop() {
    if (thread_.joinable()) {
      running_ = false;
      thread_.join();
    }
    std::lock_guard lock(mutex_);
    if (count_ == 0) return {};
    const auto n = static_cast<double>(count_);
    return {sum_.sm_mhz / n, sum_.power_w / n, sum_.power_capped / n};
  }

 private:
  void* lib_ = nullptr;
  void* device_ = nullptr;
  bool ok_ = false;
  int (*init_)() = nullptr;
  int (*handle_)(unsigned, void**) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*reasons_)(void*, unsigned long long*) = nullptr;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::mutex mutex_;
  summary sum_;  // sums of the samples since start()
  int count_ = 0;
};

//! Latencies (µs) of one phase of victim calls, and its wall time.
struct phase {
  std::vector<double> us;
  double seconds = 0.0;
};

//! Up to `calls` calls of `request`, one after another, until `deadline_s` has passed.
template <class Request>
phase measure_phase(Request&& request, int calls, double deadline_s) {
  phase p;
  p.us.reserve(static_cast<std::size_t>(calls));
  const auto begin = steady::now();
  const auto deadline = begin + std::chrono::duration<double>(deadline_s);
  for (int i = 0; i < calls; ++i) {
    const auto start = steady::now();
    if (start > deadline) break;
    request();
    p.us.push_back(us_since(start));
  }
  p.seconds = us_since(begin) * 1e-6;
  return p;
}

//! Threads that keep a co-tenant busy until stopped or destroyed: each runs
//! `body(stop, completed)`, which works until `stop` is set and counts its finished work in
//! `completed`; what it throws ends that thread and is kept as error().
class cotenant_threads {
 public:
  using body_fn = std::function<void(const std::atomic<bool>&, std::atomic<std::int64_t>&)>;

  cotenant_threads(int threads, body_fn body) : body_(std::move(body)) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this] {
        try {
          body_(stop_, completed_);
        } catch (const std::exception& e) {
          std::lock_guard lock(mutex_);
          if (error_.empty()) error_ = e.what();
          failed_.store(true);
        }
      });
    }
  }
  cotenant_threads(const cotenant_threads&) = delete;
  cotenant_threads& operator=(const cotenant_threads&) = delete;
  ~cotenant_threads() { stop(); }

  void stop() {
    stop_.store(true);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  //! True once `count` pieces of work have completed (checked every `poll`); false on error
  //! or after `timeout`.
  bool wait_until(std::int64_t count, std::chrono::seconds timeout,
                  std::chrono::milliseconds poll) {
    const auto deadline = steady::now() + timeout;
    while (completed_.load() < count) {
      if (failed_.load() || steady::now() > deadline) return false;
      std::this_thread::sleep_for(poll);
    }
    return true;
  }

  std::int64_t completed() const { return completed_.load(); }

  std::string error() {
    std::lock_guard lock(mutex_);
    return error_;
  }

 private:
  body_fn body_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<std::int64_t> completed_{0};
  std::mutex mutex_;
  std::string error_;
  std::vector<std::thread> threads_;  // last: started after everything they use
};

//! How a victim is measured beside its co-tenant.
struct contention {
  int calls = 0;                // per phase, unless the phase's deadline comes first
  double alone_deadline_s = 0;  // caps a phase's wall time
  double contended_deadline_s = 0;
  int alone_warmup = 0;              // victim calls before the alone phase
  int contended_warmup = 0;          // victim calls once the co-tenant saturates
  std::int64_t saturated_after = 0;  // co-tenant work completed before it counts as saturating
  std::chrono::seconds start_timeout{0};
  std::chrono::milliseconds poll{1};
  double flop_per_completion = 0;  // of the co-tenant's work, for cotenant_tflops
  int victim_sms = 0;
  int cotenant_sms = 0;
};

//! Each iteration: `warm(c.alone_warmup)`, the victim's phase alone (`request` per call, called
//! directly, not through a std::function, inside the timed region), then, when `start_cotenant`
//! is given, the co-tenant started, `warm(c.contended_warmup)` once it saturates, the victim's
//! phase beside it, and the co-tenant stopped. Counters: p50_us, p99_us and calls of the last
//! phase, alone_p50_us, alone_p99_us, ratio_vs_alone (p99 over alone p99), victim_sms,
//! cotenant_sms, cotenant_tflops; with NVML samples, alone_sm_mhz, sm_mhz, power_w,
//! power_capped and ratio_at_alone_clock, the contended p99 over the alone p99 scaled to the
//! alone phase's clock (what is left of the slowdown once the lower clock is taken out; the
//! victim is compute-bound on its SMs). The manual time is the last phase's p50.
template <class Request>
void measure_contention(benchmark::State& state, const contention& c, Request&& request,
                        const std::function<void(int)>& warm,
                        const std::function<std::unique_ptr<cotenant_threads>()>& start_cotenant) {
  for (auto _ : state) {
    warm(c.alone_warmup);
    clock_sampler clocks;
    clocks.start();
    const phase alone = measure_phase(request, c.calls, c.alone_deadline_s);
    const clock_sampler::summary alone_clock = clocks.stop();
    clock_sampler::summary clock = alone_clock;
    phase measured = alone;
    double tflops = 0.0;
    if (start_cotenant) {
      const std::unique_ptr<cotenant_threads> co = start_cotenant();
      if (!co->wait_until(c.saturated_after, c.start_timeout, c.poll)) {
        co->stop();
        const std::string why = co->error().empty() ? "timed out" : co->error();
        state.SkipWithError(("co-tenant did not start: " + why).c_str());
        break;
      }
      warm(c.contended_warmup);
      const std::int64_t before = co->completed();
      clocks.start();
      measured = measure_phase(request, c.calls, c.contended_deadline_s);
      clock = clocks.stop();
      const std::int64_t completed = co->completed() - before;
      co->stop();
      if (const std::string why = co->error(); !why.empty()) {
        state.SkipWithError(("co-tenant failed: " + why).c_str());
        break;
      }
      tflops = static_cast<double>(completed) * c.flop_per_completion / measured.seconds / 1e12;
    }
    const double alone_p99 = percentile(alone.us, 0.99);
    const double p50 = percentile(measured.us, 0.50);
    const double p99 = percentile(measured.us, 0.99);
    state.SetIterationTime(p50 * 1e-6);
    set_counters(state, {{"p50_us", p50},
                         {"p99_us", p99},
                         {"calls", static_cast<double>(measured.us.size())},
                         {"alone_p50_us", percentile(alone.us, 0.50)},
                         {"alone_p99_us", alone_p99},
                         {"ratio_vs_alone", alone_p99 > 0.0 ? p99 / alone_p99 : 0.0},
                         {"victim_sms", c.victim_sms},
                         {"cotenant_sms", c.cotenant_sms},
                         {"cotenant_tflops", tflops}});
    if (clocks.available() && clock.sm_mhz > 0 && alone_clock.sm_mhz > 0) {
      set_counters(state, {{"alone_sm_mhz", alone_clock.sm_mhz},
                           {"sm_mhz", clock.sm_mhz},
                           {"power_w", clock.power_w},
                           {"power_capped", clock.power_capped}});
      if (alone_p99 > 0.0) {
        state.counters["ratio_at_alone_clock"] =
            p99 / alone_p99 * clock.sm_mhz / alone_clock.sm_mhz;
      }
    }
  }
}

}  // namespace torchloom_bench
