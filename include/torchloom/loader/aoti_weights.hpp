#pragma once
//! The weights of an AOTInductor package exported for streaming (scripts/torchloom_export.py,
//! offload on): every weight read in its graph goes through the operator
//! `torchloom::stream_weight(weight, after, index)`, its constants are not compiled into it,
//! and the weights come in `weights.pt` beside the package (read and checked by
//! torchloom/loader/aoti_package_weights.hpp). This header registers that operator and turns
//! its calls into fetches from a residency policy's weight source, in the order the package's
//! first run made them.
//!
//! Needs LibTorch >= 2.6 (included by torchloom/loader/aoti.hpp only there).
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>
#include <torchloom/loader/aoti_package_weights.hpp>
#include <torchloom/weights/weight_graph.hpp>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The calls of `torchloom::stream_weight` in one package: recorded on a first run, then
//! served from a weight source, position by position, checked against the record.
class package_reads {
 public:
  package_reads(std::string model, std::vector<std::string> names, c10::Device device)
      : model_(std::move(model)), names_(std::move(names)), device_(device) {}

  const std::vector<std::string>& names() const noexcept { return names_; }
  bool serving() const noexcept { return source_ != nullptr || recording_; }

  //! Before each run.
  void begin() noexcept {
    position_ = 0;
    failure_ = nullptr;
  }
  //! The error a fetch raised in the last run (the package reports only that it failed).
  std::exception_ptr failure() const noexcept { return failure_; }

  //! The operator's body: the weight `index` for the next read.
  at::Tensor fetch(std::int64_t index, const at::Tensor& weight) {
    try {
      if (index < 0 || static_cast<std::size_t>(index) >= names_.size()) {
        throw error(errc::run_failed, model_,
                    concat("the package read weight index ", index, " but declares ",
                           names_.size(), " weights ('", aoti_stream_weights_key, "')"));
      }
      if (recording_) return record(static_cast<std::size_t>(index), weight);
      const std::size_t p = position_;
      if (p >= order_.size() || order_[p] != static_cast<std::size_t>(index)) {
        throw error(errc::run_failed, model_,
                    concat("streamed_weights: the package read weight '",
                           names_[static_cast<std::size_t>(index)],
                           "' at read ", p, " where its first run read ",
                           p < order_.size() ? concat("'", names_[order_[p]], "'")
                                             : std::string("nothing more"),
                           ": its call order changed, so the schedule made at load no longer "
                           "holds; nothing was overwritten"));
      }
      ++position_;
      return source_->fetch(p);
    } catch (...) {
      failure_ = std::current_exception();
      throw;
    }
  }

  //! Reads in order, with the weights' host tensors: the schedule for the engine. Called once,
  //! around the first run (`run` does it), which reads each weight from a temporary device copy.
  template <class Run>
  weight_rewrite record_with(std::vector<at::Tensor> host, Run&& run) {
    recording_ = true;
    host_ = std::move(host);
    struct stop {
      package_reads& r;
      ~stop() { r.recording_ = false; }
    } stopping{*this};
    begin();
    std::forward<Run>(run)();
    weight_rewrite out;
    // What is still held after the run: released at its end, unless an output holds it.
    for (std::size_t q = 0; q < held_.size(); ++q) {
      if (!held_[q].defined()) continue;
      if (held_[q].use_count() > 1 || held_[q].storage().use_count() > 1) {
        throw error(errc::unsupported, model_,
                    concat("streamed_weights: the package returns weight '",
                           names_[order_[q]], "' (or a view of it) as an output"));
      }
      release_[q] = order_.size();
    }
    held_.clear();
    out.weights.reserve(names_.size());
    for (std::size_t w = 0; w < names_.size(); ++w) {
      out.weights.push_back(weight_read{host_[w], names_[w], {}});
    }
    out.position_weight = order_;
    out.release = release_;
    host_.clear();
    return out;
  }

  //! Serves the later runs' reads from `source` (positions as recorded).
  void bind(weight_source& source) noexcept { source_ = &source; }

