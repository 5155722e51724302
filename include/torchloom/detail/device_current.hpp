#pragma once
#include <ATen/Functions.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include <optional>

namespace torchloom::detail {

//! For its lifetime, makes a CUDA `device` the current one, with its context created (what
//! a model-init hook is promised); does nothing for the CPU.
class device_current {
 public:
  explicit device_current(c10::Device device) {
    if (!device.is_cuda()) return;
    guard_.emplace(device);
    // torch creates a device's context lazily, on its first allocation there.
    (void)at::empty({1}, at::TensorOptions().device(device));
  }

 private:
  std::optional<c10::DeviceGuard> guard_;
};

}  // namespace torchloom::detail
