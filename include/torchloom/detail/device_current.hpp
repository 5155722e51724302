#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>

#include <ATen/Functions.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <string>

namespace torchloom::detail {

//! For its lifetime, makes a CUDA `device` the current one, with its context created (what
//! a model-init hook is promised); does nothing for the CPU. Throws hook_failed (naming
//! `model`) when the device cannot be made ready.
class device_current {
 public:
  device_current(const std::string& model, c10::Device device) {
    if (!device.is_cuda()) return;
    try {
      guard_.emplace(device);
      // torch creates a device's context lazily, on its first allocation there.
      (void)at::empty({1}, at::TensorOptions().device(device));
    } catch (const std::exception& e) {
      throw error(errc::hook_failed, model,
                  concat("cannot make ", device, " current for the model-init hook: ",
                         torch_message(e)));
    }
  }

 private:
  std::optional<c10::DeviceGuard> guard_;
};

}  // namespace torchloom::detail
