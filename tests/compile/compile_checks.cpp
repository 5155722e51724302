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
