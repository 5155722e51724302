#pragma once
#include <torchloom/concepts/residency_policy.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/host_weights.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/weight_graph.hpp>
#include <torchloom/error.hpp>
#include <torchloom/loader/torchscript.hpp>
#include <torchloom/residency/weight_memory.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
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
    host_ = pack_host_weights(rewrite.weights, order, device_.is_cuda(), model_);

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
        auto* base = static_cast<std::byte*>(host_.device_pointer);
        weight_view[w] = at::from_blob(
            base + host_.offset[w], host.sizes(), host.strides(), [keep = host_.buffer](void*) {},
            at::TensorOptions().dtype(host.scalar_type()).device(device_));
      }
    }
    views_.reserve(rewrite.position_weight.size());
    for (const std::size_t w : rewrite.position_weight) views_.push_back(weight_view[w]);
    budget_ = resident_budget;
  }

  at::Tensor fetch(std::size_t position) override { return views_.at(position); }

  weight_memory memory() const noexcept {
    weight_memory m;
    m.device_bytes = resident_;
    m.high_water_bytes = resident_;
    m.budget_bytes = budget_;
    m.host_bytes = host_.pinned ? host_.bytes : 0;
    return m;
  }

 private:
  std::string model_;
  c10::Device device_;
  host_weights host_;
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
//! TorchScript models, through the same graph pass as streamed_weights (weight reads become
//! fetches); a fetch costs no device work. Like streamed_weights, the forward runs without
//! the graph executor's optimisation passes (they would fold weights into constants on the
//! device). run() may be called from several threads at once.
//! On a CPU device the weights stay where they are packed.
struct mapped_weights {
  template <class Loader>
  class holder {
    static_assert(std::is_same_v<Loader, torchscript_loader>,
                  "torchloom: mapped_weights maps the weights of TorchScript models "
                  "(torchscript_loader)");

   public:
    holder(const Loader& l, const load_context& ctx)
        : map_(std::make_unique<detail::weight_map>(ctx.spec.name, ctx.device)) {
#if !TORCHLOOM_HAS_CUDA
      if (ctx.device.is_cuda()) {
        throw error(errc::unsupported, ctx.spec.name,
                    "mapped_weights on a CUDA device needs a CUDA build of torchloom "
                    "(TORCHLOOM_HAS_CUDA)");
      }
#endif
      model_ = l.load(load_context{ctx.spec, ctx.file, c10::Device(c10::kCPU)});
      detail::weight_rewrite rewrite =
          detail::rewrite_weight_reads(model_.module, *map_, ctx.spec.name);
      const auto& budget = ctx.spec.options.weight_offload_budget_mb;
      map_->prepare(rewrite, budget ? *budget * (std::int64_t{1} << 20) : 0);
      model_.optimized_execution = false;
    }

    const typename Loader::model_type& model() const noexcept { return model_; }

    template <class Body>
    c10::IValue execute(Body&& body) {
      // The optimisation passes would fold a fetch and what is computed from the weight
      // alone (a concatenation of weights) into a constant held on the device.
      torch::jit::GraphOptimizerEnabledGuard no_optimization(false);
      return std::forward<Body>(body)(model_);
    }

    weight_memory memory() const { return map_->memory(); }

   private:
    std::unique_ptr<detail::weight_map> map_;  // the model's graph holds its address
    typename Loader::model_type model_;
  };
};

static_assert(residency_policy_for<mapped_weights, torchscript_loader>);

}  // namespace torchloom
