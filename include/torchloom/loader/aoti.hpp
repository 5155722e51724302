#pragma once
#include <torchloom/concepts/loader.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/io_names.hpp>
#include <torchloom/loader/aoti_call_spec.hpp>
#include <torchloom/loader/aoti_metadata.hpp>
#include <torchloom/options/aoti_options.hpp>
#include <torchloom/signature.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <boost/mp11/list.hpp>

#include <string_view>
#include <vector>

#if TORCHLOOM_TORCH_VERSION >= 20600
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torchloom/concepts/weight_access.hpp>
#include <torchloom/loader/aoti_container.hpp>
#include <torchloom/loader/aoti_model.hpp>
#include <torchloom/loader/aoti_package.hpp>
#include <torchloom/loader/aoti_package_weights.hpp>
#include <torchloom/loader/aoti_weight_access.hpp>
#include <torchloom/loader/aoti_weights.hpp>
#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#else
#include <torchloom/loader/aoti_unavailable.hpp>
#endif

namespace torchloom {

#if TORCHLOOM_TORCH_VERSION >= 20600

//! Loads an AOTInductor package (`.pt2`, made by `torch._inductor.aoti_compile_and_package`)
//! with `torch::inductor::AOTIModelPackageLoader`, and runs it on the stream the stream
//! policy chose. Options: AOTI_MODEL_NAME (the model inside the package, default "model"),
//! AOTI_NUM_RUNNERS (1, the default: torch's single-threaded runner behind a lock held for a
//! call's launch only, so calls from several streams overlap on the GPU and none waits on the
//! host for the one before; N > 1: torch's container of N model instances, each of which waits
//! on the host for its previous call before it takes the next). The package must
//! have been compiled for the runner's device type (cpu or cuda); a CUDA package runs on the
//! runner's GPU index.
//!
//! Inputs are checked against what the package carries: their count (and names) from the
//! model, the device from its device key, and dtypes and shapes when its metadata declares
//! them under `torchloom.inputs` ("x:float32[-1,64];ids:int64[-1]"; set at compile time with
//! `inductor_configs={"aot_inductor.metadata": {"torchloom.inputs": ...}}`); a config.pbtxt
//! can declare them too. The package itself records no input dtypes: without either
//! declaration only the count and the device are checked, and WARMUP_ITERATIONS cannot
//! synthesise inputs. Needs LibTorch >= 2.6.
struct aoti_loader {
  using model_type = aoti_model;
  //! The options this loader reads (a runner with another loader refuses them).
  using option_blocks = boost::mp11::mp_list<aoti_options>;
  static constexpr std::string_view default_filename = "model.pt2";
  //! Triton's platform of the models it loads (see torchloom/platform.hpp).
  static constexpr std::string_view platform = "torch_aoti";

  //! The options that change what load() makes (shared_weights shares only equal ones).
  static std::string load_key(const aoti_options& o) {
    return detail::concat("aoti model=", o.aoti_model_name,
                          " runners=", o.aoti_num_runners.value);
  }

  //! Throws model_not_found (no file), load_failed (not a zip archive; torch could not load
  //! it, its message kept; a malformed declaration), unsupported (a package for another
  //! device type; AOTI_NUM_RUNNERS > 1 where this LibTorch cannot).
  //! A package exported for streaming (scripts/torchloom_export.py) gets its weights from
  //! `weights.pt` beside it, copied to the device; load_failed when that file is missing or
  //! does not match the package.
  model_type load(const load_context& ctx) const { return load_package(ctx, true); }

  //! For mapped_weights: a package exported for streaming with its weights left in host
  //! memory (weight_access's constants() returns them; the device holds one-element
  //! placeholders until they are swapped), any other package as load() loads it.
  model_type load_keeping_host_weights(const load_context& ctx) const {
    return load_package(ctx, false);
  }

  //! For streamed_weights: a package exported for streaming, with its weights installed in
  //! host memory (the policy places them). unsupported for another package.
  model_type load_streamable(const load_context& ctx) const {
    model_type m = load_package(ctx, false);
    if (!m.reads) {
      throw error(errc::unsupported, ctx.spec.name,
                  detail::concat("streamed_weights: AOTInductor package '", ctx.file.string(),
                                 "' was not exported for streaming (it has no '",
                                 detail::aoti_stream_weights_key,
                                 "' metadata): export it with scripts/torchloom_export.py "
                                 "(offload on), or use mapped_weights"));
    }
    return m;
  }

