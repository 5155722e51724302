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
static_assert(swappable_constants<aoti_loader> && !rewritable_weights<aoti_loader>);
static_assert(swappable_constants<derived_aoti_loader>);
static_assert(residency_policy_for<mapped_weights, derived_aoti_loader>);
#endif
// shared_weights keys its registry by a loader's load_key where it has one.
static_assert(keyed_loader<torchscript_loader> && keyed_loader<derived_torchscript_loader>);
static_assert(!keyed_loader<torchloom::detail::loader_archetype>);

// What the runner must hold whatever its policies: the core and the loaded model.
struct minimal_runner_state {
  torchloom::detail::runner_core core;
  torchscript_loader::model_type model;
};
static_assert(sizeof(model_runner<torchscript_loader>) == sizeof(minimal_runner_state),
              "empty policies must cost nothing in the runner");
static_assert(std::is_same_v<model_runner<torchscript_loader>::hook_type, no_hook>);
static_assert(std::is_same_v<model_runner<torchscript_loader>::stream_type, caller_stream>);
static_assert(std::is_same_v<model_runner<torchscript_loader>::residency_type, resident_weights>);
static_assert(!std::is_copy_constructible_v<model_runner<torchscript_loader>>);

}  // namespace
