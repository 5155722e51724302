#pragma once
// What the residency policies may do with the weights of an AOTInductor package loaded by
// aoti_loader (torchloom/loader/aoti.hpp, which includes this header and checks the loader
// against the concepts). Needs LibTorch >= 2.6 (empty below).
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600
#include <torchloom/concepts/weight_access.hpp>
#include <torchloom/context.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/loader/aoti_metadata.hpp>
#include <torchloom/loader/aoti_model.hpp>
#include <torchloom/loader/aoti_package.hpp>
#include <torchloom/loader/aoti_weights.hpp>
#include <torchloom/signature.hpp>
#include <torchloom/weights/weight_graph.hpp>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchloom {

struct aoti_loader;  // torchloom/loader/aoti.hpp

//! What the residency policies may do with an AOTInductor package's weights, for aoti_loader
//! and every loader derived from it that keeps its model type (see
//! torchloom/concepts/weight_access.hpp):
//!  - swap its constants (mapped_weights): read them and replace them with tensors of the
//!    caller's (user-managed constants in the package's second constant buffer, which
//!    becomes the active one; the package's own copies are freed); a package exported for
//!    streaming is loaded with its weights in host memory for that, never all on the device;
//!  - rewrite its weight reads (streamed_weights), for a package exported for streaming,
//!    whose reads already call the fetch operator: record their order on a first run;
//!  - measure the device bytes of its constants (resident_weights, shared_weights).
template <class Loader>
  requires std::derived_from<Loader, aoti_loader> &&
           std::same_as<typename Loader::model_type, aoti_model>
struct weight_access<Loader> {
  //! Loads the package so that swapping its constants never puts them all on the device: a
  //! package exported for streaming keeps its weights in host memory until they are swapped.
  static aoti_model load_for_swapping(const Loader& l, const load_context& ctx) {
    return l.load_keeping_host_weights(ctx);
  }

  //! The package's constants by name: its weights in host memory where load_for_swapping
  //! left them there, else its active constants.
  static std::unordered_map<std::string, at::Tensor> constants(aoti_model& m) {
    if (m.reads && !m.weights_on_host.empty()) {
      std::unordered_map<std::string, at::Tensor> out;
      const auto& names = m.reads->names();
      for (std::size_t i = 0; i < names.size() && i < m.weights_on_host.size(); ++i) {
        out.emplace(names[i], m.weights_on_host[i]);
      }
      return out;
    }
    return m.package->get_runner()->extract_constants_map(/*use_inactive=*/false);
  }

  //! Loads `replacement` (every constant, by name) into the inactive buffer as user-managed
  //! constants (the package holds only their addresses), makes it the active one and frees
  //! the other.
  static void replace_constants(aoti_model& m,
                                std::unordered_map<std::string, at::Tensor>& replacement) {
    auto views = detail::unowned_views(replacement);  // the caller keeps the owners
    detail::install_user_constants(*m.package, views);
    // A streaming package's weights, installed from weights.pt, or its placeholders and the
    // host weights they stood for.
    m.weights.clear();
    m.weights_on_host.clear();
  }

  //! The bytes of the package's constants on `device` (each storage once).
  static std::int64_t device_bytes(const aoti_model& m, c10::Device device) {
    std::int64_t bytes = 0;
    std::vector<const void*> seen;
    for (const auto& [name, t] :
         m.package->get_runner()->extract_constants_map(/*use_inactive=*/false)) {
      if (!t.defined() || t.device() != device) continue;
      const void* storage = t.storage().unsafeGetStorageImpl();
      if (std::find(seen.begin(), seen.end(), storage) != seen.end()) continue;
      seen.push_back(storage);
      bytes += static_cast<std::int64_t>(t.storage().nbytes());
    }
    return bytes;
  }

  //! Streaming (rewritable_weights, for a package exported for streaming): the package with
  //! its weights in host memory; unsupported for another package.
  static aoti_model load_on_host(const Loader& l, const load_context& ctx) {
    return l.load_streamable(ctx);
  }

  //! The package's weight reads already call the fetch operator: runs it once on synthesised
  //! inputs (zeros; free dimensions 1), each read from a temporary device copy, to record the
  //! order of its reads and when each read's tensor is let go (its kernels are enqueued);
  //! then serves its later runs' reads from `source`. unsupported when the package does not
  //! declare its inputs' dtypes and shapes.
  static detail::weight_rewrite rewrite_weight_reads(aoti_model& m,
                                                     const detail::weight_source& source,
                                                     const std::string& model) {
    std::vector<at::Tensor> inputs;
    for (const input_spec& s : m.inputs) {
      if (!s.dtype || !s.shape) {
        throw error(errc::unsupported, model,
                    detail::concat("streamed_weights: the package does not declare input ",
                                   s.name.empty() ? std::string("#") + std::to_string(inputs.size())
                                                  : "'" + s.name + "'",
                                   "'s dtype and shape ('", detail::aoti_inputs_key,
                                   "' metadata, which scripts/torchloom_export.py writes): its "
                                   "first run at load, on synthesised inputs, records the "
                                   "order of its weight reads"));
      }
      std::vector<std::int64_t> shape = *s.shape;
      for (auto& d : shape) d = d < 0 ? 1 : d;
      inputs.push_back(at::zeros(shape, at::TensorOptions().dtype(*s.dtype).device(m.device)));
    }
    detail::package_reads& reads = *m.reads;
    // The rewrite holds the only references to the host tensors: packed, they are freed.
    detail::weight_rewrite rewrite = reads.record_with(std::move(m.weights_on_host), [&] {
      const detail::active_reads_scope serving(&reads);
      std::optional<c10::DeviceGuard> guard;
      if (m.device.is_cuda()) guard.emplace(m.device);
      try {
        (void)m.package->run(inputs, nullptr);
      } catch (const std::exception& e) {
        if (reads.failure()) std::rethrow_exception(reads.failure());
        throw error(errc::load_failed, model,
                    detail::concat("streamed_weights: the package's first run, which records "
                                   "its weight reads, failed: ",
                                   detail::torch_message(e)));
      }
    });
    // The engine's fetch is not const; the source only lends its address here, as it does
    // to TorchScript's rewritten graph.
    reads.bind(const_cast<detail::weight_source&>(source));
    return rewrite;
  }

  //! Nothing to turn off: the package is compiled.
  static void run_unoptimised(aoti_model&) noexcept {}
  struct unoptimised_scope {};
};

}  // namespace torchloom

#endif
