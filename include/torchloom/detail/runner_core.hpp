#pragma once
#include <torchloom/concepts/loader.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/dtype.hpp>
#include <torchloom/detail/inputs.hpp>
#include <torchloom/detail/op_libraries.hpp>
#include <torchloom/detail/process_settings.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/signature.hpp>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/cuda.h>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <charconv>
#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The part of a runner that does not depend on its policies: the spec, the device, the
//! declared inputs and the process-wide settings it holds. Constructed first, destroyed last.
class runner_core {
 public:
  //! `device`: the one the application asked for, or nothing to take it from config.pbtxt's
  //! instance_group (see config_device).
  runner_core(model_spec spec, std::optional<c10::Device> device)
      : spec_(std::move(spec)), device_(config_device(spec_, device)), requested_(device) {
    check_device();
    const auto& o = spec_.options;
    // 0 or less: torch's default, as in Triton's PyTorch backend.
    if (o.intra_op_thread_count && *o.intra_op_thread_count > 0) {
      const int n = *o.intra_op_thread_count;
      settings_.push_back(setting_claim::make(
          "INTRA_OP_THREAD_COUNT", std::to_string(n), spec_.name, [n]() -> std::function<void()> {
            const int before = at::get_num_threads();
            at::set_num_threads(n);
            return [before] { at::set_num_threads(before); };
          }));
    }
    if (o.inter_op_thread_count && *o.inter_op_thread_count > 0) {
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
    if (o.disable_cudnn) {
      const bool off = *o.disable_cudnn;
      settings_.push_back(
          setting_claim::make("DISABLE_CUDNN", off ? "true" : "false", spec_.name,
                              [off]() -> std::function<void()> {
                                const bool before = at::globalContext().userEnabledCuDNN();
                                at::globalContext().setUserEnabledCuDNN(!off);
                                return [before] { at::globalContext().setUserEnabledCuDNN(before); };
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
    auto file = spec_.model_file(default_filename);
    spec_.require_inside(file, "model file", errc::load_failed);
    return load_context{spec_, std::move(file), device_};
  }

  //! The device a runner of `spec` runs on: `requested` if given, else what config.pbtxt's
  //! first instance_group says (KIND_CPU: cpu; KIND_GPU: cuda:<first of gpus>, cuda:0
  //! without gpus; KIND_MODEL: cuda:0 where there is a CUDA device, else cpu, until the
  //! loaded model says; KIND_AUTO or no instance_group: cpu). A requested device that no
  //! instance_group allows is invalid_option naming both.
  static c10::Device config_device(const model_spec& spec, std::optional<c10::Device> requested) {
    // "cuda" means cuda:0: a runner's device never depends on the thread's current one.
    if (requested && requested->is_cuda() && !requested->has_index()) {
      requested = c10::Device(c10::kCUDA, 0);
    }
    if (!spec.config || spec.config->instance_groups.empty()) {
      return requested.value_or(c10::Device(c10::kCPU));
    }
    const auto& groups = spec.config->instance_groups;
    if (!requested) {
      const auto& g = groups.front();
      if (g.kind == "KIND_GPU" || (g.kind == "KIND_AUTO" && !g.gpus.empty())) {
        return c10::Device(c10::kCUDA,
                           static_cast<c10::DeviceIndex>(g.gpus.empty() ? 0 : g.gpus.front()));
      }
      if (g.kind == "KIND_MODEL" && torch::cuda::device_count() > 0) {
        return c10::Device(c10::kCUDA, 0);
      }
      return c10::Device(c10::kCPU);
    }
    std::string allowed;
    for (const auto& g : groups) {
      if (g.kind == "KIND_AUTO" && g.gpus.empty()) return *requested;
      if (g.kind == "KIND_MODEL") return *requested;  // checked against the model after load
      if (g.kind == "KIND_CPU") {
        if (requested->is_cpu()) return *requested;
        allowed += allowed.empty() ? "cpu" : ", cpu";
        continue;
      }
      if (g.gpus.empty()) {
        if (requested->is_cuda()) return *requested;
        allowed += allowed.empty() ? "any cuda device" : ", any cuda device";
        continue;
      }
      for (const auto id : g.gpus) {
        if (requested->is_cuda() && requested->index() == id) return *requested;
        allowed += concat(allowed.empty() ? "" : ", ", "cuda:", id);
      }
    }
    throw error(errc::invalid_option, spec.name,
                concat("device ", *requested, " contradicts config.pbtxt's instance_group, "
                       "which allows ", allowed));
  }

  //! KIND_MODEL: the model's own placement decides the device inputs go to (the device of its
  //! first parameter); a device the application asked for must be that one.
  void adopt_model_device(std::optional<c10::Device> model_device) {
    if (!spec_.model_placement() || !model_device || *model_device == device_) return;
    if (requested_) {
      throw error(errc::invalid_option, spec_.name,
                  concat("device ", device_, " contradicts the model's placement "
                         "(instance_group KIND_MODEL): its first parameter is on ",
                         *model_device));
    }
    device_ = *model_device;
    check_device();
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

  //! Warm-up at load: WARMUP_ITERATIONS runs with inputs synthesised from the declared dtypes
  //! and shapes (free dimensions become 1), then every config.pbtxt `model_warmup` sample,
  //! `count` times, with its zero, random or file data (files under `<model dir>/warmup/`,
  //! raw bytes as Triton reads them). Throws invalid_option when an input is not declared
  //! enough or a sample does not fit the model.
  template <class Run>
  void warm_up(Run&& run) const {
    const int n = spec_.options.warmup_iterations;
    if (n > 0) {
      std::vector<c10::IValue> inputs;
      for (const auto& s : signature_) {
        if (s.has_default) break;
        if (!s.is_tensor || !s.dtype || !s.shape) {
          throw error(errc::invalid_option, spec_.name,
                      concat("WARMUP_ITERATIONS=", n, " needs the dtype and shape of every "
                             "input (config.pbtxt input { data_type dims }); input '", s.name,
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
    if (!spec_.config) return;
    for (const auto& w : spec_.config->warmups) {
      std::vector<c10::IValue> inputs(signature_.size());
      std::vector<bool> given(signature_.size(), false);
      for (const auto& in : w.inputs) {
        const auto pos = input_position(in.name);
        if (!pos) {
          throw error(errc::invalid_option, spec_.name,
                      concat("model_warmup '", w.name, "' (line ", w.line, ") names input '",
                             in.name, "', which the model does not have"));
        }
        inputs[*pos] = warmup_tensor(w, in);
        given[*pos] = true;
      }
      std::size_t count = signature_.size();
      while (count > 0 && !given[count - 1] && signature_[count - 1].has_default) --count;
      for (std::size_t i = 0; i < count; ++i) {
        if (!given[i]) {
          throw error(errc::invalid_option, spec_.name,
                      concat("model_warmup '", w.name, "' (line ", w.line,
                             ") gives no data for ", input_label(signature_, i)));
        }
      }
      inputs.resize(count);
      for (std::int64_t i = 0; i < w.count; ++i) run(inputs);
    }
  }

  //! The position of the input called `name`, by Triton's rules: the forward argument of that
  //! name, else `<NAME>__<index>`, else the config's input of that name (the config's order
  //! is the forward's order). Nothing when none applies.
  std::optional<std::size_t> input_position(std::string_view name) const {
    for (std::size_t i = 0; i < signature_.size(); ++i) {
      if (signature_[i].name == name) return i;
    }
    if (auto idx = index_suffix(name); idx && *idx < signature_.size()) return idx;
    if (spec_.config) {
      const auto& decls = spec_.config->inputs;
      for (std::size_t i = 0; i < decls.size() && i < signature_.size(); ++i) {
        if (decls[i].name == name) return i;
      }
    }
    return std::nullopt;
  }

  //! The name of output `i`: the config's output whose name ends in `__<i>`, else the config's
  //! i-th output, else Triton's `OUTPUT__<i>`.
  std::string output_name(std::size_t i) const {
    if (spec_.config) {
      const auto& decls = spec_.config->outputs;
      for (const auto& d : decls) {
        if (index_suffix(d.name) == i) return d.name;
      }
      if (i < decls.size() && !index_suffix(decls[i].name)) return decls[i].name;
    }
    return concat("OUTPUT__", i);
  }

  //! `NAME__3` -> 3 (Triton's naming convention for positional tensors).
  static std::optional<std::size_t> index_suffix(std::string_view name) {
    const auto pos = name.rfind("__");
    if (pos == std::string_view::npos || pos + 2 >= name.size()) return std::nullopt;
    std::size_t v = 0;
    const auto digits = name.substr(pos + 2);
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
    return v;
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
  at::Tensor warmup_tensor(const warmup_decl& w, const warmup_input_decl& in) const {
    const std::string what = concat("model_warmup '", w.name, "' input '", in.name, "'");
    if (!in.dtype) {
      throw error(errc::invalid_option, spec_.name,
                  concat(what, ": a tensor input needs a data_type other than TYPE_STRING"));
    }
    std::vector<std::int64_t> shape;
    if (w.batch_size > 0) shape.push_back(w.batch_size);
    shape.insert(shape.end(), in.dims.begin(), in.dims.end());
    const auto opts = at::TensorOptions().dtype(*in.dtype);
    at::Tensor t;
    switch (in.source) {
      case warmup_input_decl::data::zero: t = at::zeros(shape, opts); break;
      case warmup_input_decl::data::random:
        t = c10::isFloatingType(*in.dtype)
                ? at::rand(shape, opts)
                : at::randint(0, 2, shape, at::TensorOptions().dtype(at::kLong)).to(*in.dtype);
        break;
      case warmup_input_decl::data::file: {
        const auto file = spec_.directory / "warmup" / in.file;
        spec_.require_inside(file, concat(what, ": input_data_file"), errc::invalid_option);
        t = at::empty(shape, opts);
        const auto bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
        std::ifstream f(file, std::ios::binary);
        std::error_code ec;
        if (!f || !std::filesystem::is_regular_file(file, ec)) {
          throw error(errc::invalid_option, spec_.name,
                      concat(what, ": cannot read input_data_file '", file.string(), "'"));
        }
        const auto size = std::filesystem::file_size(file, ec);
        if (ec || size != bytes) {
          throw error(errc::invalid_option, spec_.name,
                      concat(what, ": input_data_file '", file.string(), "' holds ", size,
                             " bytes; shape ", c10::IntArrayRef(shape), " of ",
                             dtype_name(*in.dtype), " needs ", bytes));
        }
        f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes));
        break;
      }
    }
    return t.to(device_);
  }

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
  std::optional<c10::Device> requested_;
  input_signature signature_;
  std::vector<setting_claim> settings_;
};

}  // namespace torchloom::detail
