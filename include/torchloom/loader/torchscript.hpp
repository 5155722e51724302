#pragma once
#include <torchloom/concepts/loader.hpp>
#include <torchloom/concepts/weight_access.hpp>
#include <torchloom/process_settings.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/loader/archive_check.hpp>
#include <torchloom/loader/tensor_storage.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/weights/weight_graph.hpp>
#include <torchloom/error.hpp>
#include <torchloom/model_format.hpp>

#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#if __has_include(<torch/csrc/jit/codegen/cuda/interface.h>)
#include <torch/csrc/jit/codegen/cuda/interface.h>
#define TORCHLOOM_HAS_NVFUSER_SWITCH 1
#else
#define TORCHLOOM_HAS_NVFUSER_SWITCH 0
#endif
#include <torch/script.h>

#include <c10/core/StreamGuard.h>

#include <filesystem>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

namespace torchloom {

//! A loaded TorchScript module with the per-model execution switches.
struct torchscript_model {
  torch::jit::Module module;
  bool optimized_execution = true;  //!< false: DISABLE_OPTIMIZED_EXECUTION
  std::vector<detail::setting_claim> settings;  //!< process-wide executor switches held
};

//! Loads TorchScript (`torch::jit::load(path, device)`), in eval mode, and honours the
//! execution switches: DISABLE_OPTIMIZED_EXECUTION (per run), ENABLE_JIT_EXECUTOR and
//! ENABLE_JIT_PROFILING (process-wide; conflicts between runners are detected). Works with
//! LibTorch 1.13 and 2.x.
struct torchscript_loader {
  using model_type = torchscript_model;
  static constexpr std::string_view default_filename = "model.pt";
  //! Triton's platform of the models it loads (see torchloom/platform.hpp).
  static constexpr std::string_view platform = "pytorch_libtorch";

  //! The options that change what load() makes (shared_weights shares only equal ones).
  static std::string load_key(const runner_options& o) {
    const auto flag = [](const std::optional<bool>& b) { return b ? (*b ? "1" : "0") : "-"; };
    return detail::concat("torchscript disable_optimized_execution=",
                          o.disable_optimized_execution, " jit_executor=",
                          flag(o.enable_jit_executor), " jit_profiling=",
                          flag(o.enable_jit_profiling), " tensor_fuser=",
                          flag(o.enable_tensor_fuser), " nvfuser=", flag(o.enable_nvfuser));
  }

  //! Throws model_not_found (no file), load_failed (not a TorchScript file, such as an
  //! AOTInductor package; a damaged archive: detail::check_torchscript_archive; torch failed
  //! to load it (torch's message is kept); or a tensor needs more bytes than its record holds),
  //! invalid_option (conflicting process settings).
  model_type load(const load_context& ctx) const {
    const auto& name = ctx.spec.name;
    const auto& opts = ctx.spec.options;
    detail::require_model_file(name, ctx.file);
    if (read_model_format(ctx.file) == model_format::aoti) {
      throw error(errc::load_failed, name,
                  detail::concat("'", ctx.file.string(),
                                 "' is an AOTInductor package, not a TorchScript archive: load "
                                 "it with aoti_loader (platform 'torch_aoti')"));
    }
    // Before torch reads it: torch's unpickler and reader trust what the archive declares.
    detail::check_torchscript_archive(name, ctx.file);
    model_type m;
    if (opts.enable_jit_executor) {
      const bool v = *opts.enable_jit_executor;
      m.settings.push_back(detail::setting_claim::make(
          "ENABLE_JIT_EXECUTOR", v ? "true" : "false", name,
          [v]() -> std::function<void()> {
            const bool before = torch::jit::getExecutorMode();
            torch::jit::getExecutorMode() = v;
            return [before] { torch::jit::getExecutorMode() = before; };
          }));
    }
    if (opts.enable_jit_profiling) {
      const bool v = *opts.enable_jit_profiling;
      m.settings.push_back(detail::setting_claim::make(
          "ENABLE_JIT_PROFILING", v ? "true" : "false", name,
          [v]() -> std::function<void()> {
            const bool before = torch::jit::getProfilingMode();
            torch::jit::getProfilingMode() = v;
            return [before] { torch::jit::getProfilingMode() = before; };
          }));
    }
    if (opts.enable_tensor_fuser) {
      const bool v = *opts.enable_tensor_fuser;
      m.settings.push_back(detail::setting_claim::make(
          "ENABLE_TENSOR_FUSER", v ? "true" : "false", name,
          [v]() -> std::function<void()> {
            const bool before = torch::jit::tensorExprFuserEnabled();
            torch::jit::setTensorExprFuserEnabled(v);
            return [before] { torch::jit::setTensorExprFuserEnabled(before); };
          }));
    }
    if (opts.enable_nvfuser) {
      const bool v = *opts.enable_nvfuser;
#if TORCHLOOM_HAS_NVFUSER_SWITCH
      m.settings.push_back(detail::setting_claim::make(
          "ENABLE_NVFUSER", v ? "true" : "false", name,
          [v]() -> std::function<void()> {
            const bool before = torch::jit::fuser::cuda::isEnabled();
            (void)torch::jit::fuser::cuda::setEnabled(v);
            return [before] { (void)torch::jit::fuser::cuda::setEnabled(before); };
          }));
#else
      m.settings.push_back(detail::setting_claim::make(
          "ENABLE_NVFUSER", v ? "true" : "false", name, [v, &name]() -> std::function<void()> {
            if (v) {
              throw error(errc::unsupported, name,
                          "ENABLE_NVFUSER=true: this LibTorch has no nvFuser");
            }
            return {};
          }));
#endif
    }
    // KIND_MODEL: the devices the model was saved with stand (a model across GPUs). Residency
    // policies that load on the host and place the weights themselves pass a CPU device.
    const bool keep_devices = ctx.spec.model_placement() && !ctx.device.is_cpu();
    c10::optional<c10::Device> device;
    if (!keep_devices) device = ctx.device;
    std::shared_ptr<detail::recording_reader> reader;
    try {
      // A zip archive goes through a reader that notes what it read, for the storage
      // check below; anything else (a flatbuffer module) is torch's to recognise.
      reader = std::make_shared<detail::recording_reader>(ctx.file.string());
      char magic[2] = {};
      if (reader->size() >= 2 && reader->read(0, magic, 2, "magic") == 2 && magic[0] == 'P' &&
          magic[1] == 'K') {
        m.module = torch::jit::load(reader, device);
      } else {
        reader.reset();
        m.module = torch::jit::load(ctx.file.string(), device);
      }
    } catch (const error& e) {  // the reader could not open the file
      throw error(errc::load_failed, name,
                  detail::concat("cannot load TorchScript file '", ctx.file.string(),
                                 "': ", e.message()));
    } catch (const std::exception& e) {
      throw error(errc::load_failed, name,
                  detail::concat("cannot load TorchScript file '", ctx.file.string(),
                                 "': ", detail::torch_message(e)));
    }
    // Before anything runs: a tensor that spans more than its record would be read past.
    if (reader) detail::check_module_storages(name, ctx.file.string(), m.module, *reader);
    if (!m.module.find_method("forward")) {
      throw error(errc::load_failed, name,
                  detail::concat("'", ctx.file.string(), "' has no forward method"));
    }
    m.module.eval();
    m.optimized_execution = !opts.disable_optimized_execution;
    return m;
  }

