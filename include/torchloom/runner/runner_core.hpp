#pragma once
#include <torchloom/context.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/io_names.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/signature.hpp>

#include <c10/core/Device.h>
#include <torch/cuda.h>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The part of a runner that does not depend on its policies: the spec, the device and the
//! declared inputs, with Triton's rules for naming inputs and outputs. Constructed first (it
//! resolves the device), destroyed last.
class runner_core {
 public:
  //! `device`: the one the application asked for, or nothing to take it from config.pbtxt's
  //! instance_group (see config_device).
  runner_core(model_spec spec, std::optional<c10::Device> device)
      : spec_(std::move(spec)), device_(config_device(spec_, device)), requested_(device) {
    check_device();
    if (spec_.options.enable_cache_cleaning && device_.is_cuda() && !TORCHLOOM_HAS_CUDA) {
      throw error(errc::unsupported, spec_.name,
                  "ENABLE_CACHE_CLEANING on a CUDA device needs the torchloom::cuda target "
                  "(TORCHLOOM_HAS_CUDA)");
    }
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

  //! The inputs run() checks against (see merge_config_inputs).
  void set_signature(input_signature sig) { signature_ = std::move(sig); }

  //! The forward-based names of a model whose loader has them (an AOTInductor package), and
  //! the config's outputs bound to its outputs (see bind_config_outputs).
  void set_names(io_names names) {
    names_ = std::move(names);
    if (spec_.config) bound_outputs_ = bind_config_outputs(*spec_.config, names_, spec_.name);
  }
  const io_names& names() const noexcept { return names_; }

  //! The position of the input called `name`, by Triton's rules: the model's own name for it
  //! (a forward argument's, a package's graph input's), its forward-based name (`ARGS[0]`,
  //! `KWARGS[mask]`), else `<NAME>__<index>`, else the config's input of that name (the
  //! config's order is the forward's; not for a torch_aoti config, whose names are the
  //! package's). Nothing when none applies.
  std::optional<std::size_t> input_position(std::string_view name) const {
    for (std::size_t i = 0; i < signature_.size(); ++i) {
      if (signature_[i].name == name) return i;
    }
    if (auto k = names_.input_index(name); k && *k < signature_.size()) return k;
    if (names_.forward_based && io_names::looks_forward_based(name)) return std::nullopt;
    if (auto idx = index_suffix(name); idx && *idx < signature_.size()) return idx;
    if (spec_.config && !strict_io_names(*spec_.config, names_)) {
      const auto& decls = spec_.config->inputs;
      for (std::size_t i = 0; i < decls.size() && i < signature_.size(); ++i) {
        if (decls[i].name == name) return i;
      }
    }
    return std::nullopt;
  }

  //! Why `name` names no input, beyond its not being one (a value torch fixed at export, or
  //! no forward-based names and why); empty otherwise.
  std::string why_no_input(std::string_view name) const { return names_.why_not(name); }

  //! The names output `i` is returned under by run_named: the config's outputs bound to it;
  //! else, for a model with forward-based names, its forward-based name (OUTPUT__<i> when it
  //! has none); else output_name(i).
  std::vector<std::string> output_names(std::size_t i) const {
    if (!names_.forward_based) return {output_name(i)};
    std::vector<std::string> out;
    for (const auto& [k, n] : bound_outputs_) {
      if (k == i) out.push_back(n);
    }
    if (out.empty()) out.push_back(i < names_.outputs.size() ? names_.outputs[i]
                                                             : concat("OUTPUT__", i));
    return out;
  }

  //! The output position a name stands for (the inverse of output_names, and for a model with
  //! forward-based names every forward-based and ordinal name too). Nothing when none.
  std::optional<std::size_t> output_position(std::string_view name) const {
    if (names_.forward_based) {
      for (const auto& [k, n] : bound_outputs_) {
        if (n == name) return k;
      }
      return names_.output_index(name);
    }
    if (spec_.config) {
      const auto& decls = spec_.config->outputs;
      for (std::size_t p = 0; p < decls.size(); ++p) {
        if (decls[p].name == name) return index_suffix(name).value_or(p);
      }
    }
    return index_suffix(name);
  }

  //! The name of output `i` of a model without forward-based names: the config's output
  //! whose name ends in `__<i>`, else the config's i-th output, else Triton's `OUTPUT__<i>`.
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

  //! Before the runner's parts go: waits on the host for the work queued on the runner's
  //! device, so that nothing the runs read (the weights, a mapped policy's pinned memory, a
  //! hook's tables) is freed or handed to the next load while kernels still read it. The
  //! runner cannot tell which streams its runs went to (the caller's, the pool's), so it
  //! waits for the device. Errors are dropped: a destructor has no one to report them to.
  void drain() const noexcept {
#if TORCHLOOM_HAS_CUDA
    if (!device_.is_cuda()) return;
    try {
      const c10::cuda::CUDAGuard on(device_);
      if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    } catch (const std::exception&) {
      (void)0;
    }
#endif
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
  std::optional<c10::Device> requested_;
  input_signature signature_;
  io_names names_;
  std::vector<std::pair<std::size_t, std::string>> bound_outputs_;
};

}  // namespace torchloom::detail
