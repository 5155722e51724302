// torchloom's Triton backend side by side with Triton's own PyTorch backend (the peer,
// libtriton_pytorch.so built by scripts/triton-peer.sh): one in-process core, one repository
// in which every model is written twice from the same model file and the same config body
// (NAME_pytorch with `backend: "pytorch"`, NAME_torchloom with `backend: "torchloom"`), the
// same requests to both. Their answers must be bitwise equal: same output names, types,
// shapes and bytes. On the CPU (CI) the peer is release r26.02 on Debian's LibTorch; on the GPU
// machine it is upstream main on pip torch, with KIND_GPU instances and torch_aoti packages.
//
// Options of this binary besides Catch2's: --torchloom-require-peer and
// --torchloom-require-cuda exit with 77 (CTest: skipped) when the peer, or a CUDA device and a
// GPU-enabled Triton core, is missing.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#endif
#include "client_threads.hpp"
#include "serving_core.hpp"

#include <torchloom/detail/config.hpp>

#include "support/aoti_fixtures.hpp"
#include "support/temp_dir.hpp"

#include <torch/cuda.h>

#if TORCHLOOM_HAS_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace torchloom_serving_test {

namespace {

namespace fs = std::filesystem;

// Stopped at the end of main, before static destructors run.
std::unique_ptr<tt::server> the_server;

}  // namespace

serving_core& core() {
  static torchloom_test::temp_dir dir("torchloom-serving");
  static serving_core c = [] {
    serving_core s;
    s.repository = dir / "models";
    fs::create_directories(s.repository);
    tt::backend_directory backends(dir / "backends");
    backends.add("torchloom", fs::path(TORCHLOOM_TRITON_BACKEND_DIR) / "torchloom");
    s.peer = tt::find_peer(TORCHLOOM_TRITON_PEER_PREFIX);
    if (s.peer) backends.add("pytorch", s.peer.directory);
    the_server = std::make_unique<tt::server>(
        tt::server_options{{s.repository.string()},
                           backends.path().string(),
                           true,
                           {},
                           std::getenv("TORCHLOOM_TRITON_LOG") != nullptr});
    s.server = the_server.get();
    return s;
  }();
  return c;
}

