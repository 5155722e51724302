#pragma once
#include <torchloom/concepts/residency_policy.hpp>
#include <torchloom/concepts/weight_access.hpp>
#include <torchloom/options/weight_options.hpp>
#include <torchloom/weights/host_weights.hpp>
#include <torchloom/weights/weight_graph.hpp>
#include <torchloom/weights/weight_memory.hpp>
#include <torchloom/weights/weight_stream.hpp>

#include <boost/mp11/list.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

namespace torchloom {

//! The weights live in pinned host memory; the device holds at most
//! WEIGHT_OFFLOAD_BUDGET_MB of them at once (the device bytes for weights in all, as in
//! TensorRT's weight streaming budget). At load, a pass over the inlined forward graph
//! replaces every weight read with a fetch, in execution order (weights/weight_graph.hpp).
//! Weights stream through a ring arena: each fetch makes sure its weight has arrived and
//! starts copying the next WEIGHT_OFFLOAD_PREFETCH_DEPTH ones on a copy stream of the
//! runner's own, ordered with the compute stream by events both ways (no host
//! synchronisation). What the ring does not need of the budget keeps weights on the device
//! for the runner's life, copied once at load: those that save the most copied bytes per
//! byte first (read the most times a run, then the largest), while the ring the others need,
//! with room for the copies started ahead, still fits beside them. Only the others are
//! copied per run; a budget that holds every weight copies nothing per run (memory():
//! resident_bytes, streamed_bytes). Outputs are bitwise equal to resident_weights' (the same
//! kernels read the same bytes).
//!
//! For loaders whose weight reads can be rewritten (rewritable_weights: TorchScript's; a
//! static_assert says so for other loaders). The forward runs without the graph executor's
//! optimisation passes, which could reorder weight reads against the schedule. One run at a
//! time per runner: the ring's arena is its share of the budget. A budget below the whole
//! schedule's minimum is budget_too_small at load, naming the minimum; no budget at all is
//! invalid_option. A model that writes into a weight or returns one is unsupported. On a CPU
//! device the same schedule runs with plain memory copies, and resident weights are plain
//! memory (for tests). The copy engine: torchloom/weights/weight_stream.hpp.
struct streamed_weights {
  //! The options this policy reads (a runner without it refuses them).
  using option_blocks = boost::mp11::mp_list<weight_budget_options, streamed_weights_options>;

  //! A CUDA graph would replay the first run's copies: graphed<Stream> refuses this policy.
  static constexpr bool graph_capturable = false;

  template <class Loader>
  class holder {
    static_assert(rewritable_weights<Loader>,
                  "torchloom: streamed_weights needs weight_access<Loader> with load_on_host, "
                  "rewrite_weight_reads, run_unoptimised and unoptimised_scope: it streams the "
                  "weights of models whose weight reads go through its fetch (TorchScript's "
                  "loader rewrites them; the AOTInductor loader runs packages exported for "
                  "streaming, and loaders derived from either have them too); for a loader of "
                  "your own, specialise torchloom::weight_access for it (see "
                  "torchloom/concepts/weight_access.hpp)");
    using access = weight_access<Loader>;

   public:
    holder(const Loader& l, const load_context& ctx)
        : stream_(std::make_unique<detail::weight_stream>(ctx.spec.name, ctx.device)) {
      detail::require_cuda_build(ctx.spec.name, ctx.device, "streamed_weights");
      if constexpr (rewritable_weights<Loader>) {
        // Loaded on the host: the weights must never all be on the device at once.
        model_ = access::load_on_host(l, ctx);
        detail::weight_rewrite rewrite =
            access::rewrite_weight_reads(model_, *stream_, ctx.spec.name);
        const weight_budget_options& budget_options = ctx.spec.options;
        const streamed_weights_options& own = ctx.spec.options;
        std::optional<std::int64_t> budget;
        if (budget_options.weight_offload_budget_mb) {
          budget = *budget_options.weight_offload_budget_mb;
        }
        stream_->prepare(rewrite, budget, own.weight_offload_prefetch_depth);
        access::run_unoptimised(model_);
      }
    }

    const typename Loader::model_type& model() const noexcept { return model_; }

    template <class Body>
    decltype(auto) execute(Body&& body) {
      std::lock_guard lock(run_);
      // Graph-executor passes could move weight reads against the schedule.
      [[maybe_unused]] unoptimised no_optimization;
      stream_->begin_run();
      struct end_run {
        detail::weight_stream& s;
        ~end_run() { s.end_run(); }
      } ending{*stream_};
      return std::forward<Body>(body)(model_);
    }

    weight_memory memory() const {
      std::lock_guard lock(run_);
      return stream_->memory();
    }

    //! The smallest WEIGHT_OFFLOAD_BUDGET_MB (in bytes) this model's schedule fits in.
    std::int64_t minimum_budget_bytes() const noexcept { return stream_->minimum_budget_bytes(); }
    //! Fetches per run (the schedule's length, resident weights' fetches included).
    std::size_t fetches() const noexcept { return stream_->positions(); }

   private:
    using unoptimised = typename detail::unoptimised_scope_of<Loader>::type;
    // The model's graph holds the stream's address: the stream goes after the model.
    std::unique_ptr<detail::weight_stream> stream_;
    typename Loader::model_type model_;
    mutable std::mutex run_;
  };
};

static_assert(residency_policy_for<streamed_weights, detail::rewritable_loader_archetype>);

}  // namespace torchloom
