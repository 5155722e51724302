#pragma once
#include <c10/core/ScalarType.h>

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace torchloom {

//! The tensor dtypes by the names users write in Python ("float32"), as in config.pbtxt
//! checks, error messages and torchloom-run's --input.
inline constexpr std::array<std::pair<std::string_view, c10::ScalarType>, 10> dtype_names{{
    {"float32", c10::ScalarType::Float},
    {"float64", c10::ScalarType::Double},
    {"float16", c10::ScalarType::Half},
    {"bfloat16", c10::ScalarType::BFloat16},
    {"int64", c10::ScalarType::Long},
    {"int32", c10::ScalarType::Int},
    {"int16", c10::ScalarType::Short},
    {"int8", c10::ScalarType::Char},
    {"uint8", c10::ScalarType::Byte},
    {"bool", c10::ScalarType::Bool},
}};

//! "float32" rather than torch's "Float": the names users write in Python.
inline std::string dtype_name(c10::ScalarType t) {
  for (const auto& [name, type] : dtype_names) {
    if (type == t) return std::string(name);
  }
  return c10::toString(t);
}

//! The dtype called `name` (one of dtype_names), or none.
inline std::optional<c10::ScalarType> parse_dtype(std::string_view name) {
  for (const auto& [n, type] : dtype_names) {
    if (n == name) return type;
  }
  return std::nullopt;
}

}  // namespace torchloom
