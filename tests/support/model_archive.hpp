#pragma once
// Rewriting a TorchScript archive record by record through torch's own archive writer, so
// the zip container stays valid (checksums, alignment) while the records themselves are
// altered: what a corrupted or hostile model.pt looks like to torch's loader.
#include <caffe2/serialize/inline_container.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace torchloom_test {

//! The records of the archive at `path`, by name, in the archive's order.
inline std::vector<std::pair<std::string, std::string>> read_archive(
    const std::filesystem::path& path) {
  caffe2::serialize::PyTorchStreamReader reader(path.string());
  std::vector<std::pair<std::string, std::string>> records;
  for (const auto& name : reader.getAllRecords()) {
    auto [data, size] = reader.getRecord(name);
    records.emplace_back(name, std::string(static_cast<const char*>(data.get()), size));
  }
  return records;
}

//! The archive's format version, which the writer must be given back.
inline std::uint64_t archive_version(const std::filesystem::path& path) {
  return caffe2::serialize::PyTorchStreamReader(path.string()).version();
}

//! Writes `records` as a TorchScript archive at `path` (format `version`). The records the
//! writer adds itself (the version) are skipped.
inline void write_archive(const std::filesystem::path& path,
                          const std::vector<std::pair<std::string, std::string>>& records,
                          std::uint64_t version) {
  caffe2::serialize::PyTorchStreamWriter writer(path.string());
  writer.setMinVersion(version);
  for (const auto& [name, bytes] : records) {
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id") {
      continue;
    }
    writer.writeRecord(name, bytes.data(), bytes.size());
  }
  writer.writeEndOfFile();
}

//! Copies the archive `in` to `out`, letting `edit(name, bytes)` change each record; a
//! record for which it returns false is left out.
inline void rewrite_archive(const std::filesystem::path& in, const std::filesystem::path& out,
                            const std::function<bool(const std::string&, std::string&)>& edit) {
  auto records = read_archive(in);
  std::vector<std::pair<std::string, std::string>> kept;
  for (auto& [name, bytes] : records) {
    if (edit(name, bytes)) kept.emplace_back(name, std::move(bytes));
  }
  write_archive(out, kept, archive_version(in));
}

}  // namespace torchloom_test