namespace {

const std::vector<std::string> both = {"pytorch", "torchloom"};

// Skips the test case when the peer is not built.
#define TORCHLOOM_REQUIRE_PEER()                                     \
  do {                                                               \
    if (!core().peer) TORCHLOOM_CATCH_SKIP(core().peer.why_missing); \
  } while (false)

// Skips the test case without a CUDA device or without a GPU-enabled Triton core.
#define TORCHLOOM_REQUIRE_GPU_CORE()                                        \
  do {                                                                      \
    TORCHLOOM_REQUIRE_CUDA();                                               \
    if (!core_has_gpu) {                                                    \
      TORCHLOOM_CATCH_SKIP(                                                 \
          "the Triton kit is a CPU-only build: KIND_GPU needs a kit built " \
          "with TRITON_KIT_GPU=1");                                         \
    }                                                                       \
  } while (false)

// The instance group line of a config body.
std::string instances(bool gpu, int count = 1) {
  return std::string("instance_group [ { kind: ") + (gpu ? "KIND_GPU" : "KIND_CPU") +
         " count: " + std::to_string(count) + " } ]\n";
}

// Writes model `name` once per backend of `backends` (NAME_<backend>) from `file` and `body`,
// once per process, and loads them. `peer_extra` goes into the peer's config only (a platform
// line).
void twins_of(const std::string& name, const fs::path& file, const std::string& body,
              const std::vector<std::string>& backends, const std::string& peer_extra = {}) {
  static std::mutex mutex;
  static std::vector<std::string> written;
  std::lock_guard lock(mutex);
  for (const auto& b : backends) {
    const std::string model = tt::twin_name(name, b);
    if (std::find(written.begin(), written.end(), model) == written.end()) {
      tt::write_model(core().repository, model, b, (b == "pytorch" ? peer_extra : "") + body, file);
      written.push_back(model);
    }
    if (!core().server->ready(model)) require_load(model);
  }
}

// Writes model `name` twice (NAME_pytorch, NAME_torchloom) and loads both.
void twins(const std::string& name, const fs::path& file, const std::string& body,
           const std::string& peer_extra = {}) {
  twins_of(name, file, body, both, peer_extra);
}

// Why two responses differ (empty when they are bitwise equal): output count, then per output
// its name, type, shape and bytes. `a` and `b` name the two in the message.
std::string difference(const tt::infer_result& first, const tt::infer_result& second,
                       const std::string& a = "pytorch", const std::string& b = "torchloom") {
  if (first.error || second.error) {
    return "failed: " + a + ": " + (first.error ? first.error->message : std::string("ok")) + "; " +
           b + ": " + (second.error ? second.error->message : std::string("ok"));
  }
  if (first.outputs.size() != second.outputs.size()) {
    return a + " answered " + std::to_string(first.outputs.size()) + " outputs, " + b + " " +
           std::to_string(second.outputs.size());
  }
  for (const auto& p : first.outputs) {
    const tt::tensor_out* o = output_named(second, p.name);
    if (o == nullptr) return b + "'s answer has no output " + p.name;
    if (o->dtype != p.dtype) return "output " + p.name + ": data types differ";
    if (o->shape != p.shape) return "output " + p.name + ": shapes differ";
    if (o->data != p.data) return "output " + p.name + ": values differ";
  }
  return {};
}

// Sends `inputs` to both twins of `name`; requires bitwise equal answers and returns the
// peer's.
tt::infer_result same_answer(const std::string& name, const std::vector<tt::tensor_in>& inputs) {
  const auto peer = core().server->infer(tt::twin_name(name, "pytorch"), inputs);
  const auto ours = core().server->infer(tt::twin_name(name, "torchloom"), inputs);
  const std::string why = difference(peer, ours);
  INFO(name << ": " << why);
  REQUIRE(why.empty());
  return peer;
}

// The bundled MLP (64 -> 128 -> 16) as Triton's PyTorch backend is configured for it.
std::string mlp_body(bool gpu) {
  return "max_batch_size: 64\n"
         "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 64 ] } ]\n"
         "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n" +
         instances(gpu);
}

fs::path bundled_model() { return fs::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt"; }

// Two inputs of two types named as forward's arguments, a tuple of two outputs named by
// position; elementwise, so a row's answer is the same whatever rows it is batched with.
fs::path pair_model() {
  static const fs::path file = [] {
    torch::manual_seed(11);
    torch::jit::Module m("side_by_side_pair");
    m.register_parameter("w", torch::randn({8}), false);
    m.register_parameter("b", torch::randn({8}), false);
    m.define(R"(
def forward(self, x, ids):
    return x * self.w + self.b, ids * 3 + 1
)");
    return save_model(m, core().repository.parent_path() / "files" / "pair");
  }();
  return file;
}

std::string pair_body(bool gpu) {
  return "max_batch_size: 8\n"
         "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 8 ] },\n"
         "        { name: \"ids\" data_type: TYPE_INT64 dims: [ 4 ] } ]\n"
         "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 8 ] },\n"
         "         { name: \"OUTPUT__1\" data_type: TYPE_INT64 dims: [ 4 ] } ]\n"
         "dynamic_batching { max_queue_delay_microseconds: 2000 }\n" +
         instances(gpu);
}

// The peer's own self-test model "flags": y = x W^T + b and the autograd mode the backend ran
// it under, [float(y.is_inference()), float(torch.is_grad_enabled())].
fs::path flags_model() {
  static const fs::path file = [] {
    torch::jit::Module m("side_by_side_flags");
    m.register_parameter(
        "weight",
        torch::tensor({1.f, 0.f, 0.f, 0.f, 0.f, 1.f, 0.f, 0.f, 1.f, 1.f, 1.f, 1.f}).reshape({3, 4}),
        false);
    m.register_parameter("bias", torch::tensor({0.5f, -0.5f, 0.f}), false);
    m.define(R"(
def forward(self, x):
    y = torch.linear(x, self.weight, self.bias)
    flags = torch.tensor([float(y.is_inference()), float(torch.is_grad_enabled())], device=y.device)
    return y, flags
)");
    return save_model(m, core().repository.parent_path() / "files" / "flags");
  }();
  return file;
}

std::string flags_body(bool gpu, const std::string& parameters) {
  return "max_batch_size: 0\n"
         "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n"
         "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ -1, 3 ] },\n"
         "         { name: \"OUTPUT__1\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n" +
         instances(gpu) + parameters;
}

// What the bundled MLP answers for `x`, computed by torch directly.
at::Tensor mlp_reference(const at::Tensor& x) {
  static torch::jit::Module m = torch::jit::load(bundled_model().string());
  c10::InferenceMode guard;
  return m.forward({x}).toTensor();
}

void check_mlp(const std::string& name) {
  torch::manual_seed(3);
  for (const std::int64_t batch : {1, 1, 1, 5, 5, 64}) {
    const at::Tensor x = torch::randn({batch, 64});
    const auto r = same_answer(name, {input("x", x)});
    REQUIRE(r.outputs.size() == 1);
    CHECK(r.outputs[0].name == "y");
    CHECK(r.outputs[0].shape == std::vector<std::int64_t>{batch, 16});
    CHECK(torch::allclose(tensor_of(r.outputs[0]), mlp_reference(x), 1e-5, 1e-6));
  }
}

// 8 client threads, each sending `per_thread` requests of 1 or 2 rows to both twins of `name`
// (the peer first in even requests, torchloom first in odd ones); returns how many pairs of
// answers differed, with the first difference.
std::pair<int, std::string> hammer_pair(const std::string& name, int per_thread) {
  return torchloom_triton_test::from_clients(8, per_thread, [&](int t, int i) {
    const std::int64_t rows = 1 + (t + i) % 2;
    const at::Tensor x = torch::rand({rows, 8}) + 0.25;
    const at::Tensor ids = torch::randint(0, 1000, {rows, 4}, torch::kLong);
    const std::vector<tt::tensor_in> in = {input("x", x), input("ids", ids)};
    const std::string peer_model = tt::twin_name(name, "pytorch");
    const std::string our_model = tt::twin_name(name, "torchloom");
    tt::infer_result peer;
    tt::infer_result ours;
    if (i % 2 == 0) {
      peer = core().server->infer(peer_model, in);
      ours = core().server->infer(our_model, in);
    } else {
      ours = core().server->infer(our_model, in);
      peer = core().server->infer(peer_model, in);
    }
    std::string why = difference(peer, ours);
    if (why.empty()) {
      const auto* ids_out = output_named(ours, "OUTPUT__1");
      if (ids_out == nullptr || !torch::equal(tensor_of(*ids_out), ids * 3 + 1)) {
        why = "OUTPUT__1 is not ids * 3 + 1";
      }
    }
    return why;
  });
}

}  // namespace

TEST_CASE("the bundled MLP: torchloom answers bitwise as Triton's PyTorch backend does", "[peer]") {
  TORCHLOOM_REQUIRE_PEER();
  twins("mlp", bundled_model(), mlp_body(false));
  check_mlp("mlp");
  // T15's configuration (graph replays; eager on the CPU): the PyTorch backend ignores the key.
  twins("mlp_graphed", bundled_model(),
        mlp_body(false) + parameter("TORCHLOOM_STREAM", "graphed_caller"));
  check_mlp("mlp_graphed");
}

TEST_CASE(
    "tuple outputs and inputs named as forward's arguments, under dynamic batching "
    "from 8 client threads: every answer bitwise the PyTorch backend's",
    "[peer]") {
  TORCHLOOM_REQUIRE_PEER();
  twins("pair", pair_model(), pair_body(false));
  const std::uint64_t before_peer =
      core().server->counter(tt::twin_name("pair", "pytorch"), "inference_count");
  const std::uint64_t before_ours =
      core().server->counter(tt::twin_name("pair", "torchloom"), "inference_count");
  const auto [bad, first] = hammer_pair("pair", 60);
  INFO(first);
  CHECK(bad == 0);
  // Both twins served every request, and both batched them (fewer runs than requests).
  for (const auto& b : both) {
    const std::string model = tt::twin_name("pair", b);
    INFO(core().server->statistics(model));
    CHECK(core().server->counter(model, "inference_count") -
              (b == "pytorch" ? before_peer : before_ours) ==
          8 * 60 * 3 / 2);
    CHECK(core().server->counter(model, "execution_count") <
          core().server->counter(model, "inference_count"));
  }
}

TEST_CASE(
    "INFERENCE_MODE and DISABLE_OPTIMIZED_EXECUTION: both backends run the model under "
    "the same autograd mode",
    "[peer]") {
  TORCHLOOM_REQUIRE_PEER();
  twins("flags", flags_model(), flags_body(false, ""));
  twins("flags_no_inference", flags_model(),
        flags_body(false, parameter("INFERENCE_MODE", "false") +
                              parameter("DISABLE_OPTIMIZED_EXECUTION", "true")));
  const at::Tensor x = torch::arange(1.f, 9.f).reshape({2, 4});
  const auto on = same_answer("flags", {input("INPUT__0", x)});
  const auto off = same_answer("flags_no_inference", {input("INPUT__0", x)});
  REQUIRE(output_named(on, "OUTPUT__1") != nullptr);
  REQUIRE(output_named(off, "OUTPUT__1") != nullptr);
  // [is_inference, is_grad_enabled]: inference mode by default, no-grad alone when it is off.
  CHECK(torch::equal(tensor_of(*output_named(on, "OUTPUT__1")), torch::tensor({1.f, 0.f})));
  CHECK(torch::equal(tensor_of(*output_named(off, "OUTPUT__1")), torch::tensor({0.f, 0.f})));
  CHECK(torch::equal(tensor_of(*output_named(on, "OUTPUT__0")),
                     torch::tensor({1.5f, 1.5f, 10.f, 5.5f, 5.5f, 26.f}).reshape({2, 3})));
}

TEST_CASE("on the GPU: KIND_GPU instances of both backends answer bitwise alike", "[cuda][peer]") {
  TORCHLOOM_REQUIRE_GPU_CORE();
  TORCHLOOM_REQUIRE_PEER();
  twins("mlp_gpu", bundled_model(), mlp_body(true));
  check_mlp("mlp_gpu");
  // T15's configuration: torchloom replays CUDA graphs on its run stream (from the third
  // request of a shape on), the PyTorch backend runs eagerly; the bytes must not differ.
  twins("mlp_gpu_graphed", bundled_model(),
        mlp_body(true) + parameter("TORCHLOOM_STREAM", "graphed_caller"));
  check_mlp("mlp_gpu_graphed");
  check_mlp("mlp_gpu_graphed");
  twins("pair_gpu", pair_model(), pair_body(true));
  const at::Tensor x = torch::rand({2, 8});
  const at::Tensor ids = torch::randint(0, 1000, {2, 4}, torch::kLong);
  same_answer("pair_gpu", {input("x", x), input("ids", ids)});
  twins("flags_gpu", flags_model(), flags_body(true, ""));
  twins("flags_gpu_no_inference", flags_model(),
        flags_body(true, parameter("INFERENCE_MODE", "false")));
  const at::Tensor in = torch::arange(1.f, 9.f).reshape({2, 4});
  const auto on = same_answer("flags_gpu", {input("INPUT__0", in)});
  const auto off = same_answer("flags_gpu_no_inference", {input("INPUT__0", in)});
  CHECK(torch::equal(tensor_of(*output_named(on, "OUTPUT__1")), torch::tensor({1.f, 0.f})));
  CHECK(torch::equal(tensor_of(*output_named(off, "OUTPUT__1")), torch::tensor({0.f, 0.f})));
}

TEST_CASE(
    "on the GPU, every stream and residency policy that TORCHLOOM_STREAM and "
    "TORCHLOOM_RESIDENCY choose serves the model as torch computes it",
    "[cuda]") {
  TORCHLOOM_REQUIRE_GPU_CORE();
  torch::manual_seed(13);
  const at::Tensor x = torch::rand({2, weights_width});
  const at::Tensor expected = weights_reference(x);
  for (const std::string stream :
       {"caller", "pool", "adaptive", "green", "green_complement", "graphed_caller"}) {
    for (const std::string residency : {"resident", "shared", "streamed", "mapped"}) {
      if (stream == "graphed_caller" && residency == "streamed") continue;  // unavailable
      const std::string model = "policies_" + stream + "_" + residency;
      std::string parameters =
          parameter("TORCHLOOM_STREAM", stream) + parameter("TORCHLOOM_RESIDENCY", residency);
      if (stream.rfind("green", 0) == 0) parameters += parameter("GREEN_CONTEXT_SM_COUNT", "16");
      if (residency == "streamed") parameters += parameter("WEIGHT_OFFLOAD_BUDGET_MB", "12");
      write_weights(model, true, parameters);
      require_load(model);
      // Three requests of one shape: graphed_caller captures at the third and replays after.
      for (int i = 0; i < 4; ++i) {
        INFO(model << ", request " << i);
        check_weights_answer(model, x, expected);
      }
      core().server->unload(model);
    }
  }
}

#if TORCHLOOM_HAS_CUDA
namespace {

// What a request with its inputs in GPU memory got back: the outputs (copied to the host)
// and the memory each was in, or the error.
struct device_answer {
  tt::infer_result result;
  std::vector<TRITONSERVER_MemoryType> memory;
};

TRITONSERVER_Error* device_alloc(TRITONSERVER_ResponseAllocator*, const char*, std::size_t size,
                                 TRITONSERVER_MemoryType, std::int64_t, void*, void** buffer,
                                 void** buffer_userp, TRITONSERVER_MemoryType* type,
                                 std::int64_t* id) {
  *buffer = nullptr;
  *buffer_userp = nullptr;
  *type = TRITONSERVER_MEMORY_GPU;
  *id = 0;
  if (size > 0 && cudaMalloc(buffer, size) != cudaSuccess) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "cudaMalloc failed");
  }
  return nullptr;
}

