#pragma once
#include <torchloom/concepts/residency_policy.hpp>
#include <torchloom/concepts/weight_access.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/options/weight_options.hpp>
#include <torchloom/weights/host_weights.hpp>
#include <torchloom/weights/weight_graph.hpp>
#include <torchloom/weights/weight_memory.hpp>

#include <ATen/ATen.h>

#include <boost/mp11/list.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchloom {

namespace detail {

//! The run-time side of mapped_weights: every fetch returns the weight where it stays, in
//! pinned host memory mapped into the device's address space (kernels read it over the
//! bus), or on the device for the weights the budget keeps there.
class weight_map final : public weight_source {
 public:
  weight_map(std::string model, c10::Device device)
      : model_(std::move(model)), device_(device) {}
  weight_map(const weight_map&) = delete;
  weight_map& operator=(const weight_map&) = delete;
  ~weight_map() = default;

  //! Packs the weights into pinned host memory and keeps `resident_budget` bytes of them on
  //! the device: those read the most bytes per forward (size times reads), first.
  void prepare(weight_rewrite& rewrite, std::int64_t resident_budget) {
    const std::size_t count = rewrite.weights.size();
    std::vector<std::size_t> reads(count, 0);
    for (const std::size_t w : rewrite.position_weight) ++reads[w];
    std::vector<std::size_t> order(count);
    std::iota(order.begin(), order.end(), std::size_t{0});
    host_ = pack_host_weights(rewrite.weights, order, device_, model_);

    std::vector<std::size_t> by_benefit = order;
    std::stable_sort(by_benefit.begin(), by_benefit.end(), [&](std::size_t a, std::size_t b) {
      return static_cast<double>(host_.span[a]) * static_cast<double>(reads[a]) >
             static_cast<double>(host_.span[b]) * static_cast<double>(reads[b]);
    });
    std::vector<at::Tensor> weight_view(count);
    std::int64_t left = resident_budget;
    for (const std::size_t w : by_benefit) {
      const at::Tensor& host = host_.views[w];
      if (!device_.is_cuda()) {
        weight_view[w] = host;
      } else if (reads[w] > 0 && host_.span[w] <= left) {
        weight_view[w] = host.to(device_);
        left -= host_.span[w];
        resident_ += host_.span[w];
      } else {
        weight_view[w] = mapped_view(w);
      }
    }
    views_.reserve(rewrite.position_weight.size());
    for (const std::size_t w : rewrite.position_weight) views_.push_back(weight_view[w]);
    budget_ = resident_budget;
  }

  at::Tensor fetch(std::size_t position) override { return views_.at(position); }

