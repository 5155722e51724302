#pragma once
#include <torchloom/concepts/loader.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>

namespace torchloom {

namespace detail {
class weight_source;
struct weight_rewrite;
}  // namespace detail

//! What a loader lets the residency policies do with its models' weights: declared here,
//! specialised beside each loader (torchloom/loader/torchscript.hpp, torchloom/loader/aoti.hpp)
//! for that loader and every loader derived from it. The primary template gives nothing: a
//! residency policy that needs a capability below stops with a static_assert that names it.
//! To use such a policy with a loader of your own, specialise `torchloom::weight_access` for
//! it with the members of the capability (all static):
//!
//! Weight reads that can be rewritten (rewritable_weights; streamed_weights, mapped_weights):
//!  - `load_on_host(const L&, const load_context&) -> L::model_type`: loads the model with its
//!    weights in host memory, whatever the context's device (the policy places them);
//!  - `rewrite_weight_reads(L::model_type&, const detail::weight_source&, const std::string&
//!    model) -> detail::weight_rewrite`: before the model first runs, makes every weight read
//!    a fetch from the source, in execution order, and returns the weights and the schedule
//!    (torchloom/weights/weight_graph.hpp does it for a TorchScript module); throws
//!    torchloom::error (unsupported) naming what cannot be rewritten;
//!  - `run_unoptimised(L::model_type&)`: the model's later runs go without optimisation
//!    passes that could move or fold its weight reads;
//!  - `typename unoptimised_scope`: default-constructible; held around each run, it keeps such
//!    passes off on the calling thread.
//!
//! Constants that can be swapped (swappable_constants; mapped_weights):
//!  - `constants(L::model_type&) -> std::unordered_map<std::string, at::Tensor>`: the model's
//!    constants (its weights) by name, where it holds them now;
//!  - `replace_constants(L::model_type&, std::unordered_map<std::string, at::Tensor>&)`: makes
//!    the given tensors (the same names, owned by the caller, who keeps them alive) the ones
//!    the model reads, and frees the model's own copies;
//!  - optionally `load_for_swapping(const L&, const load_context&) -> L::model_type`: loads the
//!    model with its constants where constants() reads them without putting them all on the
//!    device first (in host memory); without it, the policy loads with the loader's load().
//!
//! Weight memory that can be measured (measurable_weights; model_runner::memory() for
//! policies that keep the weights where the loader put them):
//!  - `device_bytes(const L::model_type&, c10::Device) -> std::int64_t`: the bytes of the
//!    model's weights on that device.
template <class Loader>
struct weight_access {};

//! Loader's models have weight reads a residency policy can rewrite (see weight_access).
template <class L>
concept rewritable_weights =
    loader<L> &&
    requires(const L& l, const load_context& ctx, typename L::model_type& m,
             const detail::weight_source& source, const std::string& model) {
      { weight_access<L>::load_on_host(l, ctx) } -> std::same_as<typename L::model_type>;
      {
        weight_access<L>::rewrite_weight_reads(m, source, model)
      } -> std::same_as<detail::weight_rewrite>;
      weight_access<L>::run_unoptimised(m);
      typename weight_access<L>::unoptimised_scope;
    } && std::default_initializable<typename weight_access<L>::unoptimised_scope>;

//! Loader's models have constants a residency policy can swap (see weight_access).
template <class L>
concept swappable_constants =
    loader<L> && requires(typename L::model_type& m,
                          std::unordered_map<std::string, at::Tensor>& replacement) {
      {
        weight_access<L>::constants(m)
      } -> std::same_as<std::unordered_map<std::string, at::Tensor>>;
      weight_access<L>::replace_constants(m, replacement);
    };

//! Loader can tell how much device memory its models' weights take (see weight_access).
template <class L>
concept measurable_weights =
    loader<L> && requires(const typename L::model_type& m, c10::Device device) {
      { weight_access<L>::device_bytes(m, device) } -> std::same_as<std::int64_t>;
    };

namespace detail {
//! weight_access<L>::unoptimised_scope for a loader with rewritable weights; an empty scope
//! otherwise, so that a policy's static_assert is the only error for such a loader.
template <class L>
struct unoptimised_scope_of {
  struct type {};
};
template <rewritable_weights L>
struct unoptimised_scope_of<L> {
  using type = typename weight_access<L>::unoptimised_scope;
};

//! The least loader with rewritable weights; checks residency policies in their own headers.
struct rewritable_loader_archetype : loader_archetype {};
}  // namespace detail

//! Declared only: what the concept check of a residency policy needs.
template <>
struct weight_access<detail::rewritable_loader_archetype> {
  using model_type = detail::rewritable_loader_archetype::model_type;
  static model_type load_on_host(const detail::rewritable_loader_archetype&,
                                 const load_context&);
  static detail::weight_rewrite rewrite_weight_reads(model_type&, const detail::weight_source&,
                                                     const std::string&);
  static void run_unoptimised(model_type&);
  struct unoptimised_scope {};
};

}  // namespace torchloom
