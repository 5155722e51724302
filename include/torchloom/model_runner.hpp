#pragma once
#include <torchloom/concepts/hook_policy.hpp>
#include <torchloom/concepts/loader.hpp>
#include <torchloom/concepts/residency_policy.hpp>
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/context.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/policy_stand_in.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/hook/no_hook.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/process_settings.hpp>
#include <torchloom/residency/resident.hpp>
#include <torchloom/runner/inputs.hpp>
#include <torchloom/runner/model_op_libraries.hpp>
#include <torchloom/runner/runner_core.hpp>
#include <torchloom/runner/torch_settings.hpp>
#include <torchloom/runner/warm_up.hpp>
#include <torchloom/signature.hpp>
#include <torchloom/stream/caller.hpp>
#include <torchloom/weights/weight_memory.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <exception>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom {

//! A model runner composed from four policies, checked at compile time:
//!  - Loader: how the model file becomes something callable (torchscript_loader, ...);
//!  - Hook: native init that runs before the model loads (no_hook, static_hook, dlopen_hook);
//!  - Stream: on which CUDA stream it runs (caller_stream, pool_stream, ...);
//!  - Residency: where the weights live (resident_weights, shared_weights, ...).
//! Construction runs in steps: the options and the device, the process-wide torch settings,
//! the op libraries, the hook, the stream policy, loading the model and placing its weights,
//! the model's own device (KIND_MODEL), the inputs config.pbtxt declares, warm-up; each step
//! undoes the earlier ones when it fails. Destruction runs in reverse.
//! run() may be called from several threads at once. Not copyable or movable: a runner owns
//! hook state and device resources; hold it in a std::unique_ptr to move it.
template <class Loader, class Hook = no_hook, class Stream = caller_stream,
          class Residency = resident_weights>
class model_runner {
  static_assert(loader<Loader>,
                "torchloom: Loader must satisfy torchloom::loader; see "
                "torchloom/concepts/loader.hpp");
  static_assert(hook_policy<Hook>,
                "torchloom: Hook must satisfy torchloom::hook_policy; see "
                "torchloom/concepts/hook_policy.hpp");
  static_assert(stream_policy<Stream>,
                "torchloom: Stream must satisfy torchloom::stream_policy; see "
                "torchloom/concepts/stream_policy.hpp");
  static_assert(!loader<Loader> || residency_policy_for<Residency, Loader>,
                "torchloom: Residency must satisfy torchloom::residency_policy_for<Loader>; "
                "see torchloom/concepts/residency_policy.hpp");
  static_assert(!detail::captures_graphs<Stream> || detail::graph_capturable<Residency>,
                "torchloom: graphed<Stream> cannot be combined with this Residency: a "
                "captured CUDA graph replays the first run's copies to the same addresses, and "
                "streamed_weights decides on the host, at every run, which weight goes where "
                "in its ring; use resident_weights, shared_weights or mapped_weights with "
                "graphed, or the plain stream policy with streamed_weights");

 public:
  using loader_type = Loader;
  using hook_type = Hook;
  using stream_type = Stream;
  using residency_type = Residency;
  using model_type = typename detail::model_type_of<Loader>::type;

  //! Loads `spec` on the device its config.pbtxt's instance_group names (KIND_CPU: cpu,
  //! KIND_GPU: the first of `gpus`, KIND_MODEL: the model's own placement; cpu without an
  //! instance_group or with KIND_AUTO). Throws torchloom::error: invalid_option (among them an
  //! option that none of the runner's policies reads), model_not_found, hook_failed,
  //! load_failed, unsupported (e.g. a CUDA device without CUDA).
  explicit model_runner(model_spec spec)
      : model_runner(construct_tag{}, std::string(spec.name), std::move(spec), std::nullopt) {}

  //! Loads `spec` on `device`, which must agree with config.pbtxt's instance_group where
  //! there is one (invalid_option naming both otherwise). Throws as above.
  model_runner(model_spec spec, c10::Device device)
      : model_runner(construct_tag{}, std::string(spec.name), std::move(spec),
                     std::optional<c10::Device>(device)) {}

  model_runner(const model_runner&) = delete;
  model_runner& operator=(const model_runner&) = delete;

  //! Waits for the work the runner's runs queued on its device (on a CUDA device: the device's
  //! queued work, see detail::runner_core::drain), then destroys its parts in reverse order:
  //! the residency state and the model, the stream policy, the hook (its fini), the op
  //! libraries. Outputs already handed out stay valid.
  ~model_runner() { core_.drain(); }

