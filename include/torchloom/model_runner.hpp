#pragma once
#include <torchloom/concepts/hook_policy.hpp>
#include <torchloom/concepts/loader.hpp>
#include <torchloom/concepts/residency_policy.hpp>
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/inputs.hpp>
#include <torchloom/detail/process_settings.hpp>
#include <torchloom/detail/runner_core.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/hook/no_hook.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/residency/resident.hpp>
#include <torchloom/residency/weight_memory.hpp>
#include <torchloom/stream/caller.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom {

namespace detail {
// When a policy fails its concept, the runner's members fall back to these stand-ins, so the
// user sees the static_assert naming the role and not a cascade of errors behind it.
struct invalid_policy_stand_in {
  const invalid_policy_stand_in& model() const noexcept { return *this; }
};
template <class L, class = void>
struct model_type_of {
  using type = invalid_policy_stand_in;
};
template <class L>
struct model_type_of<L, std::void_t<typename L::model_type>> {
  using type = typename L::model_type;
};
template <bool Valid, class Residency, class Loader>
struct holder_of {
  using type = typename Residency::template holder<Loader>;
};
template <class Residency, class Loader>
struct holder_of<false, Residency, Loader> {
  using type = invalid_policy_stand_in;
};
}  // namespace detail

//! A model runner composed from four policies, checked at compile time:
//!  - Loader: how the model file becomes something callable (torchscript_loader, ...);
//!  - Hook: native init that runs before the model loads (no_hook, static_hook, dlopen_hook);
//!  - Stream: on which CUDA stream it runs (caller_stream, pool_stream, ...);
//!  - Residency: where the weights live (resident_weights, shared_weights, ...).
//! Construction resolves the options, runs the hook, loads the model, places the weights and
//! warms up; each step undoes the earlier ones when it fails. Destruction runs in reverse.
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

 public:
  using loader_type = Loader;
  using hook_type = Hook;
  using stream_type = Stream;
  using residency_type = Residency;
  using model_type = typename detail::model_type_of<Loader>::type;

  //! Loads `spec` on `device` (CPU by default). Throws torchloom::error: invalid_option,
  //! model_not_found, hook_failed, load_failed, unsupported (e.g. a CUDA device without CUDA).
  explicit model_runner(model_spec spec, c10::Device device = c10::Device(c10::kCPU))
      : model_runner(construct_tag{}, std::string(spec.name), std::move(spec), device) {}

  model_runner(const model_runner&) = delete;
  model_runner& operator=(const model_runner&) = delete;

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
      return stream_.execute(core_.device(), inputs, [&](const run_context& rc) {
        return weights_.execute(
            [&](model_type& m) { return loader_.run(m, std::move(inputs), rc); });
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
      std::vector<at::Tensor> out;
      guarded([&] {
        const auto moved =
            detail::check_tensor_inputs(core_.name(), core_.signature(), inputs, core_.device());
        const std::vector<at::Tensor>& in = moved ? *moved : inputs;
        return stream_.execute(core_.device(), in, [&](const run_context& rc) {
          return weights_.execute([&](model_type& m) {
            out = loader_.run_tensors(m, in, rc);
            // What the stream policy sees of the outputs (to order them with the caller):
            // one tensor needs no allocation.
            return out.size() == 1 ? c10::IValue(out.front())
                                   : c10::IValue(c10::ivalue::Tuple::create(
                                         std::vector<c10::IValue>(out.begin(), out.end())));
          });
        });
      });
      return out;
    }
  }

  //! The model's name (from config.pbtxt, else the directory or file name).
  const std::string& name() const noexcept { return core_.name(); }
  //! What the runner was built from, options included.
  const model_spec& spec() const noexcept { return core_.spec(); }
  const runner_options& options() const noexcept { return core_.options(); }
  c10::Device device() const noexcept { return core_.device(); }
  //! The declared inputs run() checks against.
  const input_signature& inputs() const noexcept { return core_.signature(); }
  //! The loaded model (for inspection; run() is the way to call it).
  const model_type& model() const noexcept { return weights_.model(); }
  //! How much memory the weights take: device bytes, and for streamed_weights the most in
  //! flight at once and the budget checks (see weight_memory).
  weight_memory memory() const {
    if constexpr (requires { weights_.memory(); }) {
      return weights_.memory();
    } else {
      return detail::loaded_weight_memory(weights_.model(), core_.device());
    }
  }

 private:
  struct construct_tag {};
  // Every step's own errors are torchloom::error already; anything else that escapes a
  // policy or torch (a c10::Error, std::bad_alloc) becomes load_failed naming the model.
  // The members built so far are destroyed before the handler runs.
  model_runner(construct_tag, std::string name, model_spec&& spec, c10::Device device) try
      : core_(std::move(spec), device),
        hook_(core_.context()),
        stream_(core_.context()),
        weights_(loader_, core_.load(Loader::default_filename)) {
    core_.set_signature(loader_.signature(weights_.model()));
    core_.warm_up([this](std::vector<c10::IValue> in) { run_ivalue(std::move(in)); });
  } catch (const error&) {
    throw;
  } catch (const std::exception& e) {
    throw error(errc::load_failed, name,
                detail::concat("construction failed: ", detail::torch_message(e)));
  }

  // Runs `f` under InferenceMode (or no-grad) and the after-run work; torch's exceptions
  // become run_failed.
  template <class F>
  c10::IValue guarded(F&& f) {
    try {
      // InferenceMode(false) would turn grad mode on: without it, run under no-grad.
      std::optional<c10::InferenceMode> inference;
      if (core_.options().inference_mode) inference.emplace();
      c10::AutoGradMode no_grad(false);
      c10::IValue out = f();
      core_.after_run();
      return out;
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      throw error(errc::run_failed, core_.name(),
                  detail::concat("run failed: ", detail::torch_message(e)));
    }
  }

  detail::runner_core core_;
  [[no_unique_address]] Hook hook_;
  [[no_unique_address]] Stream stream_;
  [[no_unique_address]] Loader loader_{};
  typename detail::holder_of<residency_policy_for<Residency, Loader>, Residency, Loader>::type
      weights_;
};

}  // namespace torchloom
