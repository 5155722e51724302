#pragma once
// Zip archives written byte by byte, for what torch's writer never makes: ZIP64 records,
// compressed records, a comment after the directory, and sizes that disagree with the data.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom_test {

//! One record of a hand-made zip archive.
struct zip_record {
  std::string name{};
  std::string data{};                   //!< the bytes in the file (compressed for method 8)
  std::uint16_t method = 0;             //!< 0: stored, 8: deflated
  std::optional<std::uint64_t> size{};  //!< the size the directory declares (default data's)
  std::uint32_t crc = 0;                //!< of the uncompressed bytes (the reader of model formats
                                        //!< does not check it; torch's reader does)
  std::optional<std::uint64_t> local_size{};  //!< what the local header declares, if not size
};

//! CRC-32 (the zip format's) of `bytes`.
inline std::uint32_t crc32(std::string_view bytes) {
  std::uint32_t crc = 0xffffffff;
  for (const char c : bytes) {
    crc ^= static_cast<unsigned char>(c);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320 & (0u - (crc & 1)));
  }
  return ~crc;
}

//! `bytes` as one deflate block with the fixed Huffman codes: a run of one byte becomes
//! matches of 258 bytes at distance 1 (about 160 times smaller), the rest literals.
inline std::string deflate_runs(std::string_view bytes) {
  std::string out;
  std::uint32_t acc = 0;
  int count = 0;
  const auto bits = [&](std::uint32_t v, int n) {  // least significant bit first
    for (int i = 0; i < n; ++i) {
      acc |= ((v >> i) & 1u) << count;
      if (++count == 8) {
        out.push_back(static_cast<char>(acc));
        acc = 0;
        count = 0;
      }
    }
  };
  const auto code = [&](std::uint32_t v, int n) {  // Huffman codes: most significant first
    for (int i = n - 1; i >= 0; --i) bits((v >> i) & 1u, 1);
  };
  bits(1, 1);  // the last block
  bits(1, 2);  // fixed Huffman codes
  for (std::size_t i = 0; i < bytes.size();) {
    const auto run = [&] {
      if (i == 0 || bytes.size() - i < 258) return false;
      for (std::size_t k = 0; k < 258; ++k) {
        if (bytes[i + k] != bytes[i - 1]) return false;
      }
      return true;
    };
    if (run()) {
      code(0xc5, 8);  // length 258 (symbol 285)
      code(0, 5);     // distance 1
      i += 258;
      continue;
    }
    const auto b = static_cast<unsigned char>(bytes[i++]);
    if (b < 144) {
      code(0x30 + b, 8);
    } else {
      code(0x190 + (b - 144), 9);
    }
  }
  code(0, 7);  // end of block
  if (count > 0) out.push_back(static_cast<char>(acc));
  return out;
}

//! A stored record of `bytes`.
inline zip_record stored(std::string name, std::string bytes) {
  zip_record r{std::move(name), std::move(bytes)};
  r.crc = crc32(r.data);
  return r;
}

//! A deflated record of `bytes` (deflate_runs).
inline zip_record deflated(std::string name, std::string_view bytes) {
  zip_record r{std::move(name), deflate_runs(bytes), 8, bytes.size()};
  r.crc = crc32(bytes);
  return r;
}

inline void put_le(std::string& out, std::uint64_t v, int width) {
  // Past 8 bytes, zeros (a run of zero fields at once): no 64-bit value is shifted by 64.
  for (int i = 0; i < width; ++i) {
    out.push_back(i < 8 ? static_cast<char>((v >> (8 * i)) & 0xff) : '\0');
  }
}

//! The zip archive of `records`, in that order; with `zip64`, the directory gives every size
//! and offset in ZIP64 extra fields; `comment` follows the end record.
inline std::string make_zip(const std::vector<zip_record>& records, bool zip64 = false,
                            const std::string& comment = "") {
  std::string out;
  std::string directory;
  const auto put = put_le;
  for (const auto& r : records) {
    const std::uint64_t offset = out.size();
    const std::uint64_t size = r.size.value_or(r.data.size());
    put(out, 0x04034b50, 4);
    put(out, 45, 2);
    put(out, 0, 2);
    put(out, r.method, 2);
    put(out, 0, 4);  // time, date
    put(out, r.crc, 4);
    put(out, r.data.size(), 4);
    put(out, r.local_size.value_or(size), 4);
    put(out, r.name.size(), 2);
    put(out, 0, 2);
    out += r.name + r.data;
    put(directory, 0x02014b50, 4);
    put(directory, 45, 2);
    put(directory, 45, 2);
    put(directory, 0, 2);
    put(directory, r.method, 2);
    put(directory, 0, 4);  // time, date
    put(directory, r.crc, 4);
    put(directory, zip64 ? 0xffffffff : r.data.size(), 4);
    put(directory, zip64 ? 0xffffffff : size, 4);
    put(directory, r.name.size(), 2);
    put(directory, zip64 ? 28 : 0, 2);
    put(directory, 0, 2 + 2 + 2 + 4);
    put(directory, zip64 ? 0xffffffff : offset, 4);
    directory += r.name;
    if (zip64) {
      put(directory, 1, 2);
      put(directory, 24, 2);
      put(directory, size, 8);
      put(directory, r.data.size(), 8);
      put(directory, offset, 8);
    }
  }
  const std::uint64_t directory_offset = out.size();
  out += directory;
  if (zip64) {
    const std::uint64_t end64 = out.size();
    put(out, 0x06064b50, 4);
    put(out, 44, 8);
    put(out, 45, 2);
    put(out, 45, 2);
    put(out, 0, 8);
    put(out, records.size(), 8);
    put(out, records.size(), 8);
    put(out, directory.size(), 8);
    put(out, directory_offset, 8);
    put(out, 0x07064b50, 4);
    put(out, 0, 4);
    put(out, end64, 8);
    put(out, 1, 4);
  }
  put(out, 0x06054b50, 4);
  put(out, 0, 4);
  put(out, zip64 ? 0xffff : records.size(), 2);
  put(out, zip64 ? 0xffff : records.size(), 2);
  put(out, zip64 ? 0xffffffff : directory.size(), 4);
  put(out, zip64 ? 0xffffffff : directory_offset, 4);
  put(out, comment.size(), 2);
  return out + comment;
}

}  // namespace torchloom_test
