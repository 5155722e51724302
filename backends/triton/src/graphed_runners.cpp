// The graphed runners of TORCHLOOM_GRAPHS: model_runner<L, H, graphed<S>, R> for each runner
// type of the plain choice, in a translation unit of their own (compiled beside the backend's
// main one). With caller (and graphed_caller) the backend chooses graphed_caller instead, a
// runner type of the plain choice. A build without CUDA has no graphed runners of its own:
// graphed<S> is a no-op there (it has only CPU devices), so the plain runner serves.
#include "any_runner.hpp"

#include <torchloom/detail/config.hpp>
#include <torchloom/error.hpp>
#include <torchloom/stream/graphed.hpp>

#include <type_traits>

namespace torchloom::triton_backend {

#if TORCHLOOM_HAS_CUDA
namespace {

template <class Runner>
struct graphed_runner_of;
template <class S>
inline constexpr bool is_graphed = false;
template <class S>
inline constexpr bool is_graphed<graphed<S>> = true;

template <class L, class H, class S, class R>
struct graphed_runner_of<model_runner<L, H, S, R>> {
  // Streamed weights are refused by the backend first; a graphed S is never wrapped again.
  static constexpr bool possible = !std::is_same_v<R, streamed_weights> && !is_graphed<S>;
  using type = model_runner<L, H, graphed<S>, R>;
};

}  // namespace
#endif

std::unique_ptr<any_runner> make_graphed_runner(const policy_choice& choice,
                                                const model_spec& spec,
                                                std::optional<c10::Device> device) {
#if TORCHLOOM_HAS_CUDA
  return with_runner_type(
      choice,
      [&](auto type) -> std::unique_ptr<any_runner> {
        using graphed_of = graphed_runner_of<typename decltype(type)::type>;
        if constexpr (graphed_of::possible) {
          return std::make_unique<runner_box<typename graphed_of::type>>(spec, device);
        } else {
          throw error(errc::invalid_option, spec.name,
                      "TORCHLOOM_GRAPHS=true: this stream and residency policy cannot be "
                      "graphed");
        }
      },
      spec.name);
#else
  return make_runner(choice, spec, device);
#endif
}

}  // namespace torchloom::triton_backend
