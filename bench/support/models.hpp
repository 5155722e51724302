#pragma once
// What the benchmarks run: the bundled model and its inputs, the calls a user writes by hand
// (the raw side of every runner-against-raw pair), and where the fixture scripts put models.
#include "common.hpp"

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace torchloom_bench {

//! The bundled tiny MLP (float32 [batch, 64] in): its Triton-layout spec and TorchScript file.
inline torchloom::model_spec bundled_spec() {
  return torchloom::model_spec::from_directory(TORCHLOOM_BUNDLED_MODEL_DIR);
}
inline fs::path bundled_file() { return fs::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt"; }

//! Random inputs for the bundled model on `device` (never zeros: PERF.md), the same on both
//! sides of a pair.
inline at::Tensor bundled_input(c10::Device device, std::int64_t batch) {
  torch::manual_seed(42);
  return torch::rand({batch, 64}, torch::TensorOptions().device(device));
}

//! What a user writes by hand for a TorchScript file: load on the device, eval mode.
inline torch::jit::Module load_module(const fs::path& file, c10::Device device) {
  torch::jit::Module m = torch::jit::load(file.string(), device);
  m.eval();
  return m;
}

//! One hand-written TorchScript call, as the runner makes it: InferenceMode per call, inputs
//! copied (forward takes its vector by value).
inline c10::IValue raw_call(torch::jit::Module& m, const std::vector<c10::IValue>& inputs) {
  c10::InferenceMode inference;
  return m.forward(inputs);
}

#if TORCHLOOM_TORCH_VERSION >= 20600
using package_loader = torch::inductor::AOTIModelPackageLoader;

//! What a user writes by hand for an AOTInductor package: the loader on `device`.
inline std::unique_ptr<package_loader> load_package(const fs::path& file, c10::Device device,
                                                    const char* model) {
  return torchloom::detail::make_package_loader<package_loader>(model, file.string(), "model", 1,
                                                                device);
}

//! One hand-written AOTI call, as the runner makes it: InferenceMode per call, the caller's
//! current stream passed explicitly.
inline std::vector<at::Tensor> raw_call(package_loader& p, const std::vector<at::Tensor>& inputs,
                                        c10::Device device) {
  c10::InferenceMode inference;
  void* stream = nullptr;
#if TORCHLOOM_HAS_CUDA
  if (device.is_cuda()) stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;  // without CUDA headers: AOTI takes the current stream itself
#endif
  return p.run(inputs, stream);
}
#endif

//! "no model <file>; run <how>" when `file` is not there, else "".
inline std::string no_model(const fs::path& file, const std::string& how) {
  std::error_code ec;
  if (fs::is_regular_file(file, ec)) return {};
  return "no model " + file.string() + "; run " + how;
}

//! Where a fixture script's models are: under the directory environment variable `env` names,
//! else under `built` (where scripts/gpu.sh makes them, in the build tree).
struct fixtures {
  const char* env;
  const char* built;

  //! Model `name`'s Triton-layout directory.
  fs::path dir(const std::string& name) const {
    const char* set = std::getenv(env);
    return (set != nullptr && *set != 0 ? fs::path(set) : fs::path(built)) / name;
  }

  //! Why model `name` (its 1/`file`) is not there: no_model, naming `script` and `env`.
  std::string missing(const std::string& name, const char* file, const std::string& script) const {
    return no_model(dir(name) / "1" / file, script + " (or set " + env + ")");
  }
};

}  // namespace torchloom_bench