 private:
  // A first-run read: a temporary device copy, watched until nothing but this holds it.
  at::Tensor record(std::size_t index, const at::Tensor& weight) {
    (void)weight;
    const std::size_t p = order_.size();
    for (std::size_t q = 0; q < held_.size(); ++q) {
      if (held_[q].defined() && held_[q].use_count() == 1 &&
          held_[q].storage().use_count() == 1) {
        release_[q] = p;  // every kernel reading q is enqueued by now
        held_[q] = at::Tensor();
      }
    }
    order_.push_back(index);
    release_.push_back(0);
    at::Tensor copy = host_.at(index).to(device_, /*non_blocking=*/false, /*copy=*/true);
    held_.push_back(copy);
    return copy;
  }

  std::string model_;
  std::vector<std::string> names_;  // per index
  c10::Device device_;
  weight_source* source_ = nullptr;
  bool recording_ = false;
  std::vector<at::Tensor> host_;     // per index, while recording
  std::vector<std::size_t> order_;   // per position: the index read
  std::vector<std::size_t> release_;  // per position
  std::vector<at::Tensor> held_;     // per position, while recording
  std::size_t position_ = 0;
  std::exception_ptr failure_;
};

//! The package whose reads the calling thread's run serves (set around a run).
inline thread_local package_reads* active_reads = nullptr;

//! Sets active_reads for a scope.
class active_reads_scope {
 public:
  explicit active_reads_scope(package_reads* r) noexcept : previous_(active_reads) {
    active_reads = r;
  }
  active_reads_scope(const active_reads_scope&) = delete;
  active_reads_scope& operator=(const active_reads_scope&) = delete;
  ~active_reads_scope() { active_reads = previous_; }

 private:
  package_reads* previous_;
};

//! `torchloom::stream_weight`: with no streaming run on this thread, the package's own
//! constant (the weights were installed on the device: resident_weights, shared_weights,
//! mapped_weights); otherwise the fetch.
inline at::Tensor stream_weight_kernel(const at::Tensor& weight, const at::Tensor& after,
                                       std::int64_t index) {
  (void)after;  // only orders the read after the activation that its consumer reads
  package_reads* reads = active_reads;
  if (reads == nullptr || !reads->serving()) return weight;
  return reads->fetch(index, weight);
}

//! Registers `torchloom::stream_weight` with the dispatcher, once per process, before a
//! package that calls it loads (its calls are resolved at load).
inline void register_stream_weight_op() {
  static const bool registered = [] {
    if (c10::Dispatcher::singleton().findSchema({"torchloom::stream_weight", ""})) {
      return true;  // defined by someone else in this process (the export helper's Python)
    }
    static torch::Library library(torch::Library::FRAGMENT, "torchloom", {},
                                  __FILE__, __LINE__);
    library.def("stream_weight(Tensor weight, Tensor after, int index) -> Tensor",
                &stream_weight_kernel);
    return true;
  }();
  (void)registered;
}

//! Views of `owners` over storages that do not own their memory (one per distinct storage, so
//! constants that share one still share it), for the package's user-managed constants.
//! torch's container takes a new tensor handle for each user-managed constant and never
//! deletes it (torch 2.6 to 2.11), which would keep an owning storage, and its memory, alive
//! after the package is gone; a view's storage holds only the address. The caller keeps
//! `owners` for as long as the package may run.
inline std::unordered_map<std::string, at::Tensor> unowned_views(
    const std::unordered_map<std::string, at::Tensor>& owners) {
  std::unordered_map<const c10::StorageImpl*, c10::Storage> storages;
  std::unordered_map<std::string, at::Tensor> views;
  views.reserve(owners.size());
  for (const auto& [name, t] : owners) {
    const c10::Storage& owner = t.storage();
    auto it = storages.find(owner.unsafeGetStorageImpl());
    if (it == storages.end()) {
      c10::Storage unowned(c10::Storage::use_byte_size_t(), owner.nbytes(),
                           c10::DataPtr(const_cast<void*>(owner.data()), owner.device()),
                           /*allocator=*/nullptr, /*resizable=*/false);
      it = storages.emplace(owner.unsafeGetStorageImpl(), std::move(unowned)).first;
    }
    views.emplace(name, at::empty({0}, t.options())
                            .set_(it->second, t.storage_offset(), t.sizes(), t.strides()));
  }
  return views;
}

}  // namespace torchloom::detail
