#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/green_context.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/check.hpp>
#include <torchloom/cuda/owned_stream.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace torchloom::cuda {

//! Which side of an SM split a green context takes: the group of the requested size, or the
//! SMs that remain after it (so two green contexts can share one GPU without overlap).
enum class sm_split_part { group, remaining };

//! A device's SMs as the driver describes them for green contexts.
struct device_sm_resource {
  int sm_count = 0;       //!< SMs on the device
  int min_partition = 0;  //!< the smallest group the driver makes (`minSmPartitionSize`)
  int alignment = 0;      //!< groups are multiples of this (`smCoscheduledAlignment`)
};

}  // namespace torchloom::cuda

namespace torchloom::detail {

//! The green-context entry points, looked up at run time: a driver older than CUDA 12.5 lacks
//! some of them, and a direct reference would stop the program from loading at all instead
//! of reporting `unsupported`.
struct green_driver_api {
  decltype(&::cuDeviceGetDevResource) get_dev_resource = nullptr;
  decltype(&::cuDevSmResourceSplitByCount) split_by_count = nullptr;
  decltype(&::cuDevResourceGenerateDesc) generate_desc = nullptr;
  decltype(&::cuGreenCtxCreate) create = nullptr;
  decltype(&::cuGreenCtxDestroy) destroy = nullptr;
  decltype(&::cuGreenCtxStreamCreate) stream_create = nullptr;
  const char* missing = nullptr;  //!< the first entry point the driver does not have

  static const green_driver_api& get() {
    static const green_driver_api api = [] {
      green_driver_api a;
      a.load(a.get_dev_resource, "cuDeviceGetDevResource");
      a.load(a.split_by_count, "cuDevSmResourceSplitByCount");
      a.load(a.generate_desc, "cuDevResourceGenerateDesc");
      a.load(a.create, "cuGreenCtxCreate");
      a.load(a.destroy, "cuGreenCtxDestroy");
      a.load(a.stream_create, "cuGreenCtxStreamCreate");
      return a;
    }();
    return api;
  }

 private:
  template <class F>
  void load(F& fn, const char* name) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult found{};
    // CUDA_VERSION asks for the ABI of the headers this was compiled with.
    if (::cuGetProcAddress(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) !=
            CUDA_SUCCESS ||
        found != CU_GET_PROC_ADDRESS_SUCCESS || p == nullptr) {
      if (missing == nullptr) missing = name;
      return;
    }
    fn = reinterpret_cast<F>(p);
  }
};