TRITONSERVER_Error* device_release(TRITONSERVER_ResponseAllocator*, void* buffer, void*,
                                   std::size_t, TRITONSERVER_MemoryType, std::int64_t) {
  if (buffer != nullptr) cudaFree(buffer);
  return nullptr;
}

// Sends `model` one request with input `name` in GPU memory (`x`, a CUDA tensor) and asks
// for its outputs in GPU memory.
device_answer infer_on_device(const std::string& model, const std::string& name,
                              const at::Tensor& x) {
  TRITONSERVER_ResponseAllocator* allocator = nullptr;
  tt::check(TRITONSERVER_ResponseAllocatorNew(&allocator, device_alloc, device_release, nullptr),
            "ResponseAllocatorNew");
  std::unique_ptr<TRITONSERVER_ResponseAllocator,
                  TRITONSERVER_Error* (*)(TRITONSERVER_ResponseAllocator*)>
      allocator_guard(allocator, TRITONSERVER_ResponseAllocatorDelete);
  TRITONSERVER_InferenceRequest* req = nullptr;
  tt::check(TRITONSERVER_InferenceRequestNew(&req, core().server->get(), model.c_str(), -1),
            "RequestNew");
  const std::vector<std::int64_t> shape = x.sizes().vec();
  tt::check(TRITONSERVER_InferenceRequestAddInput(req, name.c_str(), TRITONSERVER_TYPE_FP32,
                                                  shape.data(), shape.size()),
            "AddInput");
  tt::check(TRITONSERVER_InferenceRequestAppendInputData(req, name.c_str(), x.data_ptr(),
                                                         x.nbytes(), TRITONSERVER_MEMORY_GPU, 0),
            "AppendInputData");
  std::promise<void> released;
  tt::check(TRITONSERVER_InferenceRequestSetReleaseCallback(
                req,
                [](TRITONSERVER_InferenceRequest* r, const std::uint32_t, void* p) {
                  TRITONSERVER_InferenceRequestDelete(r);
                  static_cast<std::promise<void>*>(p)->set_value();
                },
                &released),
            "SetReleaseCallback");
  std::promise<TRITONSERVER_InferenceResponse*> response;
  tt::check(TRITONSERVER_InferenceRequestSetResponseCallback(
                req, allocator, nullptr,
                [](TRITONSERVER_InferenceResponse* r, const std::uint32_t, void* p) {
                  if (r != nullptr) {
                    static_cast<std::promise<TRITONSERVER_InferenceResponse*>*>(p)->set_value(r);
                  }
                },
                &response),
            "SetResponseCallback");
  device_answer out;
  if (TRITONSERVER_Error* err = TRITONSERVER_ServerInferAsync(core().server->get(), req, nullptr)) {
    out.result.error =
        tt::triton_error{TRITONSERVER_ErrorCode(err), TRITONSERVER_ErrorMessage(err)};
    TRITONSERVER_ErrorDelete(err);
    TRITONSERVER_InferenceRequestDelete(req);
    return out;
  }
  TRITONSERVER_InferenceResponse* resp = response.get_future().get();
  released.get_future().wait();
  if (TRITONSERVER_Error* err = TRITONSERVER_InferenceResponseError(resp)) {
    out.result.error =
        tt::triton_error{TRITONSERVER_ErrorCode(err), TRITONSERVER_ErrorMessage(err)};
    TRITONSERVER_ErrorDelete(err);
  } else {
    std::uint32_t n = 0;
    tt::check(TRITONSERVER_InferenceResponseOutputCount(resp, &n), "OutputCount");
    for (std::uint32_t i = 0; i < n; ++i) {
      const char* output_name = nullptr;
      TRITONSERVER_DataType dtype;
      const std::int64_t* dims = nullptr;
      std::uint64_t rank = 0;
      const void* base = nullptr;
      std::size_t bytes = 0;
      TRITONSERVER_MemoryType memory;
      std::int64_t memory_id = 0;
      void* userp = nullptr;
      tt::check(TRITONSERVER_InferenceResponseOutput(resp, i, &output_name, &dtype, &dims, &rank,
                                                     &base, &bytes, &memory, &memory_id, &userp),
                "ResponseOutput");
      tt::tensor_out o{output_name, dtype, std::vector<std::int64_t>(dims, dims + rank), {}};
      o.data.resize(bytes);
      const cudaMemcpyKind kind =
          memory == TRITONSERVER_MEMORY_GPU ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
      if (bytes > 0) REQUIRE(cudaMemcpy(o.data.data(), base, bytes, kind) == cudaSuccess);
      out.result.outputs.push_back(std::move(o));
      out.memory.push_back(memory);
    }
  }
  TRITONSERVER_InferenceResponseDelete(resp);
  return out;
}

}  // namespace

