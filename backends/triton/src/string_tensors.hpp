#pragma once
// Triton's TYPE_STRING (BYTES) tensors as the List[str] a TorchScript model takes and returns:
// on the wire, each element is a 4-byte little-endian length followed by that many bytes.
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <ATen/core/List.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchloom::triton_backend {

//! Appends to `out` the `elements` strings of one BYTES tensor of `bytes` bytes at `data`.
//! Throws bad_input naming `model` and `input` when the buffer is not exactly that many
//! elements (a length past the end, bytes left over, too few elements).
inline void read_strings(const std::string& model, const std::string& input, const char* data,
                         std::size_t bytes, std::int64_t elements, c10::List<std::string>& out) {
  std::size_t at = 0;
  for (std::int64_t e = 0; e < elements; ++e) {
    if (bytes - at < 4) {
      throw error(errc::bad_input, model,
                  detail::concat("input '", input, "' holds ", e, " strings, not ", elements,
                                 ": its ", bytes, " bytes end ", bytes - at == 0 ? "" : "inside ",
                                 "the length of string ", e));
    }
    std::uint32_t n = 0;
    for (int b = 0; b < 4; ++b) {
      n |= static_cast<std::uint32_t>(static_cast<unsigned char>(data[at + b])) << (8 * b);
    }
    at += 4;
    if (bytes - at < n) {
      throw error(errc::bad_input, model,
                  detail::concat("input '", input, "': string ", e, " says it has ", n,
                                 " bytes, but only ", bytes - at, " are left"));
    }
    out.push_back(std::string(data + at, n));
    at += n;
  }
  if (at != bytes) {
    throw error(errc::bad_input, model,
                detail::concat("input '", input, "' holds more than its ", elements,
                               " strings: ", bytes - at, " bytes are left over"));
  }
}

//! Elements [begin, end) of `list` in Triton's BYTES wire format. Throws run_failed naming
//! `model` and `output` for a string of 4 GiB or more, which the format cannot carry.
inline std::string write_strings(const std::string& model, const std::string& output,
                                 const c10::List<std::string>& list, std::size_t begin,
                                 std::size_t end) {
  std::string out;
  for (std::size_t i = begin; i < end; ++i) {
    const std::string s = list.get(i);
    if (s.size() > 0xffffffffu) {
      throw error(errc::run_failed, model,
                  detail::concat("output '", output, "': string ", i, " has ", s.size(),
                                 " bytes; Triton's strings hold at most 4 GiB - 1"));
    }
    const auto n = static_cast<std::uint32_t>(s.size());
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((n >> (8 * b)) & 0xffu));
    out += s;
  }
  return out;
}

}  // namespace torchloom::triton_backend