  //! Runs the model and returns its output tensors (a tuple or list output is flattened).
  //! CPU inputs are moved to the runner's device. Throws bad_input (nothing is launched and
  //! the runner stays usable), run_failed (torch raised while running; its message is kept).
  std::vector<at::Tensor> run(std::vector<c10::IValue> inputs) {
    const c10::IValue out = run_ivalue(std::move(inputs));
    std::vector<at::Tensor> tensors;
    tensors.reserve(out.isTuple() ? out.toTupleRef().elements().size() : 1);
    detail::flatten_tensors(core_.name(), out, tensors);
    return tensors;
  }

  //! Runs the model and returns its output as torch returned it.
  c10::IValue run_ivalue(std::vector<c10::IValue> inputs) {
    return guarded([&] {
      // Inside: moving CPU inputs to the device can fail (out of memory).
      detail::check_inputs(core_.name(), core_.signature(), inputs, core_.device());
      // One way: the inputs go to the stream policy, which hands them (or, graphed, buffers
      // of its own) to the body, which hands them to the loader.
      return stream_.execute(core_.device(), std::move(inputs),
                             [this](const run_context& rc, std::vector<c10::IValue>&& in) {
                               return weights_.execute([&](model_type& m) {
                                 return loader_.run(m, std::move(in), rc);
                               });
                             });
    });
  }

  //! run() for a model whose inputs are all tensors, without boxing them into IValues: with
  //! a loader that runs on tensors (aoti_loader) the inputs and outputs pass straight
  //! through, the least a call can cost; with others it is run(). Same checks and errors as
  //! run(); an input the model declares as another type is bad_input.
  std::vector<at::Tensor> run_tensors(const std::vector<at::Tensor>& inputs) {
    if constexpr (!tensor_loader<Loader>) {
      return run(std::vector<c10::IValue>(inputs.begin(), inputs.end()));
    } else {
      return guarded([&] {
        const auto moved =
            detail::check_tensor_inputs(core_.name(), core_.signature(), inputs, core_.device());
        // Lent, not copied: the caller's tensors (or the moved ones) outlive the run.
        return stream_.execute(core_.device(), lent_tensors(moved ? *moved : inputs),
                               [this](const run_context& rc, lent_tensors&& in) {
                                 return weights_.execute([&](model_type& m) {
                                   return loader_.run_tensors(m, in.get(), rc);
                                 });
                               });
      });
    }
  }

  //! Runs the model with its inputs given by name and returns its outputs by name, under
  //! Triton's conventions: an input is the forward argument of that name, else the one its
  //! `<NAME>__<index>` suffix says, else the config.pbtxt input of that name (the config's
  //! order being the forward's). Output `i` (an element of a tuple output, or the one
  //! output) is called by the config's output ending in `__<i>`, else the config's `i`-th
  //! output, else `OUTPUT__<i>`. A model whose one argument is a `Dict[str, Tensor]` gets the
  //! inputs as that dict, keyed by their names (Triton's convention for such models).
  //! An AOTInductor package takes Triton 26.05's names as well: `ARGS[i]`, `ARGS[i][key]`,
  //! `KWARGS[name]` and `INPUT__<i>` for its flattened inputs, and returns each output under
  //! the config's name for it, else its forward-based name (`RESULT`, `RESULT[key]`,
  //! `RESULT[key][j]`; `OUTPUT__<i>` where it has none). Throws bad_input naming an input the
  //! model does not have (and why, for a value torch fixed at export) or one that is
  //! missing; otherwise as run_ivalue().
  std::map<std::string, c10::IValue> run_named(const std::map<std::string, c10::IValue>& inputs) {
    const auto& sig = core_.signature();
    if (sig.size() == 1 && sig[0].type && sig[0].type->kind() == c10::TypeKind::DictType &&
        inputs.count(sig[0].name) == 0) {
      c10::Dict<std::string, at::Tensor> dict;
      for (const auto& [name, value] : inputs) {
        if (!value.isTensor()) {
          throw error(errc::bad_input, core_.name(),
                      detail::concat("input '", detail::printable(name, 64),
                                     "' must be a Tensor (the model takes a Dict[str, Tensor]), "
                                     "got ", detail::describe_ivalue(value)));
        }
        dict.insert(name, value.toTensor());
      }
      return name_outputs(run_ivalue({c10::IValue(std::move(dict))}));
    }
    std::vector<c10::IValue> positional(sig.size());
    std::vector<bool> given(sig.size(), false);
    for (const auto& [name, value] : inputs) {
      const auto pos = core_.input_position(name);
      if (!pos) {
        std::vector<std::string> names;
        for (const auto& s : sig) names.push_back(s.name);
        for (const auto& n : core_.names().inputs) names.push_back(n);
        const std::string why = core_.why_no_input(name);
        throw error(errc::bad_input, core_.name(),
                    detail::concat("no input is called '", detail::printable(name, 64), "'",
                                   why.empty() ? detail::did_you_mean(name, names)
                                               : detail::concat(": ", why)));
      }
      if (given[*pos]) {
        throw error(errc::bad_input, core_.name(),
                    detail::concat("'", name, "' and another name both give ",
                                   detail::input_label(sig, *pos)));
      }
      positional[*pos] = value;
      given[*pos] = true;
    }
    std::size_t count = sig.size();
    while (count > 0 && !given[count - 1] && sig[count - 1].has_default) --count;
    for (std::size_t i = 0; i < count; ++i) {
      if (!given[i]) {
        const auto& forward = core_.names().inputs;
        throw error(errc::bad_input, core_.name(),
                    detail::concat("run_named: no value for ", detail::input_label(sig, i),
                                   i < forward.size() && forward[i] != sig[i].name
                                       ? detail::concat(", ", forward[i])
                                       : std::string()));
      }
    }
    positional.resize(count);
    return name_outputs(run_ivalue(std::move(positional)));
  }