  //! Moves a model's constants (an AOTInductor package's) into pinned host memory mapped
  //! into the device, but the `resident_budget` bytes of them that are largest (each is read
  //! once a run): their copies replace the model's constants through Access (a
  //! weight_access with swappable constants), which frees the model's own device copies.
  //! Constants the model holds on the device (a package compiled with them) are there once,
  //! briefly, at load; those it holds in host memory (a package exported for streaming,
  //! loaded with load_for_swapping) never reach the device but for the resident ones.
  template <class Access, class Model>
  void prepare_constants(Model& m, std::int64_t resident_budget) {
    budget_ = resident_budget;
    if (!device_.is_cuda()) return;  // a CPU package's constants are host memory already
    try {
      const auto constants = Access::constants(m);
      if (constants.empty()) return;  // a package without weights: nothing to map
      std::vector<weight_read> reads;
      std::vector<std::string> names;
      for (const auto& [fqn, t] : constants) {
        names.push_back(fqn);
        reads.push_back(weight_read{t.to(c10::kCPU), fqn, {}});
      }
      std::vector<std::size_t> order(reads.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      host_ = pack_host_weights(reads, order, device_, model_);
      std::vector<std::size_t> by_size = order;
      std::stable_sort(by_size.begin(), by_size.end(), [&](std::size_t a, std::size_t b) {
        return host_.span[a] > host_.span[b];
      });
      std::unordered_map<std::string, at::Tensor> replacement;
      std::int64_t left = resident_budget;
      for (const std::size_t w : by_size) {
        at::Tensor t;
        if (host_.span[w] <= left && host_.span[w] > 0) {
          t = host_.views[w].to(device_);
          left -= host_.span[w];
          resident_ += host_.span[w];
        } else {
          t = mapped_view(w);
        }
        kept_.push_back(t);  // user-managed: the model holds only their addresses
        replacement.emplace(names[w], t);
      }
      Access::replace_constants(m, replacement);
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      throw error(errc::load_failed, model_,
                  concat("mapped_weights: cannot move the package's constants to mapped host "
                         "memory: ", torch_message(e)));
    }
  }

  weight_memory memory() const noexcept {
    weight_memory m;
    m.device_bytes = resident_;
    m.high_water_bytes = resident_;
    m.resident_bytes = resident_;
    m.streamed_bytes = 0;
    m.budget_bytes = budget_;
    m.host_bytes = host_.pinned ? host_.bytes : 0;
    return m;
  }

 private:
  // Weight w where the device reads it in pinned host memory.
  at::Tensor mapped_view(std::size_t w) const {
    const at::Tensor& host = host_.views[w];
    auto* base = static_cast<std::byte*>(host_.device_pointer);
    return at::from_blob(base + host_.offset[w], host.sizes(), host.strides(),
                         [keep = host_.buffer](void*) {},
                         at::TensorOptions().dtype(host.scalar_type()).device(device_));
  }

  std::string model_;
  c10::Device device_;
  host_weights host_;
  std::vector<at::Tensor> kept_;  // an AOTInductor package's user-managed constants
  std::vector<at::Tensor> views_;  // per position
  std::int64_t resident_ = 0;
  std::int64_t budget_ = 0;
};

}  // namespace detail

//! The weights stay in pinned host memory, mapped into the device's address space: kernels
//! read them over the bus (zero-copy), so the device holds none of them, or only the
//! WEIGHT_OFFLOAD_BUDGET_MB of them that are read the most bytes per forward (size times
//! reads), copied there at load. Suits weights read little per forward (small batches,
//! embeddings, rarely taken branches); a large matrix product reads its weights many times
//! over and runs far slower than with the weights on the device.
//!
//! Models whose weight reads can be rewritten (rewritable_weights: TorchScript's), through
//! the same graph pass as streamed_weights (weight reads become fetches); a fetch costs no
//! device work. Like streamed_weights, the forward runs without the graph executor's
//! optimisation passes (they would fold weights into constants on the device). Models whose
//! constants can be swapped (swappable_constants: AOTInductor packages, LibTorch 2.6 and
//! later): the package's constants are replaced by mapped ones (user-managed constants in its
//! second constant buffer) and its device copies freed; the budget keeps the largest
//! constants on the device; the device holds every weight once, briefly, while a package
//! compiled with its constants loads, and never for a package exported for streaming
//! (scripts/torchloom_export.py), whose weights go from weights.pt to pinned host memory.
//! A static_assert refuses other loaders. run() may be called from several threads at
//! once. On a CPU device the weights stay in host memory.
struct mapped_weights {
  //! The options this policy reads (a runner without it refuses them).
  using option_blocks = boost::mp11::mp_list<weight_budget_options>;
  template <class Loader>
  class holder {
    static constexpr bool rewritable = rewritable_weights<Loader>;
    static constexpr bool swappable = swappable_constants<Loader>;
    static_assert(rewritable || swappable,
                  "torchloom: mapped_weights needs weight_access<Loader> with either "
                  "load_on_host, rewrite_weight_reads, run_unoptimised and unoptimised_scope "
                  "(models whose weight reads it can rewrite: TorchScript's loader and loaders "
                  "derived from it) or constants and replace_constants (models whose constants "
                  "it can swap: the AOTInductor loader and loaders derived from it); for a "
                  "loader of your own, specialise torchloom::weight_access for it (see "
                  "torchloom/concepts/weight_access.hpp)");
    using access = weight_access<Loader>;

   public:
    holder(const Loader& l, const load_context& ctx)
        : map_(std::make_unique<detail::weight_map>(ctx.spec.name, ctx.device)) {
      detail::require_cuda_build(ctx.spec.name, ctx.device, "mapped_weights");
      const weight_budget_options& options = ctx.spec.options;
      const auto& budget = options.weight_offload_budget_mb;
      const std::int64_t resident = budget ? *budget * (std::int64_t{1} << 20) : 0;
      if constexpr (swappable) {
        // First: a loader that can do both (aoti_loader) maps every package this way, one
        // exported for streaming too (its weights then come from host memory).
        if constexpr (requires { access::load_for_swapping(l, ctx); }) {
          model_ = access::load_for_swapping(l, ctx);
        } else {
          model_ = l.load(ctx);
        }
        map_->template prepare_constants<access>(model_, resident);
      } else if constexpr (rewritable) {
        model_ = access::load_on_host(l, ctx);
        detail::weight_rewrite rewrite =
            access::rewrite_weight_reads(model_, *map_, ctx.spec.name);
        map_->prepare(rewrite, resident);
        access::run_unoptimised(model_);
      }
    }

    const typename Loader::model_type& model() const noexcept { return model_; }

    template <class Body>
    decltype(auto) execute(Body&& body) {
      if constexpr (rewritable && !swappable) {
        // The optimisation passes would fold a fetch and what is computed from the weight
        // alone (a concatenation of weights) into a constant held on the device.
        [[maybe_unused]] typename access::unoptimised_scope no_optimization;
        return std::forward<Body>(body)(model_);
      } else {
        return std::forward<Body>(body)(model_);
      }
    }

    weight_memory memory() const { return map_->memory(); }

   private:
    // The model's graph holds the map's address (rewritten reads), or the model its
    // constants' (swapped constants).
    std::unique_ptr<detail::weight_map> map_;
    typename Loader::model_type model_;
  };
};

static_assert(residency_policy_for<mapped_weights, detail::rewritable_loader_archetype>);

}  // namespace torchloom
