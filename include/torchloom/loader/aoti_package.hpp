#pragma once
// What aoti_loader (torchloom/loader/aoti.hpp) does around torch's package loader: the check
// of the file before torch reads it, the loader's construction for this LibTorch, installing
// user-managed constants, and the lock every package load takes. Needs LibTorch >= 2.6
// (empty below).
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/model_format.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <ios>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <type_traits>
#include <unordered_map>

namespace torchloom::detail {

//! Refuses what would reach torch's package reader as something other than a zip archive:
//! a missing path, a directory, an empty or foreign file. Throws model_not_found or
//! load_failed naming the path.
inline void check_package_file(const std::string& model, const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    throw error(errc::model_not_found, model,
                concat("AOTInductor package '", file.string(), "' does not exist"));
  }
  std::array<char, 4> magic{};
  std::ifstream in(file, std::ios::binary);
  in.read(magic.data(), static_cast<std::streamsize>(magic.size()));
  if (!in || magic != std::array<char, 4>{'P', 'K', '\x03', '\x04'}) {
    throw error(errc::load_failed, model,
                concat("'", file.string(),
                       "' is not an AOTInductor package (.pt2): it is not a zip archive"));
  }
  if (read_model_format(file) == model_format::torchscript) {
    throw error(errc::load_failed, model,
                concat("'", file.string(),
                       "' is a TorchScript archive, not an AOTInductor package: load it with "
                       "torchscript_loader (platform 'pytorch_libtorch')"));
  }
}

//! Constructs torch's package loader with the arguments this LibTorch takes: num_runners and
//! device_index came after 2.6. Without device_index the package's device key ("cuda") means
//! the current device, which the caller's device guard sets. A template so that the
//! branches this LibTorch cannot compile are never instantiated.
template <class PackageLoader>
std::unique_ptr<PackageLoader> make_package_loader(const std::string& model,
                                                   const std::string& file,
                                                   const std::string& model_name,
                                                   std::size_t num_runners, c10::Device device,
                                                   bool single_threaded = false) {
  const auto index = device.is_cuda() ? device.index() : c10::DeviceIndex{-1};
  // True with one runner, and for CUDA graph capture: torch's threaded container records an
  // event per run on its model instance and, to hand that instance to the next call, waits
  // on the host for it (so back-to-back calls each wait for the GPU to finish the one before,
  // and calls from several streams never overlap), and an event recorded in a capture cannot
  // be waited on afterwards. The single-threaded runner keeps no such state but takes no lock:
  // the caller takes one (aoti_model::single_run). False for several runners, which run at
  // once on instances of their own.
  using str = const std::string&;
  if constexpr (std::is_constructible_v<PackageLoader, str, str, bool, std::size_t,
                                        c10::DeviceIndex>) {
    return std::make_unique<PackageLoader>(file, model_name, single_threaded, num_runners, index);
  } else {
    if (num_runners != 1) {
      throw error(errc::unsupported, model,
                  concat("AOTI_NUM_RUNNERS=", num_runners,
                         " needs a LibTorch whose AOTIModelPackageLoader takes num_runners; "
                         "this one (",
                         TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
                         ") runs one call at a time: leave it at 1"));
    }
    if constexpr (std::is_constructible_v<PackageLoader, str, str, bool>) {
      return std::make_unique<PackageLoader>(file, model_name, single_threaded);
    } else {
      return std::make_unique<PackageLoader>(file, model_name);
    }
  }
}

//! Makes `views` (every constant, by name, user-managed: the package keeps only their
//! addresses) the package's active constants and frees the package's own copies. It goes
//! through torch's two constant buffers twice, so that the first buffer is the active one in
//! the end: torch's single-threaded runner (2.6 to 2.11) checks the first buffer's state on
//! every run whichever buffer is active, and once that buffer is freed (as swapping to the
//! second one and freeing the inactive one does) every run after the first fails with
//! "Unknown constant state: NONE".
template <class Package>
void install_user_constants(Package& package,
                            std::unordered_map<std::string, at::Tensor>& views) {
  auto* runner = package.get_runner();
  for (int pass = 0; pass < 2; ++pass) {
    package.load_constants(views, /*use_inactive=*/true, /*check_full_update=*/true,
                           /*user_managed=*/true);
    runner->swap_constant_buffer();
    runner->free_inactive_constant_buffer();
  }
}

//! One lock for every package load in the process: some LibTorch versions parse a package's
//! JSON files into a function-local static, which two loads at once would share.
inline std::mutex& package_load_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace torchloom::detail

#endif