  //! KIND_MODEL: the device of the model's first parameter (or buffer), where its inputs go.
  std::optional<c10::Device> model_device(const model_type& m) const {
    for (const auto& p : m.module.parameters()) return p.device();
    for (const auto& b : m.module.buffers()) return b.device();
    return std::nullopt;
  }

  //! The forward method's arguments (without self), from its schema.
  input_signature signature(const model_type& m) const {
    input_signature sig;
    const auto method = m.module.find_method("forward");
    const auto& args = method->function().getSchema().arguments();
    for (std::size_t i = 1; i < args.size(); ++i) {  // argument 0 is self
      input_spec s;
      s.name = args[i].name();
      s.type = args[i].type();
      s.is_tensor = s.type->kind() == c10::TypeKind::TensorType;
      s.has_default = args[i].default_value().has_value();
      sig.push_back(std::move(s));
    }
    return sig;
  }

  //! Runs forward on `rc.stream`, which it makes current: TorchScript launches on the current
  //! stream. A CPU device has no stream to set.
  c10::IValue run(model_type& m, std::vector<c10::IValue>&& inputs, const run_context& rc) const {
    std::optional<c10::StreamGuard> on_stream;
    if (!rc.device.is_cpu()) on_stream.emplace(rc.stream);
    if (m.optimized_execution) return m.module.forward(std::move(inputs));
    // The graph executor's optimisation switch is thread-local in torch: set it per run.
    torch::jit::GraphOptimizerEnabledGuard optimize(false);
    return m.module.forward(std::move(inputs));
  }
};

static_assert(loader<torchscript_loader>);

//! What the residency policies may do with a TorchScript module's weights, for
//! torchscript_loader and every loader derived from it that keeps its model type: load it on
//! the host, rewrite its forward's weight reads into fetches (torchloom/weights/weight_graph.hpp),
//! run it without the graph executor's optimisation passes, and count its tensor attributes'
//! bytes on a device. See torchloom/concepts/weight_access.hpp.
template <class Loader>
  requires std::derived_from<Loader, torchscript_loader> &&
           std::same_as<typename Loader::model_type, torchscript_model>
struct weight_access<Loader> {
  //! Loads through `l` with a CPU device: the weights are never all on the device at once.
  static torchscript_model load_on_host(const Loader& l, const load_context& ctx) {
    return l.load(load_context{ctx.spec, ctx.file, c10::Device(c10::kCPU), ctx.graph_capture});
  }

  //! detail::rewrite_weight_reads on the module's forward.
  static detail::weight_rewrite rewrite_weight_reads(torchscript_model& m,
                                                     const detail::weight_source& source,
                                                     const std::string& model) {
    return detail::rewrite_weight_reads(m.module, source, model);
  }

  //! Every later run goes as with DISABLE_OPTIMIZED_EXECUTION (the loader's run() sets the
  //! executor's switch per run).
  static void run_unoptimised(torchscript_model& m) noexcept { m.optimized_execution = false; }

  //! The executor's optimisation switch off on the calling thread (torch keeps it
  //! thread-local) while it lives.
  struct unoptimised_scope {
    torch::jit::GraphOptimizerEnabledGuard guard{false};
  };

  //! The bytes of the module's tensor attributes on `device`, each storage once.
  static std::int64_t device_bytes(const torchscript_model& m, c10::Device device) {
    std::int64_t bytes = 0;
    std::unordered_set<const void*> seen;
    for (const auto& a : m.module.named_attributes(/*recurse=*/true)) {
      if (!a.value.isTensor()) continue;
      const auto& t = a.value.toTensor();
      if (!t.defined() || !t.has_storage() || t.device() != device) continue;
      if (seen.insert(t.storage().data_ptr().get()).second) {
        bytes += static_cast<std::int64_t>(t.storage().nbytes());
      }
    }
    return bytes;
  }
};

static_assert(rewritable_weights<torchscript_loader> && measurable_weights<torchscript_loader>);

}  // namespace torchloom