TEST_CASE(
    "on the GPU, inputs and outputs in device memory: the answer is the one for host memory, "
    "and the PyTorch backend's",
    "[cuda]") {
  TORCHLOOM_REQUIRE_GPU_CORE();
  std::vector<std::string> backends = {"torchloom"};
  if (core().peer) backends.push_back("pytorch");
  twins_of("mlp_gpu_memory", bundled_model(), mlp_body(true), backends);
  twins_of("mlp_gpu_memory_graphed", bundled_model(),
           mlp_body(true) + parameter("TORCHLOOM_STREAM", "graphed_caller"), backends);
  torch::manual_seed(17);
  for (const std::int64_t batch : {1, 1, 1, 4}) {
    const at::Tensor x = torch::randn({batch, 64});
    const at::Tensor on_device = x.to(torch::kCUDA);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    for (const std::string name : {"mlp_gpu_memory", "mlp_gpu_memory_graphed"}) {
      const auto host = core().server->infer(tt::twin_name(name, "torchloom"), {input("x", x)});
      for (const auto& b : backends) {
        INFO(name << " (" << b << "), batch " << batch);
        const device_answer d = infer_on_device(tt::twin_name(name, b), "x", on_device);
        const std::string why =
            difference(host, d.result, "torchloom, host memory", b + ", device memory");
        INFO(why);
        CHECK(why.empty());
        for (const auto m : d.memory) CHECK(m == TRITONSERVER_MEMORY_GPU);
      }
    }
  }
}
#endif

