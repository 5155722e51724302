#pragma once
#include <torchloom/libraries/elf_dependencies.hpp>
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
//  - the file and those directories belong to root or to this process's user;
//  - every library it needs (DT_NEEDED, found as the dynamic linker would find it: RPATH,
//    LD_LIBRARY_PATH, RUNPATH with $ORIGIN expanded) that is not already loaded and not left
//    to the system's library configuration passes the same checks, where the system's
//    library directories (/lib, /lib64, /usr/lib, /usr/lib64, /usr/local/lib) count as
//    allowed; and every directory searched before the one it is found in is not writable by
//    group or others either (a library dropped there later would be loaded instead).
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

// Why the file `real` (a real path) or a directory above it may not be trusted, or "".
inline std::string untrusted_file(const std::string& real) {
  std::string why = untrusted_because(real, false);
  for (std::filesystem::path dir = std::filesystem::path(real).parent_path(); why.empty();
       dir = dir.parent_path()) {
    why = untrusted_because(dir.string(), true);
    if (dir == dir.root_path()) break;
  }
  return why;
}

// A directory the dynamic linker searches: it, or the nearest part of it that exists, and
// every directory above must not be writable by group or others.
inline std::string untrusted_search_directory(const std::string& dir) {
  std::filesystem::path p(dir);
  std::string real;
  while (real.empty() && !p.empty()) {
    real = real_path(p.string());
    if (real.empty()) p = p.has_relative_path() ? p.parent_path() : std::filesystem::path();
  }
  if (real.empty()) return {};
  std::string why = untrusted_because(real, true);
  for (std::filesystem::path d = std::filesystem::path(real); why.empty() && d != d.root_path();) {
    d = d.parent_path();
    why = untrusted_because(d.string(), true);
  }
  return why.empty() ? why : concat("the library search directory '", dir, "': ", why);
}

// The system's own library directories (real paths): only root changes what is in them.
inline bool is_system_library(const std::string& real) {
  for (const char* dir : {"/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64",
                          "/usr/local/lib"}) {
    const std::string d = real_path(dir);
    if (!d.empty() && path_is_within(real, d)) return true;
  }
  return false;
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

  if (const auto why = untrusted_file(real); !why.empty()) {
    throw refuse(concat("refusing to load it: ", why));
  }
  const auto why = check_elf_dependencies(real, [&](const elf_dependency& dep) -> std::string {
    const auto refusal = [&](const std::string& reason) {
      return concat("refusing to load it: it needs '", dep.needed, "' (needed by '",
                    dep.needed_by, "'), which the dynamic linker would load from '", dep.path,
                    "', but ", reason);
    };
    for (const auto& dir : dep.searched) {
      if (auto w = untrusted_search_directory(dir); !w.empty()) return refusal(w);
    }
    const bool allowed =
        is_system_library(dep.path) || (!model_dir.empty() && path_is_within(dep.path, model_dir));
    bool in_allowed = allowed;
    for (const auto& dir : allowed_library_directories()) {
      in_allowed = in_allowed || path_is_within(dep.path, dir);
    }
    if (!in_allowed) {
      return refusal(concat("that is outside the model directory '", model_dir,
                            "', the system's library directories and every directory the "
                            "application allowed (torchloom::allow_library_directory)"));
    }
    if (auto w = untrusted_file(dep.path); !w.empty()) return refusal(w);
    return {};
  });
  if (!why.empty()) throw refuse(why);
  return real;
}

}  // namespace detail
}  // namespace torchloom
