#pragma once
// The entries of a zip archive, read from its central directory without torch: enough to tell
// what a model file holds (a TorchScript archive, an AOTInductor package) before a loader
// hands it to torch, whose own messages for the wrong kind of archive say little.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom::detail {

//! One entry of a zip archive's central directory.
struct zip_entry {
  std::string name;
  std::uint16_t method = 0;  //!< 0: stored (uncompressed), 8: deflated
  std::uint16_t flags = 0;   //!< the general-purpose bits (bit 0: encrypted)
  std::uint64_t compressed_size = 0;
  std::uint64_t size = 0;
  std::uint64_t local_offset = 0;  //!< where its local header starts
};

//! The largest central directory read (64 MiB): a TorchScript archive of 100 000 tensors
//! needs about 10 MiB; beyond this the archive is taken as unreadable rather than read whole.
inline constexpr std::uint64_t max_zip_directory_bytes = std::uint64_t{64} << 20;

//! An open file, read with pread; closed when destroyed.
class zip_file {
 public:
  explicit zip_file(const std::filesystem::path& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) {
    struct stat st {};
    if (fd_ >= 0 && ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode)) {
      size_ = static_cast<std::uint64_t>(st.st_size);
    } else if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  zip_file(const zip_file&) = delete;
  zip_file& operator=(const zip_file&) = delete;
  ~zip_file() {
    if (fd_ >= 0) ::close(fd_);
  }

  //! Whether the file is open and regular.
  bool ok() const noexcept { return fd_ >= 0; }
  std::uint64_t size() const noexcept { return size_; }

  //! `n` bytes at `offset`, or nullopt when the file has fewer.
  std::optional<std::string> read(std::uint64_t offset, std::uint64_t n) const {
    if (!ok() || offset > size_ || n > size_ - offset) return std::nullopt;
    std::string out(static_cast<std::size_t>(n), '\0');
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t got = ::pread(fd_, out.data() + done, out.size() - done,
                                  static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return std::nullopt;
      done += static_cast<std::size_t>(got);
    }
    return out;
  }

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

//! Little-endian fields of a zip record.
inline std::uint64_t zip_field(std::string_view bytes, std::size_t at, std::size_t width) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < width; ++i) {
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  }
  return v;
}

//! The central directory of the zip archive `path`: every entry, in the archive's order.
//! nullopt when the file cannot be opened, is not a zip archive, or its directory is
//! malformed or larger than max_zip_directory_bytes. ZIP64 archives are read.
inline std::optional<std::vector<zip_entry>> read_zip_directory(const std::filesystem::path& path) {
  const zip_file f(path);
  if (!f.ok() || f.size() < 22) return std::nullopt;
  // The end-of-central-directory record: 22 bytes and a comment of up to 65535.
  const std::uint64_t tail_size = std::min<std::uint64_t>(f.size(), 22 + 65535);
  const auto tail = f.read(f.size() - tail_size, tail_size);
  if (!tail) return std::nullopt;
  std::optional<std::size_t> eocd;
  for (std::size_t i = tail->size() - 22 + 1; i-- > 0;) {
    if (zip_field(*tail, i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (!eocd) return std::nullopt;
  std::uint64_t count = zip_field(*tail, *eocd + 10, 2);
  std::uint64_t directory_size = zip_field(*tail, *eocd + 12, 4);
  std::uint64_t directory_offset = zip_field(*tail, *eocd + 16, 4);
  const std::uint64_t eocd_position = f.size() - tail_size + *eocd;
  if (count == 0xffff || directory_size == 0xffffffff || directory_offset == 0xffffffff) {
    // ZIP64: a locator just before the record points at the ZIP64 end record.
    if (eocd_position < 20) return std::nullopt;
    const auto locator = f.read(eocd_position - 20, 20);
    if (!locator || zip_field(*locator, 0, 4) != 0x07064b50) return std::nullopt;
    const auto end64 = f.read(zip_field(*locator, 8, 8), 56);
    if (!end64 || zip_field(*end64, 0, 4) != 0x06064b50) return std::nullopt;
    count = zip_field(*end64, 32, 8);
    directory_size = zip_field(*end64, 40, 8);
    directory_offset = zip_field(*end64, 48, 8);
  }
  if (directory_size > max_zip_directory_bytes || count > directory_size / 46 + 1) {
    return std::nullopt;
  }
  const auto directory = f.read(directory_offset, directory_size);
  if (!directory) return std::nullopt;
  std::vector<zip_entry> entries;
  entries.reserve(static_cast<std::size_t>(count));
  std::size_t at = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (directory->size() - at < 46 || zip_field(*directory, at, 4) != 0x02014b50) {
      return std::nullopt;
    }
    zip_entry e;
    e.flags = static_cast<std::uint16_t>(zip_field(*directory, at + 8, 2));
    e.method = static_cast<std::uint16_t>(zip_field(*directory, at + 10, 2));
    e.compressed_size = zip_field(*directory, at + 20, 4);
    e.size = zip_field(*directory, at + 24, 4);
    const std::size_t name_size = zip_field(*directory, at + 28, 2);
    const std::size_t extra_size = zip_field(*directory, at + 30, 2);
    const std::size_t comment_size = zip_field(*directory, at + 32, 2);
    e.local_offset = zip_field(*directory, at + 42, 4);
    const std::size_t record = 46 + name_size + extra_size + comment_size;
    if (directory->size() - at < record) return std::nullopt;
    e.name = directory->substr(at + 46, name_size);
    // ZIP64 sizes and offset: an extra field (id 1) holds those whose field reads all ones.
    for (std::size_t x = at + 46 + name_size; x + 4 <= at + 46 + name_size + extra_size;) {
      const std::uint64_t id = zip_field(*directory, x, 2);
      const std::size_t size = zip_field(*directory, x + 2, 2);
      std::size_t v = x + 4;
      const std::size_t end = std::min(v + size, at + 46 + name_size + extra_size);
      if (id == 1) {
        const auto next = [&](std::uint64_t& field) {
          if (field != 0xffffffff) return;
          if (v + 8 > end) return;
          field = zip_field(*directory, v, 8);
          v += 8;
        };
        next(e.size);
        next(e.compressed_size);
        next(e.local_offset);
      }
      x += 4 + size;
    }
    entries.push_back(std::move(e));
    at += record;
  }
  return entries;
}

//! The first `max` bytes of the stored (uncompressed) entry `e` of the archive `path`;
//! nullopt when it is compressed or cannot be read.
inline std::optional<std::string> read_stored_entry(const std::filesystem::path& path,
                                                    const zip_entry& e, std::size_t max) {
  if (e.method != 0) return std::nullopt;
  const zip_file f(path);
  const auto header = f.read(e.local_offset, 30);
  if (!header || zip_field(*header, 0, 4) != 0x04034b50) return std::nullopt;
  const std::uint64_t data = e.local_offset + 30 + zip_field(*header, 26, 2) +
                             zip_field(*header, 28, 2);
  return f.read(data, std::min<std::uint64_t>(e.size, max));
}

}  // namespace torchloom::detail
