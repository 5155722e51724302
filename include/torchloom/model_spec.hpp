#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/libraries/library_trust.hpp>
#include <torchloom/options.hpp>
#include <torchloom/platform.hpp>
#include <torchloom/triton/config.hpp>
#include <torchloom/triton/config_json.hpp>

#include <c10/core/Device.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace torchloom {

namespace detail {

//! Checks that `path` is a directory; throws model_not_found when it does not exist and
//! invalid_option saying what it is otherwise (a file, a symlink loop, a name too long,
//! permission denied: the system's reason).
inline void require_directory(const std::string& model, const std::filesystem::path& path,
                              std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw error(errc::invalid_option, model,
                concat(what, " '", path.string(), "' cannot be read: ", ec.message()));
  }
  if (st.type() == fs::file_type::not_found) {
    throw error(errc::model_not_found, model,
                concat(what, " '", path.string(), "' does not exist"));
  }
  if (st.type() != fs::file_type::directory) {
    throw error(errc::invalid_option, model,
                concat(what, " '", path.string(), "' is not a directory"));
  }
}

//! Checks that the model file `path` can be read: model_not_found when it does not exist,
//! load_failed saying why otherwise (a directory, not a regular file, permission denied, a
//! name too long, a symlink loop: the system's reason).
inline void require_model_file(const std::string& model, const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw error(errc::load_failed, model,
                concat("model file '", path.string(), "' cannot be read: ", ec.message()));
  }
  if (st.type() == fs::file_type::not_found) {
    throw error(errc::model_not_found, model,
                concat("model file '", path.string(), "' does not exist"));
  }
  if (st.type() != fs::file_type::regular) {
    throw error(errc::load_failed, model,
                concat("model file '", path.string(), "' is not a regular file",
                       st.type() == fs::file_type::directory ? " (a directory)" : ""));
  }
  if (::access(path.c_str(), R_OK) != 0) {
    const int err = errno;
    throw error(errc::load_failed, model,
                concat("model file '", path.string(), "' cannot be read: ", std::strerror(err)));
  }
}

