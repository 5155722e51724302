#pragma once
// A TorchScript archive checked before torch reads it (see check_torchscript_archive).
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <torchloom/detail/pickle_scan.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/detail/zip_directory.hpp>
#include <torchloom/detail/zip_records.hpp>
#include <torchloom/error.hpp>
#include <unordered_map>
#include <vector>

namespace torchloom::detail {

//! Checks the TorchScript archive `file` before torch reads any of it: its records
//! (check_zip_records: sizes, where they lie, the cap and ratio of torchloom/archive_limits.hpp
//! for compressed ones); the pickles torch unpickles (`data.pkl`, `constants.pkl`, the code's
//! `.debug_pkl`: scan_pickle); and every storage they declare against its record (`data/<key>`,
//! `constants/<key>`): a storage that declares more bytes than its record holds is refused.
//! Nothing is checked in a file that is not a zip archive (torch tells what it is). Throws
//! load_failed naming the model, the file and the record or storage.
inline void check_torchscript_archive(const std::string& model, const std::filesystem::path& file) {
  const std::string where = concat("'", file.string(), "'");
  const auto fail = [&](const std::string& what) {
    throw error(errc::load_failed, model,
                concat(where, ": ", what, "; the file is corrupt or was altered"));
  };
  const zip_file f(file);
  if (!f.ok()) return;  // the loader reports what it cannot open
  const auto entries = read_zip_directory(file);
  if (!entries) {
    const auto magic = f.read(0, 2);
    if (magic && *magic == "PK") fail("its zip archive's central directory cannot be read");
    return;
  }
  const auto checked = check_zip_records(f, *entries);
  if (!checked.problem.empty()) fail(checked.problem);
  if (entries->empty()) return;
  // torch's reader takes the archive's root from its first record.
  const auto slash = entries->front().name.find('/');
  if (slash == std::string::npos) return;  // torch refuses it
  const std::string root = entries->front().name.substr(0, slash + 1);
  std::unordered_map<std::string_view, const zip_record*> by_name;
  for (const auto& r : checked.records) by_name.emplace(r.entry->name, &r);

  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> inflater;
  const auto read_record = [&](const zip_record& r) -> std::string {
    if (r.entry->method == 0) {
      auto bytes = f.read(r.data_offset, r.entry->size);
      if (!bytes) fail(concat("record '", r.entry->name, "' cannot be read"));
      return std::move(*bytes);
    }
    try {  // deflated: torch's reader inflates it, within the limits checked above
      if (!inflater) inflater = std::make_unique<caffe2::serialize::PyTorchStreamReader>(file);
      auto [data, size] = inflater->getRecord(r.entry->name.substr(root.size()));
      return std::string(static_cast<const char*>(data.get()), size);
    } catch (const std::exception& e) {
      fail(concat("record '", r.entry->name, "' cannot be inflated: ", torch_message(e)));
    }
    return {};
  };
  const auto check_pickle = [&](const zip_record& r, const std::string& tensors) {
    const std::string bytes = read_record(r);
    if (bytes.empty() && r.entry->size != 0) return;  // a debug pickle torch's reader skips
    const auto scan = scan_pickle(bytes);
    if (!scan.problem.empty()) fail(concat("'", r.entry->name, "' is malformed ", scan.problem));
    if (tensors.empty()) return;
    for (const auto& s : scan.storages) {
      if (s.numel == 0) continue;  // torch reads no record for it
      const std::string name = root + tensors + s.key;
      const auto found = by_name.find(name);
      if (found == by_name.end()) {
        fail(concat("storage '", s.key, "' of '", r.entry->name, "' has no record '", name, "'"));
      }
      const std::uint64_t bytes_declared = s.numel * s.item_size;
      const std::uint64_t held = found->second->entry->size;
      if (s.item_size != 0 && bytes_declared > held) {
        fail(concat("storage '", s.key, "' of '", r.entry->name, "'",
                    s.name.empty() ? std::string() : concat(" (tensor '", s.name, "')"),
                    " declares ", s.numel, " ", s.type, " elements (", bytes_declared, " bytes",
                    bytes_declared > f.size() ? concat(", more than the whole file's ", f.size())
                                              : std::string(),
                    ") but its record '", name, "' holds ", held, " bytes"));
      }
    }
  };
  for (const auto& r : checked.records) {
    if (r.entry->name.compare(0, root.size(), root) != 0) continue;  // torch never reads it
    const std::string_view name = std::string_view(r.entry->name).substr(root.size());
    if (name == "data.pkl") {
      check_pickle(r, "data/");
    } else if (name == "constants.pkl") {
      check_pickle(r, "constants/");
    } else if (name.rfind("code/", 0) == 0 && name.size() > 10 &&
               name.substr(name.size() - 10) == ".debug_pkl") {
      check_pickle(r, {});
    }
  }
}

}  // namespace torchloom::detail