TEST_CASE(
    "torch_aoti: both backends serve the package alike; the PyTorch backend ignores its "
    "parameters block, torchloom reads it",
    "[cuda][peer][aoti]") {
  TORCHLOOM_REQUIRE_GPU_CORE();
  TORCHLOOM_REQUIRE_PEER();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(package, "mlp_cuda");
  const fs::path file = package / "1" / "model.pt2";
  // The package's call spec names its input and output by position: ARGS[0] -> INPUT__0,
  // RESULT -> OUTPUT__0 (Triton's PyTorch backend's rule, also torchloom's).
  const std::string signature =
      "max_batch_size: 0\n"
      "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ -1, 64 ] } ]\n"
      "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]\n";
  // On GPU 0: with an instance on a second GPU, the PyTorch backend's fails every request it
  // gets ("Expected all tensors to be on the same device": the package's weights stay on
  // cuda:0), so on several GPUs the two compare there (torchloom's on every GPU: below).
  const std::string io =
      signature + "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n";
  const std::string aoti = "platform: \"torch_aoti\"\n";
  twins("aoti_mlp", file, io, aoti);
  twins("aoti_mlp_no_inference", file, io + parameter("INFERENCE_MODE", "false"), aoti);
  torch::manual_seed(5);
  for (const std::int64_t batch : {1, 5}) {
    const at::Tensor x = torch::randn({batch, 64});
    same_answer("aoti_mlp", {input("INPUT__0", x)});
    same_answer("aoti_mlp_no_inference", {input("INPUT__0", x)});
  }
  // A value INFERENCE_MODE cannot take: the PyTorch backend's PT2 path reads no parameters
  // (it looks for the block only when the config has none, and the core always hands it one),
  // so it loads and serves; torchloom reads the block and refuses the model, naming the key.
  const std::string bad = io + parameter("INFERENCE_MODE", "maybe");
  tt::write_model(core().repository, "aoti_bad_param_pytorch", "pytorch", aoti + bad, file);
  tt::write_model(core().repository, "aoti_bad_param_torchloom", "torchloom", bad, file);
  require_load("aoti_bad_param_pytorch");
  const at::Tensor x = torch::randn({1, 64});
  CHECK_FALSE(core().server->infer("aoti_bad_param_pytorch", {input("INPUT__0", x)}).error);
  const auto refused = core().server->load("aoti_bad_param_torchloom");
  REQUIRE(refused.has_value());
  const std::string reason = core().server->reason("aoti_bad_param_torchloom");
  INFO(reason);
  CHECK(reason.find("INFERENCE_MODE") != std::string::npos);
  CHECK(reason.find("maybe") != std::string::npos);
  // torchloom's instances on every GPU (Triton's default for KIND_GPU): each loads the
  // package onto its own device, and requests from several clients, which the core spreads
  // over the instances, get GPU 0's answer.
  if (torch::cuda::device_count() < 2) return;
  tt::write_model(core().repository, "aoti_every_gpu", "torchloom", signature + instances(true),
                  file);
  require_load("aoti_every_gpu");
  const auto want = core().server->infer(tt::twin_name("aoti_mlp", "torchloom"),
                                         {input("INPUT__0", x)});
  REQUIRE_FALSE(want.error);
  std::vector<std::future<std::string>> clients;
  for (int c = 0; c < 4; ++c) {
    clients.push_back(std::async(std::launch::async, [&] {
      for (int i = 0; i < 16; ++i) {
        const auto r = core().server->infer("aoti_every_gpu", {input("INPUT__0", x)});
        if (r.error || r.outputs.size() != 1) return "request " + std::to_string(i) + " failed";
        if (!torch::allclose(tensor_of(r.outputs[0]), tensor_of(want.outputs[0]), 1e-4, 1e-5)) {
          return "request " + std::to_string(i) + " differs";
        }
      }
      return std::string();
    }));
  }
  for (auto& c : clients) {
    const std::string why = c.get();
    INFO(why);
    CHECK(why.empty());
  }
  core().server->unload("aoti_every_gpu");
}

