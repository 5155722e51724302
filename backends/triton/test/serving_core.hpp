#pragma once
// The one Triton core of torchloom_triton_serving_tests (Triton allows one per process): its
// backend directory holds torchloom's backend and, where built, Triton's own PyTorch backend
// (the peer) and the stock minimal backend; its repository starts empty and each test case
// writes the models it needs before it loads them (the core loads models on demand). Defined
// in test_side_by_side.cpp, used by test_serving_faults.cpp too.
#include "support/catch.hpp"
#include "support/linear_mlp.hpp"

#include <torch/script.h>

#include "in_process_requests.hpp"
#include "in_process_triton.hpp"
#include "side_by_side.hpp"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace torchloom_serving_test {

namespace tt = torchloom_triton;

//! The core and what it was started with.
struct serving_core {
  std::filesystem::path repository;
  tt::peer_backend peer;
  tt::server* server = nullptr;
};

//! The process's core, started on first use.
serving_core& core();

//! Whether this build's Triton core serves KIND_GPU instances (a TRITON_KIT_GPU=1 kit).
constexpr bool core_has_gpu = TORCHLOOM_TRITON_KIT_GPU != 0;

//! Loads (or reloads) `model` and requires it ready, with Triton's reason when it is not.
inline void require_load(const std::string& model) {
  const auto err = core().server->load(model);
  INFO("loading " << model << ": " << (err ? err->message : std::string("ok")));
  REQUIRE_FALSE(err.has_value());
  REQUIRE(core().server->ready(model));
}

//! The Triton data type of a torch dtype (the ones these tests send).
inline TRITONSERVER_DataType triton_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return TRITONSERVER_TYPE_FP32;
    case c10::kHalf:
      return TRITONSERVER_TYPE_FP16;
    case c10::kLong:
      return TRITONSERVER_TYPE_INT64;
    case c10::kInt:
      return TRITONSERVER_TYPE_INT32;
    case c10::kDouble:
      return TRITONSERVER_TYPE_FP64;
    case c10::kBool:
      return TRITONSERVER_TYPE_BOOL;
    default:
      return TRITONSERVER_TYPE_INVALID;
  }
}

//! An input over `t`'s data (a contiguous CPU tensor that outlives the request).
inline tt::tensor_in input(const std::string& name, const at::Tensor& t) {
  return {name, triton_dtype(t.scalar_type()), t.sizes().vec(), t.data_ptr(), t.nbytes()};
}

//! An output of a response as a tensor (a copy), or an undefined tensor for a type these tests
//! do not send back.
inline at::Tensor tensor_of(const tt::tensor_out& o) {
  std::optional<c10::ScalarType> t;
  switch (o.dtype) {
    case TRITONSERVER_TYPE_FP32:
      t = c10::kFloat;
      break;
    case TRITONSERVER_TYPE_FP16:
      t = c10::kHalf;
      break;
    case TRITONSERVER_TYPE_INT64:
      t = c10::kLong;
      break;
    case TRITONSERVER_TYPE_INT32:
      t = c10::kInt;
      break;
    case TRITONSERVER_TYPE_FP64:
      t = c10::kDouble;
      break;
    case TRITONSERVER_TYPE_BOOL:
      t = c10::kBool;
      break;
    default:
      return {};
  }
  return torch::from_blob(const_cast<char*>(o.data.data()), o.shape, *t).clone();
}

//! The named output of a response, or nullptr.
inline const tt::tensor_out* output_named(const tt::infer_result& r, const std::string& name) {
  for (const auto& o : r.outputs) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

//! A TorchScript model saved to `dir/model.pt`; returns the file.
inline std::filesystem::path save_model(torch::jit::Module& m, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "model.pt";
  m.save(file.string());
  return file;
}

//! A `parameters` entry of a config body.
inline std::string parameter(const std::string& key, const std::string& value) {
  return "parameters { key: \"" + key + "\" value { string_value: \"" + value + "\" } }\n";
}

//! The weights model's width: 4 x Linear(1024, 1024) with ReLU between, 16 MiB of float32
//! weights, written once per process.
constexpr std::int64_t weights_width = 1024;

inline std::filesystem::path weights_model() {
  static const std::filesystem::path file = [] {
    torch::manual_seed(21);
    torch::jit::Module m = torchloom_test::linear_mlp("serving_weights", weights_width);
    return save_model(m, core().repository.parent_path() / "files" / "weights");
  }();
  return file;
}

//! The weights model as torchloom model `name`, two instances on the CPU or GPU 0, with
//! `parameters`.
inline void write_weights(const std::string& name, bool gpu, const std::string& parameters) {
  tt::write_model(core().repository, name, "torchloom",
                  "max_batch_size: 8\n"
                  "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 1024 ] } ]\n"
                  "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 1024 ] } ]\n" +
                      std::string("instance_group [ { kind: ") +
                      (gpu ? "KIND_GPU gpus: [ 0 ]" : "KIND_CPU") + " count: 2 } ]\n" + parameters,
                  weights_model());
}

//! What the weights model answers for `x`, computed by torch on the CPU.
inline at::Tensor weights_reference(const at::Tensor& x) {
  static torch::jit::Module m = torch::jit::load(weights_model().string());
  c10::InferenceMode guard;
  return m.forward({x}).toTensor();
}

//! Sends `x` as the input "x" to `model` and checks its one output against `expected`.
inline void check_weights_answer(const std::string& model, const at::Tensor& x,
                                 const at::Tensor& expected) {
  const auto r = core().server->infer(model, {input("x", x)});
  INFO((r.error ? r.error->message : std::string()));
  REQUIRE_FALSE(r.error.has_value());
  REQUIRE(r.outputs.size() == 1);
  CHECK(torch::allclose(tensor_of(r.outputs[0]), expected, 1e-4, 1e-5));
}

}  // namespace torchloom_serving_test