//! "CUDA_ERROR_X (its description)".
inline std::string driver_error_text(CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (::cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  if (::cuGetErrorString(r, &text) != CUDA_SUCCESS || text == nullptr) text = "no description";
  return concat(name, " (", text, ", code ", static_cast<int>(r), ")");
}

//! Throws for a failed driver call: unsupported where the driver or device has no green
//! contexts, cuda_error otherwise. The message names the call and the device.
inline void check_driver(CUresult r, const char* call, const std::string& model,
                         c10::Device device) {
  if (r == CUDA_SUCCESS) return;
  if (r == CUDA_ERROR_NOT_SUPPORTED) {
    throw error(errc::unsupported, model,
                concat("green contexts are not supported on ", device, ": ", call, " returned ",
                       driver_error_text(r)));
  }
  throw error(errc::cuda_error, model,
              concat(call, " failed on ", device, ": ", driver_error_text(r)));
}

//! One device's SM resource and the splits it allows. Makes the primary context current on
//! the device first (torch may not have touched the device yet); green contexts retain it.
class sm_splitter {
 public:
  sm_splitter(c10::DeviceIndex index, std::string model)
      : model_(std::move(model)), device_(c10::kCUDA, index), api_(&green_driver_api::get()) {
    {
      const c10::cuda::CUDAGuard guard(index);
      // Creates the primary context if needed.
      cuda::check(::cudaFree(nullptr), model_, concat("cudaFree(0) on ", device_));
    }
    check_driver(::cuInit(0), "cuInit", model_, device_);
    check_driver(::cuDeviceGet(&dev_, index), "cuDeviceGet", model_, device_);
    char name[256] = {};
    if (::cuDeviceGetName(name, static_cast<int>(sizeof(name)), dev_) == CUDA_SUCCESS) {
      name_ = name;
    }
    if (api_->missing != nullptr) {
      int version = 0;
      (void)::cuDriverGetVersion(&version);
      throw error(
          errc::unsupported, model_,
          concat("green contexts are not supported on ", device_, ": the CUDA driver (version ",
                 version / 1000, ".", (version % 1000) / 10, ") has no ", api_->missing,
                 "; green-context streams need a driver for CUDA 12.5 or later"));
    }
    check_driver(api_->get_dev_resource(dev_, &resource_, CU_DEV_RESOURCE_TYPE_SM),
                 "cuDeviceGetDevResource", model_, device_);
    info_.sm_count = static_cast<int>(resource_.sm.smCount);
    // Both fields are new in CUDA 13; an older driver leaves them 0 and the split decides.
    info_.min_partition = static_cast<int>(resource_.sm.minSmPartitionSize);
    info_.alignment = static_cast<int>(resource_.sm.smCoscheduledAlignment);
  }

  struct split_result {
    CUresult status = CUDA_SUCCESS;
    unsigned groups = 1;
    CUdevResource group{};
    CUdevResource remaining{};
  };

  split_result split(int count) const {
    split_result s;
    s.status = api_->split_by_count(&s.group, &s.groups, &resource_, &s.remaining, 0,
                                    static_cast<unsigned>(count));
    return s;
  }

  //! Whether the driver's rules allow `count` at all (before asking it to split).
  bool follows_rules(int count, cuda::sm_split_part part) const {
    const int min = std::max(info_.min_partition, 1);
    const int align = std::max(info_.alignment, 1);
    const int keep = part == cuda::sm_split_part::remaining ? min : 0;
    return count >= min && count % align == 0 && count <= info_.sm_count - keep;
  }

  //! Whether `s` is exactly what was asked: one group of `count` SMs (the driver rounds a
  //! count it cannot honour up), and, for the remaining part, enough SMs left over.
  bool exact(const split_result& s, int count, cuda::sm_split_part part) const {
    if (s.status != CUDA_SUCCESS || s.groups != 1) return false;
    if (static_cast<int>(s.group.sm.smCount) != count) return false;
    return part == cuda::sm_split_part::group ||
           static_cast<int>(s.remaining.sm.smCount) >= std::max(info_.min_partition, 1);
  }

  std::vector<int> possible(cuda::sm_split_part part) const {
    std::vector<int> out;
    for (int c = 1; c <= info_.sm_count; ++c) {
      if (follows_rules(c, part) && exact(split(c), c, part)) out.push_back(c);
    }
    return out;
  }

  //! "cuda:0 (NVIDIA H100 80GB HBM3, 132 SMs)".
  std::string describe() const {
    return concat(device_, " (", name_.empty() ? std::string("unknown GPU") : name_, ", ",
                  info_.sm_count, " SMs)");
  }

  //! "use a multiple of 8 from 8 to 128", or the list of counts that work.
  static std::string what_works(const std::vector<int>& counts) {
    if (counts.empty()) return "no SM count can be split off on this device";
    if (counts.size() == 1) return concat("use ", counts.front());
    const int step = counts[1] - counts[0];
    bool even = true;
    for (std::size_t i = 1; i < counts.size(); ++i)
      even = even && counts[i] - counts[i - 1] == step;
    if (even && step == 1)
      return concat("use a number from ", counts.front(), " to ", counts.back());
    if (even && counts.front() % step == 0) {
      return concat("use a multiple of ", step, " from ", counts.front(), " to ", counts.back());
    }
    std::string list;
    for (int c : counts) list += concat(list.empty() ? "" : ", ", c);
    return concat("use one of ", list);
  }

  const cuda::device_sm_resource& info() const noexcept { return info_; }
  const std::string& model() const noexcept { return model_; }
  c10::Device device() const noexcept { return device_; }
  CUdevice dev() const noexcept { return dev_; }
  const green_driver_api& api() const noexcept { return *api_; }

 private:
  std::string model_;
  c10::Device device_;
  const green_driver_api* api_;
  CUdevice dev_ = 0;
  CUdevResource resource_{};
  cuda::device_sm_resource info_;
  std::string name_;
};

}  // namespace torchloom::detail

namespace torchloom::cuda {

//! The SMs of CUDA device `index` and the driver's partition rules. Throws unsupported (no
//! green contexts in this driver or on this device) or cuda_error, naming `model`.
inline device_sm_resource sm_resource_of(c10::DeviceIndex index, const std::string& model = {}) {
  return detail::sm_splitter(index, model).info();
}

//! Every SM count a green context on device `index` may be asked for, ascending: counts the
//! driver splits off exactly, leaving (for `remaining`) at least a minimal partition. Asks
//! the driver once per candidate count; meant for error messages and tests.
inline std::vector<int> possible_sm_counts(c10::DeviceIndex index, sm_split_part part,
                                           const std::string& model = {}) {
  return detail::sm_splitter(index, model).possible(part);
}

//! A CUDA green context on one device, confined to a partition of its SMs, with one
//! non-blocking stream in it; kernels launched on stream() run only on those SMs.
//! `sm_count` SMs are split off the device (cuDevSmResourceSplitByCount); the context takes
//! that group, or with `sm_split_part::remaining` every SM outside it. Owns the context and the
//! stream; the destructor waits for the stream's work, then destroys both. Not copyable or
//! movable. Throws torchloom::error naming `model`: invalid_option when the device cannot be
//! split that way (the message says which counts work), unsupported when the driver or device
//! has no green contexts, cuda_error when a driver call fails.
class green_context {
 public:
  green_context(std::string model, c10::DeviceIndex index, int sm_count,
                sm_split_part part = sm_split_part::group)
      : device_index_(index) {
    const detail::sm_splitter splitter(index, std::move(model));
    const auto& m = splitter.model();
    auto split = splitter.split(sm_count);
    if (!splitter.follows_rules(sm_count, part) || !splitter.exact(split, sm_count, part)) {
      throw error(errc::invalid_option, m,
                  detail::concat("GREEN_CONTEXT_SM_COUNT=", sm_count, " is not possible on ",
                                 splitter.describe(),
                                 part == sm_split_part::remaining
                                     ? detail::concat(" when the SMs left over must form a "
                                                      "partition of at least ",
                                                      std::max(splitter.info().min_partition, 1))
                                     : std::string(),
                                 ": ", detail::sm_splitter::what_works(splitter.possible(part))));
    }
    // The driver's own result, not a copy: CUdevResource is opaque beyond its `sm` fields.
    CUdevResource* chosen = part == sm_split_part::group ? &split.group : &split.remaining;
    const auto& api = splitter.api();
    CUdevResourceDesc desc = nullptr;
    detail::check_driver(api.generate_desc(&desc, chosen, 1), "cuDevResourceGenerateDesc", m,
                         splitter.device());
    detail::check_driver(api.create(&context_, desc, splitter.dev(), CU_GREEN_CTX_DEFAULT_STREAM),
                         "cuGreenCtxCreate", m, splitter.device());
    const CUresult made = api.stream_create(&stream_, context_, CU_STREAM_NON_BLOCKING, 0);
    if (made != CUDA_SUCCESS) {
      (void)api.destroy(context_);
      detail::check_driver(made, "cuGreenCtxStreamCreate", m, splitter.device());
    }
    destroy_ = api.destroy;
    stream_create_ = api.stream_create;
    sm_count_ = static_cast<int>(chosen->sm.smCount);
    live_.fetch_add(1, std::memory_order_relaxed);
  }