  //! The model's name (from config.pbtxt, else the directory or file name).
  const std::string& name() const noexcept { return core_.name(); }
  //! What the runner was built from, options included.
  const model_spec& spec() const noexcept { return core_.spec(); }
  const runner_options& options() const noexcept { return core_.options(); }
  c10::Device device() const noexcept { return core_.device(); }
  //! The declared inputs run() checks against.
  const input_signature& inputs() const noexcept { return core_.signature(); }
  //! The forward-based names of the model's inputs and outputs (an AOTInductor package's;
  //! empty for other models).
  const io_names& names() const noexcept { return core_.names(); }
  //! The input position a request's name stands for, by run_named's rules; nothing when none.
  std::optional<std::size_t> input_index(std::string_view name) const {
    return core_.input_position(name);
  }
  //! The output position a request's name stands for (a name run_named returns it under, or
  //! for a package any of its forward-based and ordinal names); nothing when none.
  std::optional<std::size_t> output_index(std::string_view name) const {
    return core_.output_position(name);
  }
  //! The stream policy (e.g. graphed<S>::stats()).
  const Stream& stream() const noexcept { return stream_; }
  //! The loaded model (for inspection; run() is the way to call it).
  const model_type& model() const noexcept { return weights_.model(); }
  //! How much memory the weights take: device bytes, and for streamed_weights the most in
  //! flight at once and the budget checks (see weight_memory).
  weight_memory memory() const {
    if constexpr (requires { weights_.memory(); }) {
      return weights_.memory();
    } else {
      return detail::loaded_weight_memory<Loader>(weights_.model(), core_.device());
    }
  }

 private:
  // run_named's outputs: each element of a tuple output, or the one output, by its names.
  std::map<std::string, c10::IValue> name_outputs(const c10::IValue& out) const {
    std::map<std::string, c10::IValue> named;
    const auto add = [&](std::size_t i, const c10::IValue& v) {
      for (auto& n : core_.output_names(i)) named[std::move(n)] = v;
    };
    if (out.isTuple()) {
      const auto& elements = out.toTupleRef().elements();
      for (std::size_t i = 0; i < elements.size(); ++i) add(i, elements[i]);
    } else {
      add(0, out);
    }
    return named;
  }

