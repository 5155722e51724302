#pragma once
// What torchloom lets a model archive's compressed records inflate to. torch.jit.save stores
// every record uncompressed; a compressed record comes from re-packing the archive with a
// zip tool, and torch's reader allocates the size a record declares before inflating it.
#include <cstdint>

namespace torchloom {

//! The largest a compressed record of a model archive may declare itself inflated (1 GiB).
//! Stored records have no such cap: their bytes must lie in the file.
inline constexpr std::uint64_t max_inflated_record_bytes = std::uint64_t{1} << 30;

//! How many times its compressed size a compressed record may inflate to (100), beyond
//! inflation_allowance_bytes: deflate reaches about 1,000 on runs of one byte.
inline constexpr std::uint64_t max_record_inflation = 100;

//! What any compressed record may inflate to whatever its ratio (1 MiB): small runs of
//! zeros (a zero-initialised buffer) compress far beyond max_record_inflation.
inline constexpr std::uint64_t inflation_allowance_bytes = std::uint64_t{1} << 20;

}  // namespace torchloom
