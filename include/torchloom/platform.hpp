#pragma once
//! Which of Triton's PyTorch platforms a model is, decided as Triton's core completes a model
//! configuration: `torch_aoti` is an AOTInductor package (`model.pt2`), `pytorch_libtorch`
//! (alias `libtorch`) a TorchScript archive (`model.pt`).
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/model_format.hpp>
#include <torchloom/triton/config.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace torchloom {

//! Triton's platform of TorchScript models (also spelled `libtorch` in a config).
inline constexpr std::string_view torchscript_platform = "pytorch_libtorch";
//! Triton's platform of AOTInductor packages (Triton 26.03 and later).
inline constexpr std::string_view aoti_platform = "torch_aoti";

//! A model's platform and what decided it.
struct model_platform {
  std::string name;    //!< torchscript_platform, aoti_platform, or empty: nothing decided it
  std::string reason;  //!< what decided it, for messages ("platform 'torch_aoti'")
  std::size_t line = 0;  //!< the config.pbtxt line that decided it; 0 for none
  //! The model file's name in the version directory when the config names none.
  std::string default_filename() const {
    return name == aoti_platform ? "model.pt2" : "model.pt";
  }
};

//! The format a platform's model file has.
inline model_format format_of_platform(std::string_view platform) noexcept {
  if (platform == aoti_platform) return model_format::aoti;
  if (platform == torchscript_platform) return model_format::torchscript;
  return model_format::unknown;
}

namespace detail {

//! The platform a file's own content (else its `.pt2` name) calls for; torchloom's rule where
//! Triton's leave the platform open.
inline model_platform platform_of_file(const std::filesystem::path& file, std::string_view how) {
  switch (read_model_format(file)) {
    case model_format::aoti:
      return {std::string(aoti_platform),
              concat(how, "'", file.filename().string(), "', an AOTInductor package"), 0};
    case model_format::torchscript:
      return {std::string(torchscript_platform),
              concat(how, "'", file.filename().string(), "', a TorchScript archive"), 0};
    default: break;
  }
  if (file.extension() == ".pt2") {
    return {std::string(aoti_platform), concat(how, "'", file.filename().string(), "'"), 0};
  }
  return {};
}

}  // namespace detail

//! The platform of a model in `version_directory` whose config.pbtxt is `config` (null: no
//! config), by Triton's rules:
//!  - `platform: "torch_aoti"`, `"pytorch_libtorch"` or `"libtorch"` decides;
//!  - else `backend: "pytorch"` means pytorch_libtorch (AOTInductor must be asked for);
//!  - else, with no backend line, `default_model_filename: "model.pt"` means pytorch_libtorch,
//!    and so does `"model.pt2"` (Triton sets backend pytorch, whose default is TorchScript);
//!  - else, with no default_model_filename, the version directory decides: a `model.pt` file
//!    means pytorch_libtorch, else a `model.pt2` file torch_aoti (`model.pt` is looked at
//!    first, and a directory of that name stops the search, as in Triton).
//! Where Triton decides nothing (`backend: "torchloom"`, which Triton does not complete, or a
//! default_model_filename of another name), the model file's content decides, else a `.pt2`
//! name; the version directory as above when there is no default_model_filename. Does not
//! throw for files it cannot read: their loader says why.
inline model_platform resolve_platform(const triton_config* config,
                                       const std::filesystem::path& version_directory) {
  namespace fs = std::filesystem;
  std::string platform, backend, file;
  if (config) {
    platform = config->platform;
    backend = config->backend;
    file = config->default_model_filename;
  }
  const std::size_t platform_line = config ? config->platform_line : 0;
  if (platform == aoti_platform) {
    return {std::string(aoti_platform), "platform 'torch_aoti'", platform_line};
  }
  if (platform == torchscript_platform || platform == "libtorch") {
    return {std::string(torchscript_platform), detail::concat("platform '", platform, "'"),
            platform_line};
  }
  if (backend == "pytorch") {
    return {std::string(torchscript_platform),
            "backend 'pytorch' with no platform line (Triton's default platform for it)",
            config->backend_line};
  }
  if (backend.empty() && (file == "model.pt" || file == "model.pt2")) {
    return {std::string(torchscript_platform),
            detail::concat("default_model_filename '", file,
                           "' with no platform or backend line (Triton then sets backend "
                           "'pytorch', whose default platform this is)"),
            config->default_model_filename_line};
  }
  if (!file.empty()) {
    auto p = detail::platform_of_file(version_directory / file, "default_model_filename ");
    if (!p.name.empty()) p.line = config->default_model_filename_line;
    return p;
  }
  std::error_code ec;
  const auto kind = [&](const char* n) { return fs::status(version_directory / n, ec).type(); };
  if (const auto pt = kind("model.pt"); pt != fs::file_type::not_found) {
    if (pt == fs::file_type::directory) return {};
    return {std::string(torchscript_platform), "the version directory's model.pt", 0};
  }
  if (const auto pt2 = kind("model.pt2");
      pt2 != fs::file_type::not_found && pt2 != fs::file_type::directory) {
    return {std::string(aoti_platform), "the version directory's model.pt2", 0};
  }
  return {};
}

