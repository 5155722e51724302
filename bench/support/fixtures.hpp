#pragma once
// What the benchmarks share around the timed calls: the device a benchmark argument names,
// skips that say why, random inputs of the bundled model, fixture directories, and objects
// built once per process and kept for the whole run.
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace torchloom_bench {

//! The bundled model's input: float32 [batch, 64].
constexpr std::int64_t feature_count = 64;

//! Benchmark argument 0 is the CPU, any other cuda:0.
inline c10::Device device_for(std::int64_t arg) {
  return arg == 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
}

//! GPU time is part of a call on both sides alike: waits for the device after a call.
inline void sync(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

//! Skips (with an error, so the report shows why) when `device` is a GPU and there is none.
inline bool device_missing(benchmark::State& state, c10::Device device) {
  if (device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

//! Random inputs for the bundled model on `device` (never zeros: PERF.md), the same on both
//! sides of a pair.
inline at::Tensor bundled_input(c10::Device device, std::int64_t batch) {
  torch::manual_seed(42);
  return torch::rand({batch, feature_count}, torch::TensorOptions().device(device));
}

//! The directory environment variable `name` names, else `fallback`.
inline std::filesystem::path env_or(const char* name, const std::filesystem::path& fallback) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != 0 ? std::filesystem::path(env) : fallback;
}

//! One T per device, made by `make(device)` (a std::unique_ptr<T>) on first use and kept for
//! the whole run: a load is not what a per-call benchmark measures. clear() before main
//! returns, so no CUDA tensor outlives the CUDA runtime's teardown.
template <class T>
class per_device {
 public:
  template <class Make>
  T& get(c10::Device device, Make&& make) {
    auto& p = items_[device.str()];
    if (!p) p = make(device);
    return *p;
  }
  void clear() { items_.clear(); }

 private:
  std::map<std::string, std::unique_ptr<T>> items_;
};

//! A T built once per process on first use, or why it could not be built.
template <class T>
class built_once {
 public:
  //! The object, built by `build(slot)` (which emplaces into the std::optional<T> slot) the
  //! first time; nullptr, with `error` set to what building threw, when it failed.
  template <class Build>
  T* get(std::string& error, Build&& build) {
    if (!tried_) {
      tried_ = true;
      try {
        build(value_);
      } catch (const std::exception& e) {
        value_.reset();
        error_ = e.what();
      }
    }
    error = error_;
    return value_ ? &*value_ : nullptr;
  }
  void reset() { value_.reset(); }

 private:
  std::optional<T> value_;
  std::string error_;
  bool tried_ = false;
};

}  // namespace torchloom_bench
