#pragma once
#include <torchloom/concepts/loader.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/op_libraries.hpp>
#include <torchloom/detail/process_settings.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/signature.hpp>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/cuda.h>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The part of a runner that does not depend on its policies: the spec, the device, the
//! declared inputs and the process-wide settings it holds. Constructed first, destroyed last.
class runner_core {
 public:
  runner_core(model_spec spec, c10::Device device)
      : spec_(std::move(spec)),
        // "cuda" means cuda:0: a runner's device never depends on the thread's current one.
        device_(device.is_cuda() && !device.has_index() ? c10::Device(c10::kCUDA, 0) : device) {
    check_device();
    const auto& o = spec_.options;
    if (o.intra_op_thread_count) {
      const int n = *o.intra_op_thread_count;
      settings_.push_back(setting_claim::make(
          "INTRA_OP_THREAD_COUNT", std::to_string(n), spec_.name, [n]() -> std::function<void()> {
            const int before = at::get_num_threads();
            at::set_num_threads(n);
            return [before] { at::set_num_threads(before); };
          }));
    }
    if (o.inter_op_thread_count) {
      const int n = *o.inter_op_thread_count;
      settings_.push_back(setting_claim::make(
          "INTER_OP_THREAD_COUNT", std::to_string(n), spec_.name, [n]() -> std::function<void()> {
            // torch allows this once, before its inter-op pool starts, so it cannot be
            // undone. (size_t in torch 2.x, int in 1.13)
            if (static_cast<int>(at::get_num_interop_threads()) != n) {
              at::set_num_interop_threads(n);
            }
            return {};
          }));
    }
    if (o.enable_cache_cleaning && device_.is_cuda() && !TORCHLOOM_HAS_CUDA) {
      throw error(errc::unsupported, spec_.name,
                  "ENABLE_CACHE_CLEANING on a CUDA device needs the torchloom::cuda target "
                  "(TORCHLOOM_HAS_CUDA)");
    }
    // Before the hook and the model, which may need the operators the libraries register.
    load_op_libraries(spec_.name, spec_.directory, o.op_libraries);
  }

  const std::string& name() const noexcept { return spec_.name; }
  const model_spec& spec() const noexcept { return spec_; }
  const runner_options& options() const noexcept { return spec_.options; }
  c10::Device device() const noexcept { return device_; }
  const input_signature& signature() const noexcept { return signature_; }

  model_context context() const noexcept {
    return model_context{spec_.name, spec_.directory, device_, spec_.options,
                         spec_.version_directory};
  }

  load_context load(std::string_view default_filename) const {
    return load_context{spec_, spec_.model_file(default_filename), device_};
  }

  //! Takes the loader's signature and adds what config.pbtxt declares (dtype, dims, and the
  //! batch dimension when max_batch_size > 0), matching inputs by name, then by Triton's
  //! `NAME__<index>` convention, then by position.
  void set_signature(input_signature sig) {
    if (spec_.config) {
      const auto& cfg = *spec_.config;
      for (std::size_t i = 0; i < cfg.inputs.size(); ++i) {
        const auto& decl = cfg.inputs[i];
        input_spec* target = nullptr;
        for (auto& s : sig) {
          if (s.name == decl.name) target = &s;
        }
        if (!target) {
          auto pos = decl.name.rfind("__");
          if (pos != std::string::npos) {
            std::size_t idx = 0;
            try {
              idx = std::stoul(decl.name.substr(pos + 2));
            } catch (const std::exception&) {
              idx = sig.size();
            }
            if (idx < sig.size()) target = &sig[idx];
          }
        }
        if (!target && cfg.inputs.size() == sig.size()) target = &sig[i];
        if (!target) {
          throw error(errc::invalid_option, spec_.name,
                      concat("config.pbtxt declares input '", decl.name,
                             "', which the model does not have"));
        }
        if (decl.dtype) target->dtype = decl.dtype;
        std::vector<std::int64_t> shape;
        if (cfg.max_batch_size > 0) {
          shape.push_back(-1);
          target->max_batch_size = cfg.max_batch_size;
        }
        shape.insert(shape.end(), decl.dims.begin(), decl.dims.end());
        if (!decl.dims.empty() || cfg.max_batch_size > 0) target->shape = std::move(shape);
        if (target->name.empty()) target->name = decl.name;
      }
    }
    signature_ = std::move(sig);
  }

  //! WARMUP_ITERATIONS runs with inputs synthesised from the declared dtypes and shapes
  //! (free dimensions become 1). Throws invalid_option when an input is not declared enough.
  template <class Run>
  void warm_up(Run&& run) const {
    const int n = spec_.options.warmup_iterations;
    if (n == 0) return;
    std::vector<c10::IValue> inputs;
    for (const auto& s : signature_) {
      if (s.has_default) break;
      if (!s.is_tensor || !s.dtype || !s.shape) {
        throw error(errc::invalid_option, spec_.name,
                    concat("WARMUP_ITERATIONS=", n, " needs the dtype and shape of every input "
                           "(config.pbtxt input { data_type dims }); input '", s.name,
                           "' has none"));
      }
      std::vector<std::int64_t> shape = *s.shape;
      for (auto& d : shape) d = d < 0 ? 1 : d;
      auto opts = at::TensorOptions().dtype(*s.dtype).device(device_);
      try {
        inputs.emplace_back(c10::isFloatingType(*s.dtype) ? at::rand(shape, opts)
                                                          : at::zeros(shape, opts));
      } catch (const std::exception& e) {  // c10::Error, std::bad_alloc: dims too large
        throw error(errc::invalid_option, spec_.name,
                    concat("WARMUP_ITERATIONS=", n, ": cannot make input '", s.name,
                           "' of the declared shape ", c10::IntArrayRef(shape), ": ",
                           torch_message(e)));
      }
    }
    for (int i = 0; i < n; ++i) run(inputs);
  }

  //! Work after every run: ENABLE_CACHE_CLEANING.
  void after_run() const {
#if TORCHLOOM_HAS_CUDA
    if (spec_.options.enable_cache_cleaning && device_.is_cuda()) {
      c10::cuda::CUDACachingAllocator::emptyCache();
    }
#endif
  }

 private:
  void check_device() const {
    if (device_.is_cpu()) return;
    if (!device_.is_cuda()) {
      throw error(errc::unsupported, spec_.name,
                  concat("device ", device_, " is not supported; use cpu or cuda:N"));
    }
    // size_t in torch 1.13, c10::DeviceIndex in 2.x
    const auto count = static_cast<std::int64_t>(torch::cuda::device_count());
    if (count == 0) {
      throw error(errc::unsupported, spec_.name,
                  concat("device ", device_,
                         " requested, but torch sees no CUDA device (or was built without "
                         "CUDA)"));
    }
    if (device_.has_index() && device_.index() >= count) {
      throw error(errc::unsupported, spec_.name,
                  concat("device ", device_, " requested, but there are only ", count,
                         " CUDA devices"));
    }
  }

  model_spec spec_;
  c10::Device device_;
  input_signature signature_;
  std::vector<setting_claim> settings_;
};

}  // namespace torchloom::detail
