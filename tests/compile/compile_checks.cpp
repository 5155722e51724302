// Compile-time checks: the concepts hold for the policies, empty policies are empty, and a
// runner with only empty policies is no larger than its core state and its model.
#include <torchloom/torchloom.hpp>

#include <type_traits>

namespace {

using namespace torchloom;  // NOLINT: a file of static_asserts

static_assert(loader<torchscript_loader>);
static_assert(hook_policy<no_hook>);
static_assert(stream_policy<caller_stream>);
static_assert(residency_policy_for<resident_weights, torchscript_loader>);
static_assert(stream_policy<graphed<caller_stream>>);
static_assert(stream_policy<graphed<pool_stream>>);
static_assert(stream_policy<graphed<adaptive_stream>>);
static_assert(torchloom::detail::captures_graphs<graphed<pool_stream>> &&
              !torchloom::detail::captures_graphs<pool_stream>);
static_assert(!torchloom::detail::graph_capturable<streamed_weights>);

static_assert(std::is_empty_v<no_hook>);
static_assert(std::is_empty_v<caller_stream>);
static_assert(std::is_empty_v<torchscript_loader>);
#if TORCHLOOM_TORCH_VERSION >= 20600
static_assert(loader<aoti_loader>);
static_assert(std::is_empty_v<aoti_loader>);
#endif

// What each loader lets the residency policies do with its weights (weight_access), also for
// loaders derived from them; a loader of its own gives nothing unless it specialises it.
struct derived_torchscript_loader : torchscript_loader {};
static_assert(rewritable_weights<torchscript_loader> && measurable_weights<torchscript_loader>);
static_assert(!swappable_constants<torchscript_loader>);
static_assert(rewritable_weights<derived_torchscript_loader> &&
              measurable_weights<derived_torchscript_loader>);
static_assert(residency_policy_for<streamed_weights, derived_torchscript_loader>);
static_assert(residency_policy_for<mapped_weights, derived_torchscript_loader>);
static_assert(residency_policy_for<shared_weights, derived_torchscript_loader>);
static_assert(!rewritable_weights<torchloom::detail::loader_archetype> &&
              !swappable_constants<torchloom::detail::loader_archetype> &&
              !measurable_weights<torchloom::detail::loader_archetype>);
#if TORCHLOOM_TORCH_VERSION >= 20600
struct derived_aoti_loader : aoti_loader {};
static_assert(swappable_constants<aoti_loader> && rewritable_weights<aoti_loader> &&
              measurable_weights<aoti_loader>);
static_assert(swappable_constants<derived_aoti_loader>);
static_assert(residency_policy_for<mapped_weights, derived_aoti_loader>);
static_assert(residency_policy_for<streamed_weights, derived_aoti_loader>);
#endif
// shared_weights keys its registry by a loader's load_key where it has one.
static_assert(keyed_loader<torchscript_loader> && keyed_loader<derived_torchscript_loader>);
static_assert(!keyed_loader<torchloom::detail::loader_archetype>);

// What the runner must hold whatever its policies: the core, the process-wide settings it
// claims and the loaded model.
struct minimal_runner_state {
  torchloom::detail::runner_core core;
  torchloom::detail::torch_settings settings;
  torchscript_loader::model_type model;
};
static_assert(std::is_empty_v<torchloom::detail::model_op_libraries>);
static_assert(sizeof(model_runner<torchscript_loader>) == sizeof(minimal_runner_state),
              "empty policies must cost nothing in the runner");
static_assert(std::is_same_v<model_runner<torchscript_loader>::hook_type, no_hook>);
static_assert(std::is_same_v<model_runner<torchscript_loader>::stream_type, caller_stream>);
static_assert(std::is_same_v<model_runner<torchscript_loader>::residency_type, resident_weights>);
static_assert(!std::is_copy_constructible_v<model_runner<torchscript_loader>>);

}  // namespace

// A loader with a tensor path (as aoti_loader, which this LibTorch may not have): its runners'
// run_tensors() lend tensors to the stream policy and get a tensor vector back.
namespace compile_checks {

struct tensor_path_loader {
  struct model_type {};
  static constexpr std::string_view default_filename = "model";
  model_type load(const torchloom::load_context&) const;
  torchloom::input_signature signature(const model_type&) const;
  c10::IValue run(model_type&, std::vector<c10::IValue>&&, const torchloom::run_context&) const;
  std::vector<at::Tensor> run_tensors(model_type&, const std::vector<at::Tensor>&,
                                      const torchloom::run_context&) const;
};

}  // namespace compile_checks

static_assert(torchloom::tensor_loader<compile_checks::tensor_path_loader>);
template class torchloom::model_runner<compile_checks::tensor_path_loader, torchloom::no_hook,
                                      torchloom::pool_stream>;
template class torchloom::model_runner<compile_checks::tensor_path_loader, torchloom::no_hook,
                                      torchloom::graphed<torchloom::adaptive_stream>>;
