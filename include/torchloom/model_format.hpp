#pragma once
#include <torchloom/detail/zip_directory.hpp>

#include <filesystem>
#include <set>
#include <string>
#include <string_view>

namespace torchloom {

//! What a model file holds, as its zip archive's entries tell: a TorchScript archive
//! (`torch.jit.save`: `<root>/data.pkl` and `<root>/code/`), an AOTInductor package
//! (`torch._inductor.aoti_compile_and_package`: `<root>/archive_format` reading "pt2" and
//! `<root>/data/aotinductor/`), or neither that torchloom can tell (not a zip archive, a
//! damaged one, another kind of archive).
enum class model_format { unknown, torchscript, aoti };

//! "a TorchScript archive", "an AOTInductor package", "a file of unknown format".
constexpr std::string_view describe(model_format f) noexcept {
  switch (f) {
    case model_format::torchscript: return "a TorchScript archive";
    case model_format::aoti: return "an AOTInductor package";
    default: return "a file of unknown format";
  }
}

//! The format of `file` (see model_format). Reads the archive's central directory (and the
//! few bytes of `archive_format`), never the model; unknown when the file does not exist or
//! cannot be read. Does not throw.
inline model_format read_model_format(const std::filesystem::path& file) noexcept {
  try {
    const auto entries = detail::read_zip_directory(file);
    if (!entries) return model_format::unknown;
    std::set<std::string> names;
    for (const auto& e : *entries) names.insert(e.name);
    const auto has_prefix = [&](const std::string& prefix) {
      const auto it = names.lower_bound(prefix);
      return it != names.end() && it->compare(0, prefix.size(), prefix) == 0;
    };
    for (const auto& e : *entries) {
      const auto slash = e.name.find('/');
      if (slash == std::string::npos || e.name.find('/', slash + 1) != std::string::npos) {
        continue;  // only `<root>/<leaf>` entries name the markers
      }
      const std::string root = e.name.substr(0, slash + 1);
      const std::string_view leaf = std::string_view(e.name).substr(slash + 1);
      if (leaf == "data.pkl" && has_prefix(root + "code/")) return model_format::torchscript;
      if (leaf == "archive_format" && has_prefix(root + "data/aotinductor/")) {
        // Written stored by torch; a compressed one cannot be read here, and its name with
        // the aotinductor directory is evidence enough.
        const auto text = detail::read_stored_entry(file, e, 16);
        if (!text || text->rfind("pt2", 0) == 0) return model_format::aoti;
      }
    }
  } catch (...) {  // std::bad_alloc: unknown, as the promise above says
  }
  return model_format::unknown;
}

}  // namespace torchloom