 private:
  model_type load_package(const load_context& ctx, bool weights_on_device) const {
    const std::string& name = ctx.spec.name;
    const std::string file = ctx.file.string();
    detail::check_package_file(name, ctx.file);
    if (ctx.spec.model_placement()) {
      throw error(errc::unsupported, name,
                  "instance_group KIND_MODEL: an AOTInductor package is compiled for one "
                  "device; use KIND_GPU or KIND_CPU, or a TorchScript model");
    }
    const aoti_options& opts = ctx.spec.options;
    model_type m;
    const bool single_threaded = ctx.graph_capture || opts.aoti_num_runners.value == 1;
    std::vector<std::string> call_spec;
    std::optional<std::vector<std::string>> container;
    std::optional<std::size_t> output_count;
    try {
      // A package exported for streaming calls it; torch resolves its calls at load.
      detail::register_stream_weight_op();
      const std::lock_guard lock(detail::package_load_mutex());
      std::optional<c10::DeviceGuard> on_device;
      if (ctx.device.is_cuda()) on_device.emplace(ctx.device);
      m.package = detail::make_package_loader<torch::inductor::AOTIModelPackageLoader>(
          name, file, opts.aoti_model_name, static_cast<std::size_t>(opts.aoti_num_runners),
          ctx.device, single_threaded);
      if (single_threaded) m.single_run = std::make_unique<std::mutex>();
      m.metadata = m.package->get_metadata();
      call_spec = m.package->get_call_spec();
      container = detail::container_inputs::read(m.package->get_runner());
      output_count = detail::container_outputs::count(m.package->get_runner());
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string why = detail::torch_message(e);
      // torch checks the device type itself, before the metadata can be read (torch 2.11:
      // "Incorrect device passed to aoti_runner_cpu").
      constexpr std::string_view wrong_device = "Incorrect device passed to aoti_runner_";
      if (const auto pos = why.find(wrong_device); pos != std::string::npos) {
        const std::string kind = why.substr(pos + wrong_device.size(),
                                            why.find_first_of(" \n.", pos + wrong_device.size()) -
                                                (pos + wrong_device.size()));
        check_device(name, file, {{"AOTI_DEVICE_KEY", kind}}, ctx.device);
      }
      throw error(errc::load_failed, name,
                  detail::concat("cannot load AOTInductor package '", file, "' (model name '",
                                 opts.aoti_model_name, "'): ", why));
    }
    check_device(name, file, m.metadata, ctx.device);
    m.inputs = declared_inputs(name, file, m.metadata, call_spec, container);
    m.names = detail::name_call_spec(call_spec, container, output_count);
    m.device = ctx.device;
    if (m.metadata.contains(std::string(detail::aoti_stream_weights_key))) {
      install_package_weights(m, ctx, weights_on_device);
    }
    return m;
  }

