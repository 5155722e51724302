#pragma once
#include <ATen/core/jit_type.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchloom {

//! What a model declares about one input. Loaders fill in what they know (the TorchScript
//! schema, an AOTI package's metadata); a Triton config adds dtype and shape.
struct input_spec {
  std::string name;
  bool is_tensor = true;   //!< false: another value type, checked against `type`
  c10::TypePtr type;       //!< the TorchScript type, where known
  std::optional<c10::ScalarType> dtype;
  std::optional<std::vector<std::int64_t>> shape;  //!< full shape; -1 for a free dimension
  std::int64_t max_batch_size = 0;  //!< > 0: the first dimension may not exceed it
  bool has_default = false;  //!< may be left out of run()'s inputs
};

//! A model's inputs, in call order.
using input_signature = std::vector<input_spec>;

}  // namespace torchloom
