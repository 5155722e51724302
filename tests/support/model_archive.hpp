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

namespace torchloom_test {

//! Writes a zip archive with an AOTInductor package's layout through torch's archive writer
//! (`model/archive_format` reading "pt2", `model/data/aotinductor/model/...`): what tells a
//! package from a TorchScript archive, without a compiled model in it.
inline void write_package_layout(const std::filesystem::path& path) {
  caffe2::serialize::PyTorchStreamWriter writer(path.string());
  const std::vector<std::pair<std::string, std::string>> records = {
      {"archive_format", "pt2"},
      {"archive_version", "0"},
      {"byteorder", "little"},
      {"data/aotinductor/model/model.wrapper.cpp", "// not compiled"},
      {"data/aotinductor/model/model.wrapper.so", std::string(64, '\0')}};
  for (const auto& [name, bytes] : records) writer.writeRecord(name, bytes.data(), bytes.size());
  writer.writeEndOfFile();
}

}  // namespace torchloom_test