  // A package exported for streaming: reads weights.pt and installs its tensors as the
  // package's constants (user-managed: the model keeps them), on the device or on the host.
  static void install_package_weights(model_type& m, const load_context& ctx, bool on_device) {
    const std::string& name = ctx.spec.name;
    const std::filesystem::path file = ctx.file.parent_path() / detail::aoti_weights_file;
    ctx.spec.require_inside(file, "the package's weights file", errc::load_failed);
    // Each weight by its names (tied tensors share one); the package keeps one of them.
    detail::package_weights read = detail::read_package_weights(
        name, file,
        detail::parse_stream_weights(
            name, m.metadata.at(std::string(detail::aoti_stream_weights_key))),
        detail::container_constants::read(m.package->get_runner()));
    std::vector<at::Tensor> tensors = std::move(read.tensors);
    std::vector<std::string> names = std::move(read.names);
    // On the host (streamed_weights), the package gets placeholders on its device, each one
    // element seen with the weight's shape: it only passes them to the fetch operator, which
    // serves its reads from the policy's arena.
    std::vector<at::Tensor> placeholders;
    try {
      std::unordered_map<std::string, at::Tensor> constants;
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (on_device) {
          tensors[i] = tensors[i].to(ctx.device);
          constants.emplace(names[i], tensors[i]);
          continue;
        }
        const at::Tensor& t = tensors[i];
        placeholders.push_back(
            at::empty({1}, t.options().device(ctx.device))
                .as_strided(t.sizes(), std::vector<std::int64_t>(t.sizes().size(), 0)));
        constants.emplace(names[i], placeholders.back());
      }
      std::optional<c10::DeviceGuard> guard;
      if (ctx.device.is_cuda()) guard.emplace(ctx.device);
      auto views = detail::unowned_views(constants);  // the model keeps the owners
      detail::install_user_constants(*m.package, views);
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      throw error(errc::load_failed, name,
                  detail::concat("cannot install the package's weights from '", file.string(),
                                 "': ", detail::torch_message(e)));
    }
    m.weights = on_device ? std::move(tensors) : std::move(placeholders);
    if (!on_device) {
      m.weights_on_host = std::move(tensors);
      m.reads = std::make_unique<detail::package_reads>(name, std::move(names), ctx.device);
    }
  }

 public:

  //! The inputs load() found.
  input_signature signature(const model_type& m) const { return m.inputs; }

  //! The forward-based names of the package's inputs and outputs, from its call spec (see
  //! detail::name_call_spec).
  io_names names(const model_type& m) const { return m.names; }

  //! Runs on `rc.stream` of `rc.device`. One output comes back as a Tensor, several as a
  //! tuple (run() flattens both).
  c10::IValue run(model_type& m, std::vector<c10::IValue>&& inputs, const run_context& rc) const {
    std::vector<at::Tensor> tensors;
    tensors.reserve(inputs.size());
    for (auto& v : inputs) tensors.push_back(std::move(v).toTensor());
    // The inputs are ours: boxed_run (where this LibTorch has it) takes them over instead of
    // copying a handle to each, and may free them early.
    std::vector<at::Tensor> out = call(m, rc, [&](auto& package, void* stream) {
      if constexpr (requires { package.boxed_run(std::move(tensors), stream); }) {
        return package.boxed_run(std::move(tensors), stream);  // torch 2.7+
      } else {
        return package.run(tensors, stream);
      }
    });
    if (out.size() == 1) return c10::IValue(std::move(out.front()));
    std::vector<c10::IValue> elements;
    elements.reserve(out.size());
    for (auto& t : out) elements.emplace_back(std::move(t));
    return c10::ivalue::Tuple::create(std::move(elements));
  }

  //! The same on tensors, unboxed (model_runner::run_tensors): the caller keeps its inputs.
  std::vector<at::Tensor> run_tensors(model_type& m, const std::vector<at::Tensor>& inputs,
                                      const run_context& rc) const {
    return call(m, rc, [&](auto& package, void* stream) { return package.run(inputs, stream); });
  }

 private:
  // Calls `run(package, stream_handle)` on the stream the policy chose.
  template <class Run>
  static std::vector<at::Tensor> call(model_type& m, const run_context& rc, Run&& run) {
    std::unique_lock<std::mutex> one_at_a_time;
    if (m.single_run) one_at_a_time = std::unique_lock(*m.single_run);
    detail::package_reads* reads = m.reads && m.reads->serving() ? m.reads.get() : nullptr;
    if (reads != nullptr) reads->begin();
    const detail::active_reads_scope serving(reads);
    try {
      if (rc.device.is_cuda()) {
#if TORCHLOOM_HAS_CUDA
        // With a null handle AOTI would take the current stream of the *current* device.
        const c10::DeviceGuard on_device(rc.device);
        return run(*m.package, static_cast<void*>(c10::cuda::CUDAStream(rc.stream).stream()));
#else
        // No CUDA headers here: make the chosen stream (and its device) current, which AOTI
        // takes when given no handle.
        const c10::StreamGuard on_stream(rc.stream);
        return run(*m.package, nullptr);
#endif
      }
      return run(*m.package, nullptr);
    } catch (const std::exception& e) {
      // A weight read's own error (streamed_weights), which the package reports only as a
      // failed call.
      if (reads != nullptr && reads->failure()) std::rethrow_exception(reads->failure());
      const std::string why = detail::torch_message(e);
      if (why.find("API call failed") == std::string::npos) throw;
      // The package's own error (an operator's message, say) does not reach here: AOTInductor
      // logs it to stderr and returns a status. Say where to look. The model's name is not
      // known here: the runner adds it.
      throw error(errc::run_failed, "",
                  detail::concat("run failed: ", why,
                                 " (AOTInductor passes on only that the call failed; the error "
                                 "itself, such as a custom operator's message, was logged to "
                                 "stderr)"));
    }
  }

