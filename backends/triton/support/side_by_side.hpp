#pragma once
// Serving torchloom's backend beside Triton's own PyTorch backend ("the peer",
// libtriton_pytorch.so) in one in-process Triton core: where the peer is, one backend directory
// that holds both (and Triton's stock minimal backend), and model directories written twice,
// once per backend, from one model file and one config body. Shared by
// backends/triton/test/test_side_by_side.cpp and bench/bm_triton.cpp.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace torchloom_triton {

//! Where Triton's PyTorch backend is, or why it is not there.
struct peer_backend {
  std::filesystem::path directory;  //!< holds libtriton_pytorch.so; empty when not found
  std::string why_missing;          //!< set when `directory` is empty

  explicit operator bool() const { return !directory.empty(); }
};

//! Triton's PyTorch backend as scripts/triton-peer.sh installs it: PREFIX/backends/pytorch/
//! libtriton_pytorch.so, with PREFIX the environment variable TORCHLOOM_TRITON_PEER when set
//! (the GPU script points it at the main-branch build), else `configured` (the CMake cache
//! variable TORCHLOOM_TRITON_PEER_PREFIX).
inline peer_backend find_peer(const std::filesystem::path& configured) {
  const char* env = std::getenv("TORCHLOOM_TRITON_PEER");
  const std::filesystem::path prefix = env != nullptr && *env != 0 ? env : configured;
  const std::filesystem::path dir = prefix / "backends" / "pytorch";
  std::error_code ec;
  if (!prefix.empty() && std::filesystem::is_regular_file(dir / "libtriton_pytorch.so", ec)) {
    return {dir, {}};
  }
  return {{},
          "Triton's PyTorch backend is not built: no " + (dir / "libtriton_pytorch.so").string() +
              " (run scripts/triton-peer.sh, or set TORCHLOOM_TRITON_PEER to its prefix)"};
}

//! A backend directory for one core: DIR/NAME links to a directory that holds
//! libtriton_NAME.so (Triton finds backend NAME there).
class backend_directory {
 public:
  explicit backend_directory(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::filesystem::create_directories(dir_);
  }

  //! Links DIR/name to `from`. Throws std::runtime_error when the link cannot be made.
  void add(const std::string& name, const std::filesystem::path& from) {
    // POSIX symlink, not std::filesystem: pip torch's libtorch.so exports copies of some of
    // libstdc++'s filesystem functions (see tests/support/temp_dir.hpp).
    const std::string link = (dir_ / name).string();
    if (::symlink(from.c_str(), link.c_str()) != 0) {
      throw std::runtime_error("cannot link " + link + " to " + from.string() + ": " +
                               std::strerror(errno));
    }
  }

  //! Whether backend `name` is there.
  bool has(const std::string& name) const {
    std::error_code ec;
    return std::filesystem::is_regular_file(dir_ / name / ("libtriton_" + name + ".so"), ec);
  }

  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

//! Writes model `name` for backend `backend` into `repository`: config.pbtxt is the `name`
//! and `backend` lines, then `body` (inputs, outputs, batching, instance groups, parameters);
//! `model_file` is copied into version 1 under its own file name (unless empty).
inline void write_model(const std::filesystem::path& repository, const std::string& name,
                        const std::string& backend, const std::string& body,
                        const std::filesystem::path& model_file) {
  const std::filesystem::path dir = repository / name;
  std::filesystem::create_directories(dir / "1");
  if (!model_file.empty()) {
    std::filesystem::copy_file(model_file, dir / "1" / model_file.filename(),
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::ofstream(dir / "config.pbtxt")
      << "name: \"" << name << "\"\nbackend: \"" << backend << "\"\n"
      << body;
}

//! The name of the copy of model `model` served by `backend`: "<model>_<backend>".
inline std::string twin_name(const std::string& model, const std::string& backend) {
  return model + "_" + backend;
}

}  // namespace torchloom_triton
