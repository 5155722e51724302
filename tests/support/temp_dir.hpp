#pragma once
// Scratch directories and files for the tests and the benchmarks (no Catch2 here: the
// benchmarks include it too).
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace torchloom_test {

namespace fs = std::filesystem;

//! A fresh directory, <temp>/<prefix>-XXXXXX, removed with everything in it when the object
//! goes. Throws std::runtime_error when it cannot be made.
class temp_dir {
 public:
  explicit temp_dir(const std::string& prefix = "torchloom-test") {
    std::string tmpl = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  // Not std::filesystem::remove_all: pip torch's libtorch.so exports its own copy of it
  // (from a statically linked libstdc++), the dynamic linker binds ours to that one, and it
  // crashes (torch 2.11, jumping to address 0). POSIX nftw has no such twin.
  ~temp_dir() {
    ::nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& p) const { return path_ / p; }

 private:
  fs::path path_;
};

//! Writes `text` to `path`, creating its directories.
inline void write_file(const fs::path& path, std::string_view text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

}  // namespace torchloom_test
