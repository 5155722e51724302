#pragma once
#include <torchloom/context.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/signature.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <concepts>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom {

//! A loader turns a model file into something callable. Required:
//!  - `typename L::model_type`: the loaded model (owns it; destroyed to unload);
//!  - `L::default_filename`: the file name in a Triton version directory ("model.pt");
//!  - `l.load(const load_context&) -> model_type`: throws torchloom::error (model_not_found,
//!    load_failed) naming the file;
//!  - `l.signature(const model_type&) -> input_signature`: the declared inputs;
//!  - `l.run(model_type&, std::vector<c10::IValue>&&, const run_context&) -> c10::IValue`:
//!    may be called from several threads at once; inputs are already validated and on the
//!    device. Runs the model on `rc.stream` of `rc.device`: the loader makes that stream
//!    current itself (or hands it to its runtime), whatever stream is current when called.
//! Optional: `l.run_tensors(model_type&, const std::vector<at::Tensor>&, const run_context&)
//! -> std::vector<at::Tensor>` for a loader whose models take and return tensors natively
//! (aoti_loader): model_runner::run_tensors then passes them straight through, unboxed; it
//! runs on `rc.stream` as run() does.
//! Optional: `L::platform` (convertible to std::string_view): Triton's platform of the models
//! it loads (`pytorch_libtorch`, `torch_aoti`); a runner refuses a model_spec resolved to
//! another platform (see torchloom/platform.hpp) instead of handing its file to the wrong
//! loader.
//! Optional: `L::load_key(const runner_options&) -> std::string` (static): the options that
//! change what load() makes, as a string equal for options that load the same model
//! (keyed_loader). shared_weights shares a loaded model between runners whose keys are equal;
//! without it, only between runners whose options are all equal.
//! A loader is default-constructible and holds no per-model state. What it lets residency
//! policies do with its weights is a trait beside it: torchloom/concepts/weight_access.hpp.
template <class L>
concept loader =
    std::default_initializable<L> && requires { typename L::model_type; } &&
    requires(const L& l, const load_context& lc, typename L::model_type& m,
             std::vector<c10::IValue>&& in, const run_context& rc) {
      { L::default_filename } -> std::convertible_to<std::string_view>;
      { l.load(lc) } -> std::same_as<typename L::model_type>;
      { l.signature(std::as_const(m)) } -> std::same_as<input_signature>;
      { l.run(m, std::move(in), rc) } -> std::same_as<c10::IValue>;
    };

//! A loader that also runs on tensors directly (see above).
template <class L>
concept tensor_loader =
    loader<L> && requires(const L& l, typename L::model_type& m,
                          const std::vector<at::Tensor>& in, const run_context& rc) {
      { l.run_tensors(m, in, rc) } -> std::same_as<std::vector<at::Tensor>>;
    };

//! A loader that says which options change what it loads (see above).
template <class L>
concept keyed_loader = loader<L> && requires(const runner_options& o) {
  { L::load_key(o) } -> std::convertible_to<std::string>;
};

namespace detail {
//! The least a loader can be; used to check residency policies in their own headers.
struct loader_archetype {
  struct model_type {};
  static constexpr std::string_view default_filename = "model";
  model_type load(const load_context&) const;
  input_signature signature(const model_type&) const;
  c10::IValue run(model_type&, std::vector<c10::IValue>&&, const run_context&) const;
};
}  // namespace detail

}  // namespace torchloom
