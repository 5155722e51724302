#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

// Loading a library runs its code. torchloom loads a hook library (MODEL_INIT_LIBRARY) or an
// op library (OP_LIBRARIES) only when:
//  - its real path (after symlinks) lies inside the model's directory, or inside a directory
//    the application allowed with allow_library_directory();
//  - neither the file nor any directory above it is writable by group or others (a sticky
//    directory such as /tmp is fine: others cannot replace what they do not own);
//  - the file and those directories belong to root or to this process's user.
// A model's configuration cannot widen this: only the application can.

namespace torchloom {

namespace detail {
struct library_trust_state {
  std::mutex mutex;
  std::vector<std::string> directories;  // real paths
};
inline library_trust_state& library_trust() {
  static library_trust_state state;
  return state;
}

// realpath(3), or an empty string with errno set.
inline std::string real_path(const std::string& path) {
  std::unique_ptr<char, decltype(&::free)> p(::realpath(path.c_str(), nullptr), &::free);
  return p ? std::string(p.get()) : std::string();
}

inline bool path_is_within(std::string_view path, std::string_view dir) {
  if (dir == "/") return true;
  return path.size() > dir.size() && path.substr(0, dir.size()) == dir &&
         path[dir.size()] == '/';
}

// Why `path` (a real path) may not be trusted, or an empty string.
inline std::string untrusted_because(const std::string& path, bool is_directory) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return concat("cannot stat '", path, "': ", std::strerror(errno));
  }
  const char* what = is_directory ? "directory '" : "'";
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
    return concat(what, path, "' belongs to uid ", st.st_uid,
                  ", neither root nor this process's user (uid ", ::geteuid(), ")");
  }
  const bool sticky = is_directory && (st.st_mode & S_ISVTX) != 0;
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !sticky) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return concat(what, path, "' is writable by ",
                  (st.st_mode & S_IWOTH) != 0 ? "others" : "its group", " (mode ", mode,
                  "), so someone else could replace the code torchloom would run");
  }
  return {};
}
}  // namespace detail

//! Lets hook and op libraries load from `dir` and below, as well as from model directories.
//! Process-wide: meant for the application's start-up (a model's own configuration cannot
//! do this). Throws invalid_option when `dir` does not exist or is not a directory.
inline void allow_library_directory(const std::filesystem::path& dir) {
  const std::string real = detail::real_path(dir.string());
  std::error_code ec;
  if (real.empty() || !std::filesystem::is_directory(real, ec)) {
    throw error(errc::invalid_option, "",
                detail::concat("allow_library_directory: '", dir.string(),
                               "' is not an existing directory"));
  }
  auto& trust = detail::library_trust();
  std::lock_guard lock(trust.mutex);
  for (const auto& d : trust.directories) {
    if (d == real) return;
  }
  trust.directories.push_back(real);
}

//! The directories allow_library_directory() added (real paths), in order.
inline std::vector<std::string> allowed_library_directories() {
  auto& trust = detail::library_trust();
  std::lock_guard lock(trust.mutex);
  return trust.directories;
}

namespace detail {

//! Resolves `library` (a value of option `key`; relative to `model_directory` unless
//! absolute) and checks that it may be loaded (see above). Returns its real path. Throws
//! torchloom::error with `code`, naming the model, the key, the path and the reason.
inline std::string trusted_library_path(const std::string& model, std::string_view key,
                                        const std::string& library,
                                        const std::filesystem::path& model_directory,
                                        errc code) {
  const std::filesystem::path given(library);
  const std::string path =
      given.is_absolute() ? given.string() : (model_directory / given).string();
  const auto refuse = [&](const std::string& why) {
    return error(code, model, concat(key, " '", library, "': ", why));
  };
  const std::string real = real_path(path);
  if (real.empty()) {
    const int err = errno;
    throw refuse(concat("cannot open '", path, "': ", std::strerror(err)));
  }
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw refuse(concat("'", real, "' is not a regular file"));
  }

  std::string within;
  const std::string model_dir = real_path(model_directory.string());
  if (!model_dir.empty() && path_is_within(real, model_dir)) within = model_dir;
  if (within.empty()) {
    for (const auto& dir : allowed_library_directories()) {
      if (path_is_within(real, dir)) within = dir;
    }
  }
  if (within.empty()) {
    throw refuse(concat("'", real, "' is outside the model directory '", model_dir,
                        "' and every directory the application allowed "
                        "(torchloom::allow_library_directory); refusing to load code from there"));
  }

  std::string why = untrusted_because(real, false);
  for (std::filesystem::path dir = std::filesystem::path(real).parent_path(); why.empty();
       dir = dir.parent_path()) {
    why = untrusted_because(dir.string(), true);
    if (dir == dir.root_path()) break;
  }
  if (!why.empty()) throw refuse(concat("refusing to load it: ", why));
  return real;
}

}  // namespace detail
}  // namespace torchloom