  struct construct_tag {};
  // Construction, one step per member and then three in the body; each member's constructor
  // undoes itself when it fails, and the members built before it are destroyed (in reverse)
  // before the handler runs. Every step's own errors are torchloom::error already; anything
  // else that escapes a policy or torch (a c10::Error, std::bad_alloc) becomes load_failed
  // naming the model.
  model_runner(construct_tag, std::string name, model_spec&& spec,
               std::optional<c10::Device> device) try
      : core_(checked_spec(std::move(spec)), device),  // the options and the device
        settings_(core_.spec()),                       // process-wide torch settings
        libraries_(core_.spec()),                      // OP_LIBRARIES
        hook_(core_.context()),                        // the hook's init
        stream_(core_.context()),                      // the stream policy's streams
        weights_(loader_, load_context_for_stream()) {  // load, place the weights
    if constexpr (requires { loader_.model_device(weights_.model()); }) {
      core_.adopt_model_device(loader_.model_device(weights_.model()));  // KIND_MODEL
    }
    input_signature sig = loader_.signature(weights_.model());
    if constexpr (requires { loader_.names(weights_.model()); }) {
      io_names names = loader_.names(weights_.model());
      if (core_.spec().config) {
        // Which call-spec leaves are the package's inputs, where only the config can say.
        std::vector<std::string> declared;
        for (const auto& d : core_.spec().config->inputs) declared.push_back(d.name);
        names.resolve_inputs(declared, sig.size());
      }
      core_.set_names(std::move(names));  // binds the config's outputs
    }
    if (core_.spec().config) {
      sig = detail::merge_config_inputs(std::move(sig), *core_.spec().config, core_.name(),
                                        core_.names());
    }
    core_.set_signature(std::move(sig));
    detail::warm_up(core_, [this](std::vector<c10::IValue> in) { run_ivalue(std::move(in)); });
  } catch (const error&) {
    throw;
  } catch (const std::exception& e) {
    throw error(errc::load_failed, name,
                detail::concat("construction failed: ", detail::torch_message(e)));
  }

  // Options that only some policy reads must meet a policy of this runner that reads them:
  // otherwise they would be ignored without a word (a hook library that never runs). A model
  // of the other platform must not reach this runner's loader, whose torch call would fail
  // with a message about the archive's insides.
  static model_spec checked_spec(model_spec spec) {
    if constexpr (requires { std::string_view(Loader::platform); }) {
      const std::string_view mine = Loader::platform;
      const model_platform& theirs = spec.platform;
      if (!theirs.name.empty() && theirs.name != mine) {
        const std::string where =
            theirs.line > 0
                ? detail::concat((spec.directory / "config.pbtxt").string(), ":", theirs.line,
                                 ": ")
                : std::string();
        throw error(errc::invalid_option, spec.name,
                    detail::concat(where, theirs.reason, " calls for ",
                                   describe(format_of_platform(theirs.name)), " (platform '",
                                   theirs.name, "'), but this runner's loader reads ",
                                   describe(format_of_platform(mine)), " (platform '", mine,
                                   "'): use model_runner<",
                                   theirs.name == aoti_platform ? "aoti_loader"
                                                                : "torchscript_loader",
                                   ", ...> (torchloom::loader_for(spec) says which loader a "
                                   "model calls for)"));
      }
    }
    const runner_options defaults{};
    for (const auto& [key, readers] : policy_option_readers()) {
      if (get_option(spec.options, key) == get_option(defaults, key)) continue;
      if (detail::reads_option<Loader>(key) || detail::reads_option<Hook>(key) ||
          detail::reads_option<Stream>(key) || detail::reads_option<Residency>(key)) {
        continue;
      }
      throw error(errc::invalid_option, spec.name,
                  detail::concat("option ", key, "='",
                                 detail::printable(get_option(spec.options, key), 64),
                                 "' is read only by ", readers,
                                 ", which this runner does not have: it would be ignored"));
    }
    return spec;
  }

  load_context load_context_for_stream() const {
    load_context ctx = core_.load(Loader::default_filename);
    ctx.graph_capture = detail::captures_graphs<Stream>;
    return ctx;
  }

  // Runs `f` under InferenceMode (or no-grad) and the after-run work; torch's exceptions
  // become run_failed. Returns what `f` returns.
  template <class F>
  std::invoke_result_t<F&> guarded(F&& f) {
    try {
      // InferenceMode(false) would turn grad mode on: without it, run under no-grad.
      std::optional<c10::InferenceMode> inference;
      if (core_.options().inference_mode) inference.emplace();
      c10::AutoGradMode no_grad(false);
      std::invoke_result_t<F&> out = f();
      core_.after_run();
      return out;
    } catch (const error& e) {
      // Raised where the model is not known (a loader's or a stream policy's call): named
      // here.
      if (e.model().empty()) throw error(e.code(), core_.name(), e.message());
      throw;
    } catch (const std::exception& e) {
      throw error(errc::run_failed, core_.name(),
                  detail::concat("run failed: ", detail::torch_message(e)));
    }
  }

  detail::runner_core core_;
  detail::torch_settings settings_;
  [[no_unique_address]] detail::model_op_libraries libraries_;
  [[no_unique_address]] Hook hook_;
  [[no_unique_address]] Stream stream_;
  [[no_unique_address]] Loader loader_{};
  typename detail::holder_of<residency_policy_for<Residency, Loader>, Residency, Loader>::type
      weights_;
};

}  // namespace torchloom