  // "arg<N>_<M>": a flattened graph input's name after torch's tracing.
  static bool is_generated_name(std::string_view n) {
    if (n.substr(0, 3) != "arg") return false;
    const auto underscore = n.find('_', 3);
    const auto digits = [](std::string_view d) {
      return !d.empty() && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    return underscore != std::string_view::npos && digits(n.substr(3, underscore - 3)) &&
           digits(n.substr(underscore + 1));
  }

  static void check_device(const std::string& name, const std::string& file,
                           const std::unordered_map<std::string, std::string>& metadata,
                           c10::Device device) {
    const auto key = metadata.find("AOTI_DEVICE_KEY");
    if (key == metadata.end()) return;  // torch refuses such a package before this
    const bool cuda_package = key->second == "cuda";
    if (key->second != "cpu" && !cuda_package) {
      throw error(errc::unsupported, name,
                  detail::concat("AOTInductor package '", file, "' was compiled for '", key->second,
                                 "'; torchloom runs cpu and cuda packages"));
    }
    if (cuda_package != device.is_cuda()) {
      throw error(errc::unsupported, name,
                  detail::concat("AOTInductor package '", file, "' was compiled for ", key->second,
                                 " but the runner is on ", device,
                                 "; compile it for that device or load it on ",
                                 cuda_package ? "cuda:N" : "cpu"));
    }
  }

  // Count and names from the model container (the count from the call spec's input tree
  // when the container cannot be read); the `torchloom.inputs` metadata entry, if any, must
  // agree on the count and adds names, dtypes and shapes.
  static input_signature declared_inputs(
      const std::string& name, const std::string& file,
      const std::unordered_map<std::string, std::string>& metadata,
      const std::vector<std::string>& call_spec,
      const std::optional<std::vector<std::string>>& container) {
    input_signature sig;
    if (container) {
      sig.resize(container->size());
      for (std::size_t i = 0; i < sig.size(); ++i) {
        // Names torch made up (arg4_1) say nothing to a user: a config.pbtxt name, if any,
        // takes their place, else errors give the position alone.
        if (!is_generated_name((*container)[i])) sig[i].name = (*container)[i];
      }
    } else {
      const auto leaves =
          call_spec.empty() ? std::nullopt : detail::count_pytree_leaves(call_spec.front());
      if (!leaves) {
        throw error(errc::load_failed, name,
                    detail::concat("AOTInductor package '", file,
                                   "': cannot tell how many inputs it takes (no readable call "
                                   "spec)"));
      }
      sig.resize(*leaves);
    }
    const auto entry = metadata.find(std::string(detail::aoti_inputs_key));
    if (entry == metadata.end()) return sig;
    input_signature declared;
    try {
      declared = detail::parse_declared_inputs(entry->second);
    } catch (const error& e) {
      throw error(errc::load_failed, name,
                  detail::concat("AOTInductor package '", file, "': its '", detail::aoti_inputs_key,
                                 "' metadata is malformed: ", e.message()));
    }
    if (declared.size() != sig.size()) {
      throw error(
          errc::load_failed, name,
          detail::concat("AOTInductor package '", file, "' takes ", sig.size(), " inputs but its '",
                         detail::aoti_inputs_key, "' metadata declares ", declared.size()));
    }
    return declared;  // its names too: they are the ones the package's author chose
  }
};

static_assert(loader<aoti_loader>);
static_assert(tensor_loader<aoti_loader>);

static_assert(swappable_constants<aoti_loader>);
static_assert(rewritable_weights<aoti_loader>);
static_assert(measurable_weights<aoti_loader>);

#endif

}  // namespace torchloom