//! Checks that `path`, every symlink followed, lies inside `directory` (also resolved: the
//! directory itself may be reached through a symlink, such as a repository mounted
//! elsewhere; a symlink inside it to another file inside it is fine). Throws `code` naming the
//! model, `what`, the path and where it leads otherwise. A path that does not resolve (it does
//! not exist, a symlink loop, a directory that cannot be searched) passes: whoever opens it
//! next reports why.
inline void require_inside(const std::string& model, const std::filesystem::path& path,
                           const std::filesystem::path& directory, std::string_view what,
                           errc code) {
  const std::string real = real_path(path.string());
  if (real.empty()) return;
  const std::string real_directory = real_path(directory.string());
  if (real_directory.empty() || path_is_within(real, real_directory)) return;
  throw error(code, model,
              concat(what, " '", path.string(), "' resolves outside the model directory '",
                     directory.string(), "' (to '", real, "')"));
}

}  // namespace detail

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
  //! Which of Triton's PyTorch platforms the model is (see resolve_platform): it chooses the
  //! loader (loader_for), and a runner whose loader is for the other one refuses the spec.
  //! Empty when nothing decides (a spec built by hand, a file of unknown format).
  model_platform platform;
  //! config.pbtxt parameters whose keys the application reserved for itself (from_directory's
  //! `host_keys`, e.g. a serving backend's policy choice): kept as text, not options.
  std::map<std::string, std::string> host_parameters;

  //! A single model file; its directory is the file's directory. Its platform is what the
  //! file holds (a TorchScript archive, an AOTInductor package), else what a `.pt2` name says.
  //! Throws model_not_found when the file does not exist.
  static model_spec from_file(const std::filesystem::path& file) {
    detail::require_model_file(file.stem().string(), file);
    model_spec s;
    s.name = file.stem().string();
    s.file = std::filesystem::absolute(file);
    s.directory = s.file.parent_path();
    s.version_directory = s.directory;
    s.platform = detail::platform_of_file(s.file, "the file ");
    return s;
  }

  //! A Triton-layout model directory. Picks `version` if given (0 or more), else the highest
  //! numeric version subdirectory (written without leading zeros, as Triton names them).
  //! Reads config.pbtxt if present (see read_triton_config): its name, inputs, outputs,
  //! instance_group, model_warmup and its `parameters`, which become options, except those
  //! whose key is in `host_keys` (an application's own keys): they go to host_parameters.
  //! Resolves the platform as Triton's core does (see resolve_platform) and checks that the
  //! model file, where it exists, is what the platform calls for. Throws model_not_found
  //! (missing directory, no version, missing version), invalid_option (a bad config or
  //! parameter; a model file that contradicts the platform; a directory that cannot be read,
  //! with the system's reason), unsupported (a config for another backend; a key of Triton's
  //! Python runtime). `config_json`, when given, is the model configuration as JSON
  //! (protobuf's JSON form of Triton's ModelConfig, as Triton's core hands it to a backend): it
  //! is used instead of config.pbtxt, which is then not read, and checked the same way
  //! (parse_triton_config_json).
  static model_spec from_directory(const std::filesystem::path& dir,
                                   std::optional<std::int64_t> version = std::nullopt,
                                   const std::vector<std::string>& host_keys = {},
                                   std::optional<std::string_view> config_json = std::nullopt) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path absolute = fs::absolute(dir, ec).lexically_normal();
    if (absolute.filename().empty()) absolute = absolute.parent_path();  // "models/x/"
    const std::string dir_name = absolute.filename().string();  // not stem: "m.v2" stays whole
    detail::require_directory(dir_name, dir, "model directory");
    if (version && *version < 0) {
      throw error(errc::invalid_option, dir_name,
                  detail::concat("version ", *version, " is not a version (0 or more)"));
    }
    model_spec s;
    s.directory = absolute;
    s.name = dir_name;
    const fs::path config_file = s.directory / "config.pbtxt";
    // Where the configuration comes from, for messages.
    const std::string source = config_json ? "the model configuration" : config_file.string();
    // symlink_status: a config.pbtxt that is anything at all (a directory, a dangling link)
    // is read and refused for what it is, never taken for "no config".
    if (config_json || fs::symlink_status(config_file, ec).type() != fs::file_type::not_found) {
      // A regular file must lie inside; anything else is refused for what it is, unread.
      if (!config_json && fs::is_regular_file(config_file, ec)) {
        detail::require_inside(s.name, config_file, s.directory, "config file",
                               errc::invalid_option);
      }
      try {
        s.config = config_json ? parse_triton_config_json(*config_json, source)
                               : read_triton_config(config_file);
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
          throw error(e.code(), s.name,
                      detail::concat(detail::config_at(source, s.config->parameter_lines.at(k)),
                                     ": parameters: ", e.message()));
        }
      }
      s.file = s.config->default_model_filename;  // resolved below, if set
    }
    std::optional<std::int64_t> highest;
    std::vector<std::string> not_versions;  // numeric names Triton would not read as versions
    fs::directory_iterator it(s.directory, ec);
    if (ec) {
      throw error(errc::invalid_option, s.name,
                  detail::concat("cannot list model directory '", dir.string(),
                                 "': ", ec.message()));
    }
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) {
        throw error(errc::invalid_option, s.name,
                    detail::concat("cannot list model directory '", dir.string(),
                                   "': ", ec.message()));
      }
      std::error_code type_ec;
      if (!it->is_directory(type_ec)) continue;  // a symlink loop is not a version either
      const std::string n = it->path().filename().string();
      std::int64_t v = 0;
      auto [end, err] = std::from_chars(n.data(), n.data() + n.size(), v);
      if (err != std::errc{} || end != n.data() + n.size() || v < 0) continue;
      if (std::to_string(v) != n) {
        not_versions.push_back(n);
        continue;
      }
      if (!highest || v > *highest) highest = v;
    }
    if (version) {
      if (fs::symlink_status(s.directory / std::to_string(*version), ec).type() ==
          fs::file_type::not_found) {
        throw error(errc::model_not_found, s.name,
                    detail::concat("version ", *version, " not found in '",
                                   s.directory.string(), "'"));
      }
      detail::require_directory(s.name, s.directory / std::to_string(*version),
                                detail::concat("version ", *version, " directory"));
      s.version = version;
    } else if (highest) {
      s.version = highest;
    } else {
      std::string why;
      for (const auto& n : not_versions) {
        why += detail::concat(why.empty() ? " ('" : ", '", detail::printable(n, 64), "/'");
      }
      if (!why.empty()) {
        why += " is not a version directory: versions are written without leading zeros)";
      }
      throw error(errc::model_not_found, s.name,
                  detail::concat("no version directory (such as '1/') in '",
                                 s.directory.string(), "'", why));
    }
    s.version_directory = s.directory / std::to_string(*s.version);
    detail::require_inside(s.name, s.version_directory, s.directory,
                           detail::concat("version ", *s.version, " directory"),
                           errc::invalid_option);
    if (!s.file.empty()) s.file = s.version_directory / s.file;
    s.platform = resolve_platform(s.config ? &*s.config : nullptr, s.version_directory);
    // A model file outside the model directory is refused at load, unread.
    const fs::path model = s.model_file(s.platform.default_filename());
    const std::string real = detail::real_path(model.string());
    const std::string real_directory = detail::real_path(s.directory.string());
    if (real.empty() ||
        (!real_directory.empty() && detail::path_is_within(real, real_directory))) {
      check_platform_file(s.name, s.platform, s.version_directory, model, !s.file.empty(),
                          config_file);
    }
    return s;
  }

  //! In a Triton layout (from_directory), throws `code` when `path` resolves outside the model
  //! directory (see detail::require_inside); the runner checks the model file and warm-up
  //! data with it. A model file given on its own (from_file) is the caller's choice: no check.
  void require_inside(const std::filesystem::path& path, std::string_view what,
                      errc code) const {
    if (version) detail::require_inside(name, path, directory, what, code);
  }

  //! Whether config.pbtxt asks for KIND_MODEL: the model is loaded with the devices it was
  //! saved with (possibly several GPUs), not moved to one.
  bool model_placement() const {
    if (!config) return false;
    for (const auto& g : config->instance_groups) {
      if (g.kind == "KIND_MODEL") return true;
    }
    return false;
  }

  //! A file or a directory, whichever `path` is.
  static model_spec from_path(const std::filesystem::path& path) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) {
      throw error(errc::invalid_option, name_of(path),
                  detail::concat("model path '", path.string(), "' cannot be read: ",
                                 ec.message()));
    }
    if (st.type() == std::filesystem::file_type::not_found) {
      throw error(errc::model_not_found, name_of(path),
                  detail::concat("model path '", path.string(), "' does not exist"));
    }
    return st.type() == std::filesystem::file_type::directory ? from_directory(path)
                                                               : from_file(path);
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

}  // namespace torchloom
