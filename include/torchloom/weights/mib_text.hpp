#pragma once
// Byte counts in MiB, the unit of WEIGHT_OFFLOAD_BUDGET_MB, and their texts in error messages.
#include <torchloom/detail/strings.hpp>

#include <cstdint>
#include <string>

namespace torchloom::detail {

inline constexpr std::int64_t mib = std::int64_t{1} << 20;

//! "3 MiB" for a byte count, rounded up to whole MiB (the unit of WEIGHT_OFFLOAD_BUDGET_MB).
inline std::string mib_text(std::int64_t bytes) {
  return concat((bytes + mib - 1) / mib, " MiB");
}

//! "7.01 MiB": a byte count in MiB with two decimals.
inline std::string size_text(std::int64_t bytes) {
  const std::int64_t hundredths = (bytes * 100 + mib / 2) / mib;
  const std::int64_t frac = hundredths % 100;
  return concat(hundredths / 100, '.', frac < 10 ? "0" : "", frac, " MiB");
}

}  // namespace torchloom::detail
