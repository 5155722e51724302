#pragma once
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <torchloom/detail/strings.hpp>
#include <vector>

// What the dynamic linker will load besides a library: its DT_NEEDED entries, found the way
// glibc's ld.so finds them (an object already loaded under that name; the DT_RPATH of the
// library and of the objects that loaded it, unless the library has a DT_RUNPATH;
// LD_LIBRARY_PATH; the DT_RUNPATH; then the system's ld.so.cache and default directories).
// Read from the ELF file itself, so nothing of the library runs before it is trusted.

namespace torchloom::detail {

//! The dynamic section of an ELF shared object, as far as library search needs it.
struct elf_dynamic {
  std::vector<std::string> needed;   //!< DT_NEEDED, in order
  std::vector<std::string> rpath;    //!< DT_RPATH entries (':'-separated in the file)
  std::vector<std::string> runpath;  //!< DT_RUNPATH entries
  bool has_runpath = false;
};

namespace elf_detail {
using ehdr = ElfW(Ehdr);
using phdr = ElfW(Phdr);
using dyn = ElfW(Dyn);

inline bool read_at(std::ifstream& in, std::uint64_t offset, void* out, std::size_t n) {
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
  return static_cast<std::size_t>(in.gcount()) == n;
}

// The ELF class and machine of this process: the linker skips files of another kind.
inline std::optional<std::pair<unsigned char, std::uint16_t>> own_kind() {
  static const auto kind = []() -> std::optional<std::pair<unsigned char, std::uint16_t>> {
    std::ifstream in("/proc/self/exe", std::ios::binary);
    ehdr h{};
    if (!in || !read_at(in, 0, &h, sizeof h)) return std::nullopt;
    return std::make_pair(h.e_ident[EI_CLASS], static_cast<std::uint16_t>(h.e_machine));
  }();
  return kind;
}
}  // namespace elf_detail

//! Reads `path`'s dynamic section. Returns nothing when it is not an ELF object of this
//! process's class and machine (the dynamic linker would not load it either) or is malformed;
//! `why` then says what is wrong.
inline std::optional<elf_dynamic> read_elf_dynamic(const std::string& path, std::string& why) {
  using namespace elf_detail;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = "cannot be opened";
    return std::nullopt;
  }
  ehdr h{};
  if (!read_at(in, 0, &h, sizeof h) || std::memcmp(h.e_ident, ELFMAG, SELFMAG) != 0) {
    why = "is not an ELF file";
    return std::nullopt;
  }
  const auto kind = own_kind();
  if (!kind || h.e_ident[EI_CLASS] != kind->first || h.e_machine != kind->second) {
    why = "is an ELF file for another class or machine";
    return std::nullopt;
  }
  if (h.e_phentsize < sizeof(phdr) || h.e_phnum == 0 || h.e_phnum > 4096) {
    why = "has no usable program headers";
    return std::nullopt;
  }
  std::vector<phdr> headers(h.e_phnum);
  for (std::size_t i = 0; i < headers.size(); ++i) {
    if (!read_at(in, h.e_phoff + i * h.e_phentsize, &headers[i], sizeof(phdr))) {
      why = "has truncated program headers";
      return std::nullopt;
    }
  }
  elf_dynamic out;
  const phdr* dynamic = nullptr;
  for (const auto& p : headers) {
    if (p.p_type == PT_DYNAMIC) dynamic = &p;
  }
  if (dynamic == nullptr) return out;  // statically linked: needs nothing
  const std::size_t count = dynamic->p_filesz / sizeof(dyn);
  if (count > (1u << 16)) {
    why = "has an implausibly large dynamic section";
    return std::nullopt;
  }
  std::vector<dyn> entries(count);
  if (count > 0 && !read_at(in, dynamic->p_offset, entries.data(), count * sizeof(dyn))) {
    why = "has a truncated dynamic section";
    return std::nullopt;
  }
  std::uint64_t strtab = 0;
  std::uint64_t strsz = 0;
  std::vector<std::uint64_t> needed;
  std::vector<std::uint64_t> rpath;
  std::vector<std::uint64_t> runpath;
  for (const auto& d : entries) {
    if (d.d_tag == DT_NULL) break;
    switch (d.d_tag) {
      case DT_STRTAB:
        strtab = d.d_un.d_ptr;
        break;
      case DT_STRSZ:
        strsz = d.d_un.d_val;
        break;
      case DT_NEEDED:
        needed.push_back(d.d_un.d_val);
        break;
      case DT_RPATH:
        rpath.push_back(d.d_un.d_val);
        break;
      case DT_RUNPATH:
        runpath.push_back(d.d_un.d_val);
        break;
      default:
        break;
    }
  }
  if (needed.empty() && rpath.empty() && runpath.empty()) return out;
  // DT_STRTAB is an address: find the loaded segment that holds it.
  std::optional<std::uint64_t> strtab_offset;
  for (const auto& p : headers) {
    if (p.p_type == PT_LOAD && strtab >= p.p_vaddr && strtab - p.p_vaddr < p.p_filesz) {
      strtab_offset = strtab - p.p_vaddr + p.p_offset;
    }
  }
  if (!strtab_offset || strsz == 0 || strsz > (64u << 20)) {
    why = "has no usable string table for its dynamic section";
    return std::nullopt;
  }
  std::string strings(strsz, '\0');
  if (!read_at(in, *strtab_offset, strings.data(), strsz)) {
    why = "has a truncated dynamic string table";
    return std::nullopt;
  }
  const auto str = [&](std::uint64_t off) -> std::optional<std::string> {
    if (off >= strings.size()) return std::nullopt;
    const auto end = strings.find('\0', off);
    if (end == std::string::npos) return std::nullopt;
    return strings.substr(off, end - off);
  };
  for (const auto off : needed) {
    auto s = str(off);
    if (!s) {
      why = "has a DT_NEEDED entry outside its string table";
      return std::nullopt;
    }
    out.needed.push_back(std::move(*s));
  }
  const auto paths = [&](const std::vector<std::uint64_t>& offs, std::vector<std::string>& to) {
    for (const auto off : offs) {
      auto s = str(off);
      if (!s) return false;
      for (auto& dir : split(*s, ':')) {
        if (!dir.empty()) to.push_back(std::move(dir));
      }
    }
    return true;
  };
  if (!paths(rpath, out.rpath) || !paths(runpath, out.runpath)) {
    why = "has a DT_RPATH or DT_RUNPATH entry outside its string table";
    return std::nullopt;
  }
  out.has_runpath = !runpath.empty();
  return out;
}

