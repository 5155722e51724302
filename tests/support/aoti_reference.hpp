#pragma once
// What scripts/make_aoti_fixtures.py saved next to each package: the inputs it ran the model
// on and the model's outputs in Python (buffers in0, in1, ... and out0, out1, ... of a
// TorchScript module, readable without Python).
#include <torch/script.h>

#include <filesystem>
#include <vector>

namespace torchloom_test {

struct aoti_reference {
  std::vector<c10::IValue> inputs;
  std::vector<at::Tensor> outputs;
};

inline aoti_reference read_aoti_reference(const std::filesystem::path& dir) {
  const auto holder = torch::jit::load((dir / "reference.pt").string());
  aoti_reference ref;
  for (const auto& b : holder.named_buffers()) {
    if (b.name.rfind("in", 0) == 0) ref.inputs.emplace_back(b.value);
    if (b.name.rfind("out", 0) == 0) ref.outputs.push_back(b.value);
  }
  return ref;
}

//! `inputs` (tensors), each moved to `device`.
inline std::vector<c10::IValue> on_device(const std::vector<c10::IValue>& inputs,
                                          c10::Device device) {
  std::vector<c10::IValue> out;
  for (const auto& v : inputs) out.emplace_back(v.toTensor().to(device));
  return out;
}

}  // namespace torchloom_test
