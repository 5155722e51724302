#pragma once
// The GPU's SM clock and board power while a benchmark phase runs (NVML, opened at run time,
// so this compiles and links without CUDA), and the counters that scale a victim's latency to
// the clock it had alone (PERF.md T3 and T16).
#include <benchmark/benchmark.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace torchloom_bench {

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
    const auto sym = [this](const char* name) { return ::dlsym(lib_, name); };
    init_ = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    handle_ = reinterpret_cast<int (*)(unsigned, void**)>(sym("nvmlDeviceGetHandleByIndex_v2"));
    clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetClockInfo"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
    reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(
        sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
    ok_ = init_ && handle_ && clock_ && power_ && reasons_ && init_() == 0 &&
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
    samples_.clear();
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
          samples_.push_back({static_cast<double>(mhz), mw / 1000.0, (why & power_cap) != 0});
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }

  summary stop() {
    if (thread_.joinable()) {
      running_ = false;
      thread_.join();
    }
    std::lock_guard lock(mutex_);
    summary s;
    if (samples_.empty()) return s;
    for (const auto& x : samples_) {
      s.sm_mhz += x.mhz;
      s.power_w += x.watts;
      s.power_capped += x.capped ? 1.0 : 0.0;
    }
    const auto n = static_cast<double>(samples_.size());
    s.sm_mhz /= n;
    s.power_w /= n;
    s.power_capped /= n;
    return s;
  }

 private:
  struct sample {
    double mhz;
    double watts;
    bool capped;
  };
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
  std::vector<sample> samples_;
};

//! Sets the clock counters of an isolation benchmark from the victim's phase alone and its
//! phase beside a co-tenant: alone_sm_mhz, sm_mhz, power_w, power_capped, and
//! ratio_at_alone_clock, the contended p99 over the alone p99 scaled to the alone phase's
//! clock (what is left of the slowdown once the lower clock is taken out; the victim is
//! compute-bound on its SMs). Sets nothing when NVML gave no samples.
inline void set_clock_counters(benchmark::State& state, const clock_sampler& sampler,
                               const clock_sampler::summary& alone,
                               const clock_sampler::summary& beside, double alone_p99_us,
                               double p99_us) {
  if (!sampler.available() || beside.sm_mhz <= 0 || alone.sm_mhz <= 0) return;
  state.counters["alone_sm_mhz"] = alone.sm_mhz;
  state.counters["sm_mhz"] = beside.sm_mhz;
  state.counters["power_w"] = beside.power_w;
  state.counters["power_capped"] = beside.power_capped;
  if (alone_p99_us > 0.0) {
    state.counters["ratio_at_alone_clock"] = p99_us / alone_p99_us * beside.sm_mhz / alone.sm_mhz;
  }
}

}  // namespace torchloom_bench
