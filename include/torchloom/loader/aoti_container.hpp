#pragma once
// What an AOTInductor package's model container declares (its inputs' names, its output
// count, its constants), read through the entry points every AOTInductor model library
// exports, which torch's runner keeps to itself. Needs LibTorch >= 2.6 (empty below).
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600
#include <torchloom/loader/aoti_package_weights.hpp>

#include <ATen/DynamicLibrary.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The model container's inputs (count and names), which torch's runner keeps to itself:
//! its container handle and model library are protected members. A pointer to member formed
//! in a derived class reaches them without copying the runner's layout; the two entry points
//! are part of every AOTInductor model library. nullopt where they cannot be read.
struct container_inputs : torch::inductor::AOTIModelContainerRunner {
  static std::optional<std::vector<std::string>> read(
      torch::inductor::AOTIModelContainerRunner* runner) {
    if (runner == nullptr) return std::nullopt;
    const auto handle = runner->*(&container_inputs::container_handle_);
    at::DynamicLibrary* library = (runner->*(&container_inputs::model_so_)).get();
    if (handle == nullptr || library == nullptr) return std::nullopt;
    try {
      const auto count_fn = reinterpret_cast<decltype(&AOTInductorModelContainerGetNumInputs)>(
          library->sym("AOTInductorModelContainerGetNumInputs"));
      const auto name_fn = reinterpret_cast<decltype(&AOTInductorModelContainerGetInputName)>(
          library->sym("AOTInductorModelContainerGetInputName"));
      std::size_t count = 0;
      if (count_fn(handle, &count) != 0) return std::nullopt;  // 0: AOTI_RUNTIME_SUCCESS
      std::vector<std::string> names(count);
      for (std::size_t i = 0; i < count; ++i) {
        const char* n = nullptr;
        if (name_fn(handle, i, &n) == 0 && n != nullptr) names[i] = n;
      }
      return names;
    } catch (const std::exception&) {
      return std::nullopt;  // a library without the symbol: fall back to the call spec
    }
  }
};

//! How many outputs the model container returns, through the same entry points; nullopt
//! where it cannot be read.
struct container_outputs : torch::inductor::AOTIModelContainerRunner {
  static std::optional<std::size_t> count(torch::inductor::AOTIModelContainerRunner* runner) {
    if (runner == nullptr) return std::nullopt;
    const auto handle = runner->*(&container_outputs::container_handle_);
    at::DynamicLibrary* library = (runner->*(&container_outputs::model_so_)).get();
    if (handle == nullptr || library == nullptr) return std::nullopt;
    try {
      const auto count_fn = reinterpret_cast<decltype(&AOTInductorModelContainerGetNumOutputs)>(
          library->sym("AOTInductorModelContainerGetNumOutputs"));
      std::size_t n = 0;
      if (count_fn(handle, &n) != 0) return std::nullopt;
      return n;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
};

//! The package's constants as its model library declares them (name, dtype, byte size),
//! through the same entry points; empty where they cannot be read.
struct container_constants : torch::inductor::AOTIModelContainerRunner {
  static std::vector<package_constant> read(torch::inductor::AOTIModelContainerRunner* runner) {
    std::vector<package_constant> out;
    if (runner == nullptr) return out;
    const auto handle = runner->*(&container_constants::container_handle_);
    at::DynamicLibrary* library = (runner->*(&container_constants::model_so_)).get();
    if (handle == nullptr || library == nullptr) return out;
    using count_fn = int32_t (*)(AOTInductorModelContainerHandle, std::size_t*);
    using name_fn = int32_t (*)(AOTInductorModelContainerHandle, std::size_t, const char**);
    using dtype_fn = int32_t (*)(AOTInductorModelContainerHandle, std::size_t, int32_t*);
    using size_fn = int32_t (*)(AOTInductorModelContainerHandle, std::size_t, std::size_t*);
    try {
      const auto count_of = reinterpret_cast<count_fn>(
          library->sym("AOTInductorModelContainerGetNumConstants"));
      const auto fqn_of = reinterpret_cast<name_fn>(
          library->sym("AOTInductorModelContainerGetConstantOriginalFQN"));
      const auto dtype_of = reinterpret_cast<dtype_fn>(
          library->sym("AOTInductorModelContainerGetConstantDtype"));
      size_fn size_of = nullptr;
      try {
        size_of = reinterpret_cast<size_fn>(
            library->sym("AOTInductorModelContainerGetConstantDataSize"));
      } catch (const std::exception&) {
        size_of = nullptr;  // older packages: no size check
      }
      std::size_t n = 0;
      if (count_of(handle, &n) != 0) return {};
      for (std::size_t i = 0; i < n; ++i) {
        package_constant c;
        const char* name = nullptr;
        if (fqn_of(handle, i, &name) != 0 || name == nullptr) return {};
        c.fqn = name;
        int32_t code = 0;
        if (dtype_of(handle, i, &code) == 0) c.dtype = static_cast<c10::ScalarType>(code);
        std::size_t bytes = 0;
        if (size_of != nullptr && size_of(handle, i, &bytes) == 0) c.bytes = bytes;
        out.push_back(std::move(c));
      }
    } catch (const std::exception&) {
      return {};
    }
    return out;
  }
};

}  // namespace torchloom::detail

#endif
