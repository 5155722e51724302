#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/libraries/library_trust.hpp>
#include <torchloom/libraries/op_library_probe.hpp>

#include <ATen/core/dispatch/Dispatcher.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

// OP_LIBRARIES: shared libraries that register custom operators with torch's dispatcher.
//
// A library registers its operators from static initialisers while dlopen runs, and torch
// reports a duplicate (a second TORCH_LIBRARY for a namespace, a second def() of an
// operator) by throwing from there, which ends the process. So torchloom loads each new
// library first in a short-lived child process (fork, then dlopen there): the child reports
// the operators the library registers, or torch's complaint, and exits. Only a library that
// registers nothing already registered is then loaded here. Loaded libraries stay for the
// process's lifetime (the dispatcher keeps pointers into them) and are loaded once, even
// when several models name them or ship byte-identical copies.

namespace torchloom::detail {

//! An op library this process loaded.
struct op_library_record {
  std::string path;              // real path
  std::string model;             // the model it was first loaded for
  std::vector<std::string> ops;  // "ns::name" or "ns::name.overload"
  std::uintmax_t size = 0;
  std::uint64_t hash = 0;
  void* handle = nullptr;
};

struct op_library_state {
  std::mutex mutex;  // held while a library is probed and loaded
  std::vector<op_library_record> loaded;
};

inline op_library_state& op_libraries() {
  // Never destroyed: the libraries, and the dispatcher's pointers into them, outlive it.
  static auto* state = new op_library_state;
  return *state;
}

// Byte-identical copies of a loaded library count as that library: compared by size and
// FNV-1a hash first, then byte for byte.
inline bool read_file_bytes(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}
inline std::uint64_t fnv1a(std::string_view bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

//! Loads the libraries a model names in OP_LIBRARIES (relative paths against its
//! directory), each once per process. Throws load_failed (missing, untrusted, or dlopen
//! failed) or op_library_conflict (it registers an operator or namespace that is already
//! registered), naming the model, the operator and both libraries.
inline void load_op_libraries(const std::string& model,
                              const std::filesystem::path& model_directory,
                              const std::vector<std::string>& libraries) {
  if (libraries.empty()) return;
  auto& state = op_libraries();
  std::lock_guard lock(state.mutex);
  for (const auto& library : libraries) {
    const std::string path = trusted_library_path(model, "OP_LIBRARIES", library,
                                                  model_directory, errc::load_failed);
    const auto fail = [&](errc code, const std::string& why) {
      return error(code, model, concat("OP_LIBRARIES: '", path, "': ", why));
    };
    if (std::any_of(state.loaded.begin(), state.loaded.end(),
                    [&](const op_library_record& r) { return r.path == path; })) {
      continue;
    }
    std::string bytes;
    if (!read_file_bytes(path, bytes)) throw fail(errc::load_failed, "cannot read it");
    const std::uint64_t hash = fnv1a(bytes);
    const bool same_as_loaded =
        std::any_of(state.loaded.begin(), state.loaded.end(), [&](const op_library_record& r) {
          std::string other;
          return r.size == bytes.size() && r.hash == hash && read_file_bytes(r.path, other) &&
                 other == bytes;
        });
    if (same_as_loaded) continue;  // a copy of a library already loaded

    const auto owner_of = [&](std::string_view op, std::string_view ns) -> std::string {
      for (const auto& r : state.loaded) {
        for (const auto& o : r.ops) {
          if ((!op.empty() && o == op) || (!ns.empty() && op_namespace(o) == ns)) {
            return concat("op library '", r.path, "' (loaded for model '", r.model, "')");
          }
        }
      }
      return "code already in this process that torchloom did not load (linked in, or "
             "loaded by other means)";
    };
    const auto ops_in = [&](std::string_view ns) {
      std::string list;
      for (const auto& op : registered_op_names()) {
        if (op_namespace(op) == ns) list.append(list.empty() ? "" : ", ").append(op);
      }
      return list;
    };

    const auto probe = probe_op_library(path, std::chrono::seconds(120));
    using outcome = op_library_probe::outcome;
    switch (probe.result) {
      case outcome::registered:
        break;
      case outcome::dlopen_failed:
        throw fail(errc::load_failed, concat("dlopen failed: ", probe.message));
      case outcome::crashed:
        throw fail(errc::load_failed, probe.message);
      case outcome::torch_refused: {
        if (const auto op = refused_operator(probe.message); !op.empty()) {
          throw fail(errc::op_library_conflict,
                     concat("it registers operator ", op, ", which ",
                            owner_of(op, op_namespace(op)), " already registers"));
        }
        if (const auto ns = refused_namespace(probe.message); !ns.empty()) {
          throw fail(errc::op_library_conflict,
                     concat("it registers namespace '", ns, "' (TORCH_LIBRARY), which ",
                            owner_of({}, ns), " already registers (operators: ", ops_in(ns),
                            ")"));
        }
        throw fail(errc::load_failed,
                   concat("torch refused its registrations: ", first_line(probe.message)));
      }
    }
    // torch only warns when a library adds a kernel to an operator it did not define, or
    // replaces one (TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("relu", ...) }): that changes
    // what every model in the process computes, so it is refused like a second definition.
    if (!probe.changed.empty()) {
      const auto& op = probe.changed.front();
      std::string all;
      for (const auto& o : probe.changed) all.append(all.empty() ? "" : ", ").append(o);
      throw fail(errc::op_library_conflict,
                 concat("it adds or replaces a kernel of operator ", op, ", which ",
                        owner_of(op, {}), " registers; an op library may register kernels "
                        "only for the operators it defines (operators it changes: ", all, ")"));
    }
    // torch allows a TORCH_LIBRARY_FRAGMENT to add to a namespace; two libraries sharing a
    // namespace is still a conflict here: neither owns it.
    const auto existing = registered_op_names();
    for (const auto& op : probe.ops) {
      const auto ns = op_namespace(op);
      const bool taken = std::any_of(existing.begin(), existing.end(), [&](const auto& o) {
        return op_namespace(o) == ns;
      });
      if (taken) {
        throw fail(errc::op_library_conflict,
                   concat("it registers operator ", op, " in namespace '", ns, "', which ",
                          owner_of({}, ns), " already registers (operators: ", ops_in(ns),
                          ")"));
      }
    }

    void* handle = nullptr;
    try {
      handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    } catch (const std::exception& e) {
      throw fail(errc::load_failed, concat("loading it failed: ", first_line(e.what())));
    }
    if (handle == nullptr) {
      const char* why = ::dlerror();
      throw fail(errc::load_failed, concat("dlopen failed: ", why ? why : "unknown error"));
    }
    state.loaded.push_back(op_library_record{path, model, probe.ops, bytes.size(), hash, handle});
  }
}

}  // namespace torchloom::detail
