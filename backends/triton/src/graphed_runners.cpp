// The graphed runners of TORCHLOOM_GRAPHS: model_runner<L, H, graphed<S>, R> for each runner
// type of the plain choice, in a translation unit of their own (compiled beside the backend's
// main one). A build without CUDA has none: graphs need a GPU.
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
template <class L, class H, class S, class R>
struct graphed_runner_of<model_runner<L, H, S, R>> {
  static constexpr bool possible = !std::is_same_v<R, streamed_weights>;
  using type = model_runner<L, H, graphed<S>, R>;
};

}  // namespace
#endif

std::unique_ptr<any_runner> make_graphed_runner(const policy_choice& choice,
                                                const model_spec& spec,
                                                std::optional<c10::Device> device) {
  if (choice.residency == residency_kind::streamed) {
    throw error(errc::invalid_option, spec.name,
                "TORCHLOOM_GRAPHS=true with TORCHLOOM_RESIDENCY=streamed: a CUDA graph replays "
                "the copies of its capture, and streamed weights are placed anew at every run; "
                "use resident, shared or mapped weights with graphs");
  }
#if TORCHLOOM_HAS_CUDA
  return with_runner_type(
      choice,
      [&](auto type) -> std::unique_ptr<any_runner> {
        using graphed_of = graphed_runner_of<typename decltype(type)::type>;
        if constexpr (graphed_of::possible) {
          return std::make_unique<runner_box<typename graphed_of::type>>(spec, device);
        } else {
          return nullptr;  // refused above
        }
      },
      spec.name);
#else
  (void)device;
  throw error(errc::unsupported, spec.name,
              "TORCHLOOM_GRAPHS=true: this build of the backend has no CUDA (torchloom::cuda), "
              "and CUDA graphs need it");
#endif
}

}  // namespace torchloom::triton_backend
