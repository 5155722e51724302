#pragma once
// A zip archive's records checked against its central directory and the file before torch's
// reader sees them: torch's reader allocates the size a record declares and inflates into it,
// so a record that declares more than it holds, or inflates a thousandfold, costs memory (or
// worse) before anything fails.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <torchloom/archive_limits.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/zip_directory.hpp>
#include <unordered_set>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! One entry of a checked archive and where its data begin in the file.
struct zip_record {
  const zip_entry* entry = nullptr;
  std::uint64_t data_offset = 0;
};

//! What check_zip_records found: the records (in the directory's order), or what is wrong.
struct zip_records_check {
  std::vector<zip_record> records;
  std::string problem;  //!< empty when every record passed
};

//! Reads a zip archive's local headers through a window of the file: the headers of the small
//! records of a model (most of them) share one read.
class zip_header_reader {
 public:
  explicit zip_header_reader(const zip_file& f) : f_(f) {}

  //! `n` bytes at `offset`, or nullopt when the file has fewer; valid until the next call.
  std::optional<std::string_view> read(std::uint64_t offset, std::uint64_t n) {
    if (offset < start_ || offset - start_ > window_.size() ||
        n > window_.size() - (offset - start_)) {
      if (offset > f_.size()) return std::nullopt;
      auto got = f_.read(offset, std::min(std::max(n, window_bytes), f_.size() - offset));
      if (!got || got->size() < n) return std::nullopt;
      window_ = std::move(*got);
      start_ = offset;
    }
    return std::string_view(window_).substr(static_cast<std::size_t>(offset - start_),
                                            static_cast<std::size_t>(n));
  }

 private:
  static constexpr std::uint64_t window_bytes = 64 << 10;
  const zip_file& f_;
  std::string window_;
  std::uint64_t start_ = 0;
};

//! The sizes the local header at `local_offset` gives, ZIP64 ones from its extra field
//! (compressed, then uncompressed); nullopt when it gives none (a data descriptor after the
//! data holds them) or cannot be read.
inline std::optional<std::pair<std::uint64_t, std::uint64_t>> local_sizes(
    zip_header_reader& headers, std::uint64_t local_offset) {
  const auto header = headers.read(local_offset, 30);
  if (!header || (zip_field(*header, 6, 2) & 0x8) != 0) return std::nullopt;
  std::uint64_t compressed = zip_field(*header, 18, 4);
  std::uint64_t size = zip_field(*header, 22, 4);
  if (compressed == 0xffffffff || size == 0xffffffff) {
    const std::size_t name_size = zip_field(*header, 26, 2);
    const std::size_t extra_size = zip_field(*header, 28, 2);
    const auto extra = headers.read(local_offset + 30 + name_size, extra_size);
    if (!extra) return std::nullopt;
    for (std::size_t x = 0; x + 4 <= extra->size();) {
      const std::size_t field = zip_field(*extra, x + 2, 2);
      if (zip_field(*extra, x, 2) == 1) {
        std::size_t v = x + 4;
        const std::size_t end = std::min(v + field, extra->size());
        if (size == 0xffffffff && v + 8 <= end) {
          size = zip_field(*extra, v, 8);
          v += 8;
        }
        if (compressed == 0xffffffff && v + 8 <= end) compressed = zip_field(*extra, v, 8);
        break;
      }
      x += 4 + field;
    }
  }
  return std::pair{compressed, size};
}

//! Checks every entry of `entries`, the central directory of the archive `f`
//! (read_zip_directory): each name appears once; no record is encrypted, and each is stored
//! or deflated (all torch's reader reads); a stored record's compressed size is its size; a
//! deflated one inflates to at most max_inflated_record_bytes, and to at most
//! max_record_inflation times its compressed size beyond inflation_allowance_bytes; its local
//! header is where the directory says, and the sizes it gives are the directory's; its data
//! lie in the file; no two records share bytes. Reads each local header, never the data.
inline zip_records_check check_zip_records(const zip_file& f,
                                           const std::vector<zip_entry>& entries) {
  zip_records_check out;
  const auto fail = [&](const zip_entry& e, const std::string& what) {
    out.records.clear();
    out.problem = concat("record '", e.name, "' ", what);
    return out;
  };
  std::unordered_set<std::string_view> names;
  // [first byte of the local header, end of the data), entry index: for the overlap check.
  std::vector<std::pair<std::pair<std::uint64_t, std::uint64_t>, std::size_t>> spans;
  zip_header_reader headers(f);
  out.records.reserve(entries.size());
  spans.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const zip_entry& e = entries[i];
    if (!names.insert(e.name).second) return fail(e, "appears twice in the archive");
    if ((e.flags & 0x1) != 0) return fail(e, "is encrypted, which torch cannot read");
    if (e.method == 0 && e.compressed_size != e.size) {
      return fail(e, concat("is stored uncompressed but declares ", e.size, " bytes and holds ",
                            e.compressed_size));
    }
    if (e.method == 8) {
      if (e.size > max_inflated_record_bytes) {
        return fail(e, concat("is compressed and declares ", e.size,
                              " bytes inflated, over the cap of ", max_inflated_record_bytes,
                              " for a compressed record; store the archive uncompressed "
                              "(torch.jit.save does, or zip -0)"));
      }
      if (e.size > inflation_allowance_bytes && e.size / max_record_inflation > e.compressed_size) {
        return fail(e, concat("inflates ", e.compressed_size, " bytes to ", e.size, ", more than ",
                              max_record_inflation,
                              " times its compressed size; store the archive uncompressed "
                              "(torch.jit.save does, or zip -0)"));
      }
    } else if (e.method != 0) {
      return fail(e, concat("is compressed with method ", e.method,
                            "; torch reads only stored and deflated records"));
    }
    const auto header = headers.read(e.local_offset, 30);
    if (!header || zip_field(*header, 0, 4) != 0x04034b50) {
      return fail(e, concat("has no local header at offset ", e.local_offset,
                            " where the directory puts it"));
    }
    const std::uint64_t data =
        e.local_offset + 30 + zip_field(*header, 26, 2) + zip_field(*header, 28, 2);
    if (data > f.size() || e.compressed_size > f.size() - data) {
      return fail(e, concat("declares ", e.compressed_size, " bytes at offset ", data,
                            ", past the end of the file (", f.size(), " bytes)"));
    }
    if (const auto sizes = local_sizes(headers, e.local_offset);
        sizes && (sizes->first != e.compressed_size || sizes->second != e.size)) {
      return fail(e, concat("declares ", sizes->second, " bytes (", sizes->first,
                            " compressed) in its local header but ", e.size, " (",
                            e.compressed_size, " compressed) in the directory"));
    }
    out.records.push_back({&e, data});
    spans.push_back({{e.local_offset, data + e.compressed_size}, i});
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first.first < spans[i - 1].first.second) {
      return fail(entries[spans[i].second],
                  concat("shares bytes with record '", entries[spans[i - 1].second].name, "'"));
    }
  }
  return out;
}

}  // namespace torchloom::detail
