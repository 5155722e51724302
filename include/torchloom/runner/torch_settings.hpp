#pragma once
#include <torchloom/detail/config.hpp>
#include <torchloom/process_settings.hpp>
#include <torchloom/model_spec.hpp>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <functional>
#include <string>
#include <vector>

namespace torchloom::detail {

//! A runner's construction step: the process-wide torch settings its options ask for
//! (INTRA_OP_THREAD_COUNT, INTER_OP_THREAD_COUNT, DISABLE_CUDNN), claimed for as long as the
//! runner lives (see setting_claim). Throws invalid_option on a conflict with a live runner;
//! what it claimed before failing is released.
class torch_settings {
 public:
  explicit torch_settings(const model_spec& spec) {
    const auto& o = spec.options;
    // 0 or less: torch's default, as in Triton's PyTorch backend.
    if (o.intra_op_thread_count && *o.intra_op_thread_count > 0) {
      const int n = *o.intra_op_thread_count;
      claims_.push_back(setting_claim::make(
          "INTRA_OP_THREAD_COUNT", std::to_string(n), spec.name, [n]() -> std::function<void()> {
            const int before = at::get_num_threads();
            at::set_num_threads(n);
            return [before] { at::set_num_threads(before); };
          }));
    }
    if (o.inter_op_thread_count && *o.inter_op_thread_count > 0) {
      const int n = *o.inter_op_thread_count;
      claims_.push_back(setting_claim::make(
          "INTER_OP_THREAD_COUNT", std::to_string(n), spec.name, [n]() -> std::function<void()> {
            // torch allows this once, before its inter-op pool starts, so it cannot be
            // undone. (size_t in torch 2.x, int in 1.13)
            if (static_cast<int>(at::get_num_interop_threads()) != n) {
              at::set_num_interop_threads(n);
            }
            return {};
          }));
    }
    if (o.disable_cudnn) {
      const bool off = *o.disable_cudnn;
      claims_.push_back(
          setting_claim::make("DISABLE_CUDNN", off ? "true" : "false", spec.name,
                              [off]() -> std::function<void()> {
                                const bool before = at::globalContext().userEnabledCuDNN();
                                at::globalContext().setUserEnabledCuDNN(!off);
                                return [before] { at::globalContext().setUserEnabledCuDNN(before); };
                              }));
    }
  }

 private:
  std::vector<setting_claim> claims_;
};

}  // namespace torchloom::detail