//! One dependency the dynamic linker would load from a file, with the directories it would
//! search before it found it there (any of them could shadow it).
struct elf_dependency {
  std::string needed;                 //!< the DT_NEEDED name
  std::string needed_by;              //!< the object that needs it (a real path)
  std::string path;                   //!< where it would be found (real path)
  std::vector<std::string> searched;  //!< directories searched before and including its own
};

//! Walks `library`'s dependencies as the dynamic linker would load them and calls `check`
//! for each one that is neither already loaded in this process nor left to the system's
//! library configuration (ld.so.cache and the default directories, which only root
//! changes); such dependencies are walked in turn. `check` returns why a dependency is not
//! trusted (then the walk stops and that is returned) or an empty string. A search directory
//! with a $LIB or $PLATFORM token, which torchloom does not expand, is refused.
inline std::string check_elf_dependencies(
    const std::string& library, const std::function<std::string(const elf_dependency&)>& check) {
  struct pending {
    std::string path;
    std::vector<std::string> inherited_rpath;  // of the objects that loaded it
  };
  std::string why;
  std::vector<std::string> exe_rpath;
  if (const auto exe = read_elf_dynamic("/proc/self/exe", why); exe && !exe->has_runpath) {
    exe_rpath = exe->rpath;
  }
  // The dynamic linker reads LD_LIBRARY_PATH once, at start-up: the initial environment.
  std::vector<std::string> ld_library_path;
  {
    std::ifstream environ_file("/proc/self/environ", std::ios::binary);
    std::string var;
    while (std::getline(environ_file, var, '\0')) {
      if (var.rfind("LD_LIBRARY_PATH=", 0) != 0) continue;
      for (auto& d : split(std::string_view(var).substr(16), ':')) {
        if (!d.empty()) ld_library_path.push_back(std::move(d));
      }
    }
  }
  std::set<std::string> seen{library};
  std::vector<pending> queue{{library, {}}};
  while (!queue.empty()) {
    const pending object = std::move(queue.back());
    queue.pop_back();
    const auto info = read_elf_dynamic(object.path, why);
    if (!info) continue;  // not loadable: dlopen will say why
    const std::string origin = object.path.substr(0, object.path.rfind('/'));
    const auto expand = [&](const std::string& dir) -> std::optional<std::string> {
      std::string out;
      for (std::size_t i = 0; i < dir.size();) {
        if (dir.compare(i, 9, "${ORIGIN}") == 0) {
          out += origin;
          i += 9;
        } else if (dir.compare(i, 7, "$ORIGIN") == 0) {
          out += origin;
          i += 7;
        } else if (dir[i] == '$') {
          return std::nullopt;
        } else {
          out += dir[i++];
        }
      }
      return out;
    };
    std::vector<std::string> rpath_here;  // what this object's dependencies search first
    if (!info->has_runpath) {
      rpath_here = info->rpath;
      rpath_here.insert(rpath_here.end(), object.inherited_rpath.begin(),
                        object.inherited_rpath.end());
    }
    std::vector<std::string> dirs = rpath_here;
    if (!info->has_runpath) dirs.insert(dirs.end(), exe_rpath.begin(), exe_rpath.end());
    dirs.insert(dirs.end(), ld_library_path.begin(), ld_library_path.end());
    dirs.insert(dirs.end(), info->runpath.begin(), info->runpath.end());

    for (const auto& name : info->needed) {
      elf_dependency dep{name, object.path, {}, {}};
      std::string found;
      if (name.find('/') != std::string::npos) {
        found = name;  // a path: no search
      } else {
        if (void* h = ::dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD)) {
          ::dlclose(h);  // already in this process: nothing new runs
          continue;
        }
        for (const auto& raw : dirs) {
          const auto dir = expand(raw);
          if (!dir) {
            return concat("its dependency search path '", raw, "' (in '", object.path,
                          "') uses a dynamic string token other than $ORIGIN, which torchloom "
                          "does not check");
          }
          dep.searched.push_back(*dir);
          std::string ignored;
          const std::string candidate = concat(*dir, "/", name);
          if (read_elf_dynamic(candidate, ignored)) {
            found = candidate;
            break;
          }
        }
        if (found.empty()) continue;  // left to the system's configuration
      }
      std::unique_ptr<char, decltype(&::free)> real(::realpath(found.c_str(), nullptr), &::free);
      if (!real) continue;  // the dynamic linker will not find it either
      dep.path = real.get();
      if (auto refusal = check(dep); !refusal.empty()) return refusal;
      if (seen.insert(dep.path).second) queue.push_back({dep.path, rpath_here});
    }
  }
  return {};
}

}  // namespace torchloom::detail