//! Checks that the model file, where it can be read, is what `platform` calls for: an
//! AOTInductor package for torch_aoti, a TorchScript archive for pytorch_libtorch. `file` is
//! the model file (default_model_filename, else the platform's default name in
//! `version_directory`); `named` says whether the config named it. Throws invalid_option
//! naming the model, what decided the platform (the config file and line, when a line did),
//! the file, what it is and the fix; likewise when the platform's default file is missing but
//! the other platform's is there. A file whose format cannot be told passes, and so does a
//! missing one: its loader reports it.
inline void check_platform_file(const std::string& model, const model_platform& platform,
                                const std::filesystem::path& version_directory,
                                const std::filesystem::path& file, bool named,
                                const std::filesystem::path& config_file) {
  const model_format want = format_of_platform(platform.name);
  if (want == model_format::unknown) return;
  const std::string where =
      platform.line > 0 ? detail::concat(config_file.string(), ":", platform.line, ": ") : "";
  const std::string claim =
      detail::concat(where, platform.reason, " calls for ", describe(want), " (platform '",
                     platform.name, "'");
  std::error_code ec;
  if (!named && !std::filesystem::exists(file, ec)) {
    // The other platform's file alone: the config is for the other platform.
    const bool aoti = want == model_format::aoti;
    const std::filesystem::path other = version_directory / (aoti ? "model.pt" : "model.pt2");
    if (std::filesystem::is_regular_file(other, ec)) {
      throw error(errc::invalid_option, model,
                  detail::concat(claim, ", file ", file.filename().string(),
                                 "), but the version directory '", version_directory.string(),
                                 "' holds only ", other.filename().string(), ": set platform: \"",
                                 aoti ? torchscript_platform : aoti_platform, "\""));
    }
    return;
  }
  const model_format got = read_model_format(file);
  if (got == model_format::unknown || got == want) return;
  // The platform the file's content calls for, with the file name its default is not.
  const std::string name = file.filename().string();
  const bool aoti_file = got == model_format::aoti;
  const std::string default_name = aoti_file ? "model.pt2" : "model.pt";
  const std::string fix = detail::concat(
      "set platform: \"", aoti_file ? aoti_platform : torchscript_platform, "\"",
      name == default_name
          ? std::string()
          : detail::concat(" with default_model_filename: \"", name, "\" (or name the file ",
                           default_name, ")"),
      aoti_file ? ""
                : ", or put an AOTInductor package (torch._inductor.aoti_compile_and_package) "
                  "there");
  throw error(errc::invalid_option, model,
              detail::concat(claim, "), but '", file.string(), "' is ", describe(got), ": ",
                             fix));
}

}  // namespace torchloom