  green_context(const green_context&) = delete;
  green_context& operator=(const green_context&) = delete;

  ~green_context() {
    // The green context must outlive the work queued on its stream (the caller may not have
    // waited for the last run yet), and the stream must go first: destroying the context
    // does not destroy its streams.
    CUresult r = ::cuStreamSynchronize(stream_);
    const CUresult s = ::cuStreamDestroy(stream_);
    if (r == CUDA_SUCCESS) r = s;
    const CUresult c = destroy_(context_);
    if (r == CUDA_SUCCESS && c == CUDA_SUCCESS) live_.fetch_sub(1, std::memory_order_relaxed);
  }

  //! The context's stream, as torch sees it (an external stream on cuda:index).
  c10::cuda::CUDAStream stream() const {
    return c10::cuda::getStreamFromExternal(stream_, device_index_);
  }
  //! Another non-blocking stream in the context, the caller's own: its kernels run on the
  //! same SMs, and nothing else is queued on it (graphed<green_context_stream> captures on
  //! one, since every runner of the configuration queues work on stream()). It must be
  //! destroyed before the context. Throws cuda_error naming `model`.
  owned_stream make_stream(const std::string& model) const {
    CUstream s = nullptr;
    detail::check_driver(stream_create_(&s, context_, CU_STREAM_NON_BLOCKING, 0),
                         "cuGreenCtxStreamCreate", model,
                         c10::Device(c10::kCUDA, device_index_));
    return owned_stream(static_cast<cudaStream_t>(s));
  }
  //! SMs actually in the partition.
  int sm_count() const noexcept { return sm_count_; }
  c10::DeviceIndex device_index() const noexcept { return device_index_; }
  CUgreenCtx handle() const noexcept { return context_; }

  //! Green contexts created and not (successfully) destroyed, in this process.
  static int live_count() noexcept { return live_.load(std::memory_order_relaxed); }

 private:
  c10::DeviceIndex device_index_;
  CUgreenCtx context_ = nullptr;
  CUstream stream_ = nullptr;
  decltype(&::cuGreenCtxDestroy) destroy_ = nullptr;
  decltype(&::cuGreenCtxStreamCreate) stream_create_ = nullptr;
  int sm_count_ = 0;
  inline static std::atomic<int> live_{0};
};

//! The process's green contexts, one per (device, SM count, part of the split), created on
//! first use and kept until the process exits, as torch keeps its pool streams. Why not one
//! per runner: creating and destroying a green context loses about 4 MiB of device memory
//! each time (measured with driver 580.159 and CUDA 13.0, with nothing launched in it), so a
//! service whose runners come and go would leak without bound. Runners of one configuration
//! share its context and stream; the memory cost is bounded by the configurations used.
//! Throws what the green_context constructor throws (nothing is cached then).
inline std::shared_ptr<green_context> shared_green_context(const std::string& model,
                                                           c10::DeviceIndex index, int sm_count,
                                                           sm_split_part part) {
  using key = std::tuple<int, int, int>;
  static std::mutex mutex;
  // Never destroyed: tearing down CUDA objects during static destruction races the runtime's
  // own teardown at exit; the driver releases them with the process.
  static auto* cache = new std::map<key, std::shared_ptr<green_context>>();
  std::lock_guard lock(mutex);
  const key k{index, sm_count, static_cast<int>(part)};
  if (auto it = cache->find(k); it != cache->end()) return it->second;
  auto created = std::make_shared<green_context>(model, index, sm_count, part);
  cache->emplace(k, created);
  return created;
}

}  // namespace torchloom::cuda
