#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/options.hpp>
#include <torchloom/triton_config.hpp>

#include <c10/core/Device.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace torchloom {

//! Which model to load and how: a model file, or a Triton-layout model directory
//! (`config.pbtxt` + `<version>/<model file>`), with its options. A plain aggregate: build
//! one with from_file / from_directory / from_path, then adjust it with set().
struct model_spec {
  std::string name;                    //!< the config's name, else the directory or file name
  std::filesystem::path directory;     //!< hooks and relative library paths resolve here
  std::filesystem::path file;          //!< the model file; empty: the loader's default name
  std::filesystem::path version_directory;  //!< `<directory>/<version>` for a Triton layout
  std::optional<std::int64_t> version;      //!< the version picked in a Triton layout
  runner_options options;
  std::optional<triton_config> config;  //!< set when the directory has a config.pbtxt
  //! config.pbtxt parameters whose keys the application reserved for itself (from_directory's
  //! `host_keys`, e.g. a serving backend's policy choice): kept as text, not options.
  std::map<std::string, std::string> host_parameters;

  //! A single model file; its directory is the file's directory.
  //! Throws model_not_found when the file does not exist.
  static model_spec from_file(const std::filesystem::path& file) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) {
      throw error(errc::model_not_found, file.stem().string(),
                  detail::concat("model file '", file.string(), "' does not exist"));
    }
    model_spec s;
    s.name = file.stem().string();
    s.file = std::filesystem::absolute(file);
    s.directory = s.file.parent_path();
    s.version_directory = s.directory;
    return s;
  }

  //! A Triton-layout model directory. Picks `version` if given, else the highest numeric
  //! version subdirectory. Reads config.pbtxt if present: its name, inputs, outputs, and its
  //! `parameters`, which become options, except those whose key is in `host_keys`: they go to
  //! host_parameters. Throws model_not_found (missing directory, no version, missing
  //! version) or invalid_option (bad config or parameter).
  static model_spec from_directory(const std::filesystem::path& dir,
                                   std::optional<std::int64_t> version = std::nullopt,
                                   const std::vector<std::string>& host_keys = {}) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path absolute = fs::absolute(dir).lexically_normal();
    if (absolute.filename().empty()) absolute = absolute.parent_path();  // "models/x/"
    const std::string dir_name = absolute.filename().string();  // not stem: "m.v2" stays whole
    if (!fs::is_directory(dir, ec)) {
      throw error(errc::model_not_found, dir_name,
                  detail::concat("model directory '", dir.string(), "' does not exist"));
    }
    model_spec s;
    s.directory = absolute;
    s.name = dir_name;
    const fs::path config_file = s.directory / "config.pbtxt";
    if (fs::exists(config_file, ec)) {
      try {
        s.config = read_triton_config(config_file);
      } catch (const error& e) {
        throw error(e.code(), s.name, e.message());
      }
      if (!s.config->name.empty()) s.name = s.config->name;
      for (const auto& [k, v] : s.config->parameters) {
        if (std::find(host_keys.begin(), host_keys.end(), k) != host_keys.end()) {
          s.host_parameters[k] = v;
          continue;
        }
        try {
          set_option(s.options, k, v, s.name);
        } catch (const error& e) {
          throw error(errc::invalid_option, s.name,
                      detail::concat("in '", config_file.string(), "' parameters: ",
                                     e.message()));
        }
      }
      s.file = s.config->default_model_filename;  // resolved below, if set
    }
    std::optional<std::int64_t> highest;
    for (const auto& entry : fs::directory_iterator(s.directory, ec)) {
      if (!entry.is_directory()) continue;
      const std::string n = entry.path().filename().string();
      std::int64_t v = 0;
      auto [end, err] = std::from_chars(n.data(), n.data() + n.size(), v);
      if (err != std::errc{} || end != n.data() + n.size() || v < 0) continue;
      if (!highest || v > *highest) highest = v;
    }
    if (version) {
      if (!fs::is_directory(s.directory / std::to_string(*version), ec)) {
        throw error(errc::model_not_found, s.name,
                    detail::concat("version ", *version, " not found in '",
                                   s.directory.string(), "'"));
      }
      s.version = version;
    } else if (highest) {
      s.version = highest;
    } else {
      throw error(errc::model_not_found, s.name,
                  detail::concat("no version directory (such as '1/') in '",
                                 s.directory.string(), "'"));
    }
    s.version_directory = s.directory / std::to_string(*s.version);
    if (!s.file.empty()) s.file = s.version_directory / s.file;
    return s;
  }

  //! A file or a directory, whichever `path` is.
  static model_spec from_path(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      throw error(errc::model_not_found, name_of(path),
                  detail::concat("model path '", path.string(), "' does not exist"));
    }
    return std::filesystem::is_directory(path, ec) ? from_directory(path) : from_file(path);
  }

  //! Sets one option (see torchloom::set_option for the errors).
  model_spec& set(std::string_view key, std::string_view value) {
    set_option(options, key, value, name);
    return *this;
  }
  //! Sets several options.
  model_spec& set(const std::map<std::string, std::string>& values) {
    for (const auto& [k, v] : values) set(k, v);
    return *this;
  }

  //! The model file to load: `file`, or `<version_directory>/<default_name>` when unset.
  std::filesystem::path model_file(std::string_view default_name) const {
    return file.empty() ? version_directory / std::string(default_name) : file;
  }

  //! The name a path gives a model: the file's stem or the directory's name ("m" for "m/").
  static std::string name_of(const std::filesystem::path& path) {
    std::filesystem::path p = path.lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    return p.stem().string();
  }
};

//! What a hook or a stream policy is told about the model being loaded. The references are
//! valid for the duration of the call that receives the context.
struct model_context {
  const std::string& name;
  const std::filesystem::path& directory;
  c10::Device device;
  const runner_options& options;
  const std::filesystem::path& version_directory;  //!< holds the model file
};

}  // namespace torchloom