TEST_CASE(
    "torch_aoti: Triton's README model (dict and keyword inputs, a dict of tuples and dicts "
    "out) served by its forward-based and ordinal names, in any order, as the package computes "
    "it; a name the package lacks fails the load with the names it has",
    "[cuda][aoti]") {
  TORCHLOOM_REQUIRE_GPU_CORE();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(package, "dict_io_aoti");
  const fs::path file = package / "1" / "model.pt2";
  // The fixture's config.pbtxt as Triton's README writes it, less its name and backend lines
  // (write_model writes its own): outputs in another order than the call spec's.
  std::string body;
  {
    std::ifstream in(package / "config.pbtxt");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("name:", 0) == 0 || line.rfind("backend:", 0) == 0) continue;
      body += line + "\n";
    }
  }
  REQUIRE(body.find("RESULT[ZZZ]") != std::string::npos);
  // What the fixture script saved: the inputs (in0, in1, ...) and the eager outputs (out0,
  // out1, ...) in the call spec's order.
  const auto holder = torch::jit::load((package / "reference.pt").string());
  std::vector<at::Tensor> in;
  std::vector<at::Tensor> out;
  for (const auto& b : holder.named_buffers()) {
    if (b.name.rfind("in", 0) == 0) in.push_back(b.value.cpu().contiguous());
    if (b.name.rfind("out", 0) == 0) out.push_back(b.value.cpu());
  }
  const std::vector<std::string> inputs = {"ARGS[0]",       "ARGS[1]",        "ARGS[2][keyA]",
                                           "ARGS[2][key2]", "KWARGS[kwarg1]", "KWARGS[kw_arg2]"};
  const std::vector<std::string> outputs = {
      "RESULT[AAA]",       "RESULT[ZZZ]",       "RESULT[BBB][0]",  "RESULT[BBB][1]",
      "RESULT[CCC][keyA]", "RESULT[CCC][key2]", "RESULT[DDD][KA]", "RESULT[DDD][KB]"};
  REQUIRE(in.size() == inputs.size());
  REQUIRE(out.size() == outputs.size());
  // `names[i]` is the name the config gives output i of the call spec.
  const auto check = [&](const std::string& model, const std::vector<std::string>& in_names,
                         const std::vector<std::string>& names) {
    std::vector<tt::tensor_in> request;
    for (std::size_t i = 0; i < in.size(); ++i) request.push_back(input(in_names[i], in[i]));
    const auto r = core().server->infer(model, request);
    INFO(model << ": " << (r.error ? r.error->message : std::string()));
    REQUIRE_FALSE(r.error.has_value());
    for (std::size_t i = 0; i < names.size(); ++i) {
      INFO(names[i] << " is " << outputs[i]);
      const tt::tensor_out* o = output_named(r, names[i]);
      REQUIRE(o != nullptr);
      const at::Tensor got = tensor_of(*o);
      CHECK(got.sizes() == out[i].sizes());
      CHECK(torch::allclose(got.to(torch::kDouble), out[i].to(torch::kDouble), 1e-3, 1e-3));
    }
  };
  tt::write_model(core().repository, "readme_aoti_torchloom", "torchloom", body, file);
  require_load("readme_aoti_torchloom");
  check("readme_aoti_torchloom", inputs, outputs);
  if (core().peer) {  // Triton's PyTorch backend (main) names them alike: the same bytes
    tt::write_model(core().repository, "readme_aoti_pytorch", "pytorch", body, file);
    // Its own README's model: where it does not load it (seen with main of 2026-05), that is
    // reported, and there is nothing to compare.
    if (const auto err = core().server->load("readme_aoti_pytorch")) {
      WARN("Triton's PyTorch backend does not load its README's dict-in/dict-out model: "
           << err->message);
    } else {
      std::vector<tt::tensor_in> request;
      for (std::size_t i = 0; i < in.size(); ++i) request.push_back(input(inputs[i], in[i]));
      const std::string why = difference(core().server->infer("readme_aoti_pytorch", request),
                                         core().server->infer("readme_aoti_torchloom", request));
      INFO(why);
      CHECK(why.empty());
    }
  }
  // Ordinal names for the inputs; the outputs mixed, ordinal and forward-based, listed
  // backwards (Triton's __<index> rule alone would refuse RESULT[...] beside OUTPUT__<i>).
  const std::string fp16 = " data_type: TYPE_FP16 dims: [ 1, 16 ] }";
  std::string mixed = "platform: \"torch_aoti\"\nmax_batch_size: 0\ninput [\n";
  std::vector<std::string> ordinal_inputs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ordinal_inputs.push_back("INPUT__" + std::to_string(i));
    mixed += std::string(i ? "," : " ") + " { name: \"" + ordinal_inputs.back() + "\"" + fp16 +
             "\n";
  }
  std::vector<std::string> mixed_outputs;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    mixed_outputs.push_back(i % 2 ? "OUTPUT__" + std::to_string(i) : outputs[i]);
  }
  mixed += "]\noutput [\n";
  for (std::size_t k = outputs.size(); k-- > 0;) {
    mixed += std::string(k + 1 < outputs.size() ? "," : " ") + " { name: \"" +
             mixed_outputs[k] + "\"" + fp16 + "\n";
  }
  mixed += "]\n" + instances(true);
  tt::write_model(core().repository, "readme_aoti_mixed", "torchloom", mixed, file);
  require_load("readme_aoti_mixed");
  check("readme_aoti_mixed", ordinal_inputs, mixed_outputs);
  // A name the package does not have.
  std::string wrong = body;
  wrong.replace(wrong.find("RESULT[ZZZ]"), 11, "RESULT[YYY]");
  tt::write_model(core().repository, "readme_aoti_wrong", "torchloom", wrong, file);
  REQUIRE(core().server->load("readme_aoti_wrong").has_value());
  const std::string reason = core().server->reason("readme_aoti_wrong");
  INFO(reason);
  CHECK(reason.find("RESULT[YYY]") != std::string::npos);
  CHECK(reason.find("RESULT[ZZZ]") != std::string::npos);
}

}  // namespace torchloom_serving_test

int main(int argc, char** argv) {
  std::vector<char*> args;
  bool require_cuda = false;
  bool require_peer = false;
  bool listing = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--torchloom-require-cuda") == 0) {
      require_cuda = true;
      continue;
    }
    if (std::strcmp(argv[i], "--torchloom-require-peer") == 0) {
      require_peer = true;
      continue;
    }
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
    args.push_back(argv[i]);
  }
  if (require_cuda && !listing && !torch::cuda::is_available()) {
    std::puts("skipped: no CUDA device");
    return 77;
  }
  if (require_cuda && !listing && !torchloom_serving_test::core_has_gpu) {
    std::puts("skipped: the Triton kit is a CPU-only build (TRITON_KIT_GPU=1 builds a GPU one)");
    return 77;
  }
  if (require_peer && !listing) {
    const auto peer = torchloom_triton::find_peer(TORCHLOOM_TRITON_PEER_PREFIX);
    if (!peer) {
      std::printf("skipped: %s\n", peer.why_missing.c_str());
      return 77;
    }
  }
  const int rc = Catch::Session().run(static_cast<int>(args.size()), args.data());
  torchloom_serving_test::the_server.reset();
  if ((require_cuda || require_peer) && rc == 4) return 77;  // Catch2 3: every case skipped
  return rc;
}
