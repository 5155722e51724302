// The torchloom Triton backend end to end: a model repository served by a real in-process
// Triton core (the Triton kit's libtritonserver.so) with libtriton_torchloom.so as the backend.
// One server for the whole binary (Triton allows one per process); models load on demand.
//
// Run with `--make-embed-model DIR OPLIB`, the binary writes the op-library model instead: the
// model calls tl_test::lookup, so defining it needs the op library loaded, which must not
// happen in the process that serves it (torchloom loads op libraries itself, once).
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#endif
#include "support/fixtures.hpp"
#include "support/plugins.hpp"

#include <torchloom/torchloom.hpp>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include "backend_errors.hpp"
#include "client_threads.hpp"
#include "in_process_requests.hpp"
#include "in_process_triton.hpp"
#include "io_binding.hpp"
#include "string_tensors.hpp"

#include <dlfcn.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using torchloom_test::contains;
using torchloom_test::install_plugin;
using torchloom_test::so;
using torchloom_test::temp_dir;
using torchloom_test::write_file;
using torchloom_test::write_table;
namespace tt = torchloom_triton;
namespace ttest = torchloom_triton_test;

// The embedding model of the hook tests (tests/support/plugins.hpp), written in a child
// process: defining it needs the op library loaded.
int make_embed_model(const char* dir, const char* op_library) {
  if (::dlopen(op_library, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", op_library, ::dlerror());
    return 1;
  }
  torch::jit::Module m = torchloom_test::make_embed_module();
  fs::create_directories(fs::path(dir) / "1");
  m.save((fs::path(dir) / "1" / "model.pt").string());
  return 0;
}

std::string self_path;

void run_self(const std::vector<std::string>& args) {
  std::vector<char*> argv{self_path.data()};
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, self_path.c_str(), nullptr, nullptr, argv.data(), environ) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

const char* mlp_io = R"(
max_batch_size: 64
input [ { name: "x" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]
)";

const char* embed_io = R"(
max_batch_size: 8
input [ { name: "keys" data_type: TYPE_INT64 dims: [ 6 ] } ]
output [ { name: "out" data_type: TYPE_FP32 dims: [ 6, 4 ] } ]
)";

// The model repository, written once: every model uses `backend: "torchloom"`.
// mixed_io: FP32 [3], INT64 [5] and FP16 [1] in; four outputs of 12, 40, 4 and 4 bytes a row.
const char* const mixed_io_source = R"(
def forward(self, a, b, c):
    return a * 2.0, b + 1, c.float() * 0.5, a.sum(1, keepdim=True) + b.sum(1, keepdim=True).float()
)";
const std::string mixed_io_config = R"(
input [ { name: "a" data_type: TYPE_FP32 dims: [ 3 ] },
        { name: "b" data_type: TYPE_INT64 dims: [ 5 ] },
        { name: "c" data_type: TYPE_FP16 dims: [ 1 ] } ]
output [ { name: "a2" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "b1" data_type: TYPE_INT64 dims: [ 5 ] },
         { name: "c32" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "s" data_type: TYPE_FP32 dims: [ 1 ] } ]
)";

struct repository {
  temp_dir dir;
  at::Tensor table0;
  at::Tensor table1;

  fs::path model(const std::string& name) const { return dir / name; }

  void add_mlp(const std::string& name, const std::string& extra) {
    const fs::path d = dir / name;
    fs::create_directories(d / "1");
    fs::copy_file(fs::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt", d / "1" / "model.pt");
    write_file(d / "config.pbtxt",
               "name: \"" + name + "\"\nbackend: \"torchloom\"\n" + mlp_io + extra);
  }

  void add_embed(const std::string& name, const std::string& extra, bool weights = true) {
    const fs::path d = dir / name;
    install_plugin("tl_test_ops", d);
    install_plugin("tl_test_hook", d);
    run_self({"--make-embed-model", d.string(), (d / so("tl_test_ops")).string()});
    write_file(d / "config.pbtxt",
               "name: \"" + name + "\"\nbackend: \"torchloom\"\n" + embed_io +
                   "parameters { key: \"OP_LIBRARIES\" value { string_value: \"" +
                   so("tl_test_ops") + "\" } }\n" +
                   "parameters { key: \"MODEL_INIT_LIBRARY\" value { string_value: \"" +
                   so("tl_test_hook") + "\" } }\n" + extra);
    if (weights) {
      write_table(d / "weights" / "table_0.bin", 0, table0);
      write_table(d / "weights" / "table_1.bin", 1, table1);
    }
  }

  // A model defined in TorchScript source, with its config.
  void add_script(const std::string& name, const std::string& source, const std::string& config,
                  const std::map<std::string, at::Tensor>& buffers = {}) {
    torch::jit::Module m(name);
    for (const auto& [k, v] : buffers) m.register_buffer(k, v);
    m.define(source);
    torchloom_test::write_triton_model(dir / name, m,
                                       "name: \"" + name + "\"\nbackend: \"torchloom\"\n" + config);
  }

  // The models of the defects found by reading the backend against Triton's own.
  void add_defect_models() {
    const std::string vec4 = R"(
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
)";
    // Inputs and outputs of three types and odd sizes: a lone request's bytes must land where
    // each belongs, whichever way the backend moves them.
    add_script("mixed_io", mixed_io_source, "max_batch_size: 8\n" + mixed_io_config);
    // An output torch cannot copy to the CPU (a meta tensor holds no data).
    add_script("meta_out", "def forward(self, x):\n    return x.to(\"meta\")\n",
               "max_batch_size: 8\n" + vec4);
    // Two requests, batched together: one whose input the collector cannot gather.
    add_mlp("pair", "dynamic_batching { preferred_batch_size: [ 2 ] "
                    "max_queue_delay_microseconds: 5000000 }\n"
                    "instance_group [ { kind: KIND_CPU count: 1 } ]\n");
    // Outputs named both ways, the index suffix of one contradicting its position.
    const std::string two_out = "def forward(self, x):\n    return x + 1.0, x + 2.0\n";
    add_script("mixed_out", two_out, R"(max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "probs__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
)");
    add_script("duplicate_out", two_out, R"(max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "a__0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "b__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
)");
    add_script("reversed_out", two_out, R"(max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
)");
    // forward(x, y) with inputs "y" (the second argument by its name) first in the config.
    add_script("clash_in", "def forward(self, x, y):\n    return x - y\n", R"(max_batch_size: 8
input [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "other" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]
)");
    // The client sends [2, 32]; the model takes the reshaped [64].
    add_mlp_config("reshaped", R"(max_batch_size: 64
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 32 ] reshape: { shape: [ 64 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]
)");
    // Ragged batching: the requests' elements in one flat tensor, with the accumulated element
    // counts as a batch input; the output scattered back in each request's shape.
    add_script("ragged", R"(
def forward(self, x, idx):
    assert int(idx[-1].item()) == x.size(0), "the element count does not match the input"
    return x * 2.0
)",
               R"(max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "idx"
                data_type: TYPE_FP32 source_input: "x" } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 5000000 }
)");
    // Sequence batching: a control input the core adds to every request.
    add_script("sequence_control",
               "def forward(self, x, start):\n    return x + start.float() * 100.0\n",
               R"(max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [ { name: "start"
                    control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}
)");
    // Implicit state: a running sum kept by the core between the requests of a sequence.
    add_script("sequence_state",
               "def forward(self, x, state):\n    s = state + x\n    return s, s\n",
               R"(max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  state [ { input_name: "STATE__1" output_name: "STATE_OUT__1" data_type: TYPE_FP32 dims: [ 4 ]
            initial_state: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true name: "zero" } } ]
}
)");
    // forward takes one Dict[str, Tensor]: the config's inputs are its keys.
    add_script("dict_in", R"(
def forward(self, inputs: Dict[str, Tensor]):
    return inputs["a"] + 2.0 * inputs["b"]
)",
               R"(max_batch_size: 8
input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "b" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
)");
    // Counts its own runs: model_warmup must run once per instance.
    add_script("warm_count", R"(
def forward(self, x):
    self.calls.add_(1.0)
    return x + 0.0, self.calls.expand(x.size(0), 1).clone()
)",
               R"(max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "calls" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
model_warmup [ { name: "zeros" batch_size: 1
                 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
parameters { key: "INFERENCE_MODE" value { string_value: "false" } }
)",
               {{"calls", torch::zeros({1})}});
    // Large input and output: gathering and returning them takes measurable work.
    add_script("big_io", "def forward(self, x):\n    return x * 2.0\n", R"(max_batch_size: 1
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
)");
  }

  // TYPE_STRING inputs and outputs: List[str] in and out.
  void add_string_models() {
    add_script("strings", R"(
def forward(self, words: List[str]) -> Tuple[List[str], Tensor]:
    return [w.upper() for w in words], torch.tensor([len(w) for w in words])
)",
               R"(max_batch_size: 0
input [ { name: "words" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "upper" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "lengths" data_type: TYPE_INT64 dims: [ -1 ] } ]
)");
    add_script("strings_batched", R"(
def forward(self, text: List[str], x):
    return [t + "!" for t in text], x * 2.0
)",
               R"(max_batch_size: 8
input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } },
        { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "loud" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } },
         { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }
)");
    add_script("strings_2d", "def forward(self, words: List[str]) -> List[str]:\n    return words\n",
               R"(max_batch_size: 0
input [ { name: "words" data_type: TYPE_STRING dims: [ 2, 3 ] } ]
output [ { name: "same" data_type: TYPE_STRING dims: [ -1 ] } ]
)");
    add_script("strings_to_tensor", "def forward(self, x):\n    return x\n",
               R"(max_batch_size: 0
input [ { name: "x" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
)");
  }

  // Models for a GPU core ([cuda] cases; never loaded on a CPU core).
  void add_gpu_models() {
    const std::string gpu0 = "instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]\n";
    const auto param = [](const std::string& k, const std::string& v) {
      return "parameters { key: \"" + k + "\" value { string_value: \"" + v + "\" } }\n";
    };
    add_mlp("gpu_mlp", gpu0 + "dynamic_batching { max_queue_delay_microseconds: 500 }\n");
    add_script("gpu_mixed_io", mixed_io_source, "max_batch_size: 8\n" + mixed_io_config + gpu0);
    // One instance, inputs of any length: requests from 8 clients queue in its slots, some
    // larger than a slot holds at first, some larger than it ever holds.
    const std::string one_gpu = "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n";
    const std::string any_length = R"(max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
)";
    add_script("gpu_wide", "def forward(self, x):\n    return x * 2.0 + 1.0\n",
               any_length + one_gpu);
    // An output made in host memory, which the next run may write.
    add_script("gpu_host_out",
               "def forward(self, x):\n    return (x * 2.0 + 1.0).cpu()\n", any_length + one_gpu);
    for (const std::string stream : {"caller", "pool", "adaptive", "green"}) {
      for (const std::string graphs : {"false", "true"}) {
        std::string extra = gpu0 + param("TORCHLOOM_STREAM", stream) +
                            param("TORCHLOOM_GRAPHS", graphs);
        if (stream == "green") extra += param("GREEN_CONTEXT_SM_COUNT", "16");
        add_mlp("gpu_" + stream + (graphs == "true" ? "_graphed" : ""), extra);
      }
    }
    for (const std::string residency : {"shared", "streamed", "mapped"}) {
      std::string extra = gpu0 + param("TORCHLOOM_RESIDENCY", residency);
      if (residency != "shared") extra += param("WEIGHT_OFFLOAD_BUDGET_MB", "1");
      add_mlp("gpu_" + residency, extra);
    }
    add_mlp("gpu_mapped_graphed", gpu0 + param("TORCHLOOM_RESIDENCY", "mapped") +
                                      param("TORCHLOOM_GRAPHS", "true"));
    add_mlp("gpu_streamed_graphed", gpu0 + param("TORCHLOOM_RESIDENCY", "streamed") +
                                        param("TORCHLOOM_GRAPHS", "true"));
    // Asks for as many GiB as its first input says: 1000 runs out of device memory.
    add_script("gpu_oom", R"(
def forward(self, x):
    scratch = torch.zeros([int(x[0, 0].item()) * 268435456], device=x.device)
    return x + scratch.sum()
)",
               "max_batch_size: 8\n" + std::string(R"(
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
)") + gpu0);
    // A 256 MiB output: what the caching allocator keeps of it shows whether the cache was
    // emptied after the response (outputs freed) or before.
    const std::string big = R"(
def forward(self, x):
    return x.repeat(1, 16777216)
)";
    const std::string big_io = R"(max_batch_size: 1
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 67108864 ] } ]
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
)";
    add_script("gpu_clean", big, big_io + param("ENABLE_CACHE_CLEANING", "true"));
    add_script("gpu_unload", big, big_io);
    // Twenty products of 2048 x 2048 matrices: 344 GFLOP of device work a request.
    add_script("gpu_busy", R"(
def forward(self, x):
    w = torch.eye(2048, device=x.device)
    y = x
    for _ in range(20):
        y = torch.mm(y, w)
    return y
)",
               R"(max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2048, 2048 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2048, 2048 ] } ]
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
)");
  }

  void add_mlp_config(const std::string& name, const std::string& io) {
    const fs::path d = dir / name;
    fs::create_directories(d / "1");
    fs::copy_file(fs::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt", d / "1" / "model.pt");
    write_file(d / "config.pbtxt", "name: \"" + name + "\"\nbackend: \"torchloom\"\n" + io);
  }

  repository() {
    torch::manual_seed(7);
    table0 = torch::randn({10, 4});
    table1 = torch::randn({10, 4});
    const std::string cpu2 = "instance_group [ { kind: KIND_CPU count: 2 } ]\n";
    const std::string batching = "dynamic_batching { max_queue_delay_microseconds: 2000 }\n";
    add_mlp("mlp", cpu2);
    add_mlp("mlp_batched", batching + "instance_group [ { kind: KIND_CPU count: 1 } ]\n");
    add_mlp("mlp_shared", cpu2 +
                              "parameters { key: \"ENABLE_WEIGHT_SHARING\" value { "
                              "string_value: \"true\" } }\n");
    add_mlp("mlp_model_kind",
            "instance_group [ { kind: KIND_MODEL } ]\n"
            "parameters { key: \"TORCHLOOM_DEVICE\" value { string_value: \"cpu\" } }\n"
            "parameters { key: \"TORCHLOOM_STREAM\" value { string_value: \"pool\" } }\n");
    // KIND_MODEL without TORCHLOOM_DEVICE: where the model was saved (the CPU, here).
    add_mlp("mlp_model_saved", "instance_group [ { kind: KIND_MODEL count: 2 } ]\n");
    add_mlp("bad_key", "parameters { key: \"INTRA_OP_THREADS\" value { string_value: \"2\" } }\n");
    add_mlp("bad_policy",
            "parameters { key: \"TORCHLOOM_STREAM\" value { string_value: \"fastest\" } }\n");
    add_embed("embed", batching);
    add_embed("embed_no_weights", "", false);
    // A model directory whose version holds no model file.
    fs::create_directories(dir / "missing_file" / "1");
    write_file(dir / "missing_file" / "config.pbtxt",
               std::string("name: \"missing_file\"\nbackend: \"torchloom\"\n") + mlp_io);
    // forward(x, y) with y declared optional: a request without y passes Triton's checks and
    // must fail torchloom's.
    torch::jit::Module add("add");
    add.define("def forward(self, x, y):\n    return x + y\n");
    add_defect_models();
    add_string_models();
    add_gpu_models();
    // A config on disk that torchloom refuses, and configurations given through the load
    // API instead (see "the model configuration Triton hands the backend").
    add_mlp("override",
            "parameters { key: \"TORCHLOOM_STREAM\" value { string_value: \"fastest\" } }\n");
    add_mlp("bad_param",
            "parameters { key: \"INFERENCE_MODE\" value { string_value: \"maybe\" } }\n");
    add_mlp_config("bad_type", R"(max_batch_size: 64
input [ { name: "x" data_type: TYPE_UINT32 dims: [ 64 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]
)");
    torchloom_test::write_triton_model(dir / "optional_in", add,
                                       R"(name: "optional_in"
backend: "torchloom"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "y" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]
output [ { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
)");
  }
};

repository& repo() {
  static repository r;
  return r;
}

// Stopped at the end of main, before static destructors run: unloading a model runs its
// hook's fini, which needs the op library's registry (a static of that library) intact.
std::unique_ptr<tt::server> the_server;

tt::server& core() {
  if (!the_server) {
    // The bundled repository (the build's models/, as the documented build leaves it) is
    // served as it is, beside the test repository.
    the_server = std::make_unique<tt::server>(
        tt::server_options{{repo().dir.path().string(),
                            fs::path(TORCHLOOM_BUNDLED_MODEL_DIR).parent_path().string()},
                           TORCHLOOM_TRITON_BACKEND_DIR,
                           true,
                           {},
                           std::getenv("TORCHLOOM_TRITON_LOG") != nullptr});
  }
  return *the_server;
}

// Loads `model` once; later calls find it loaded.
void require_loaded(const std::string& model) {
  if (core().ready(model)) return;
  const auto err = core().load(model);
  INFO((err ? err->message : std::string()));
  REQUIRE_FALSE(err.has_value());
  REQUIRE(core().ready(model));
}

tt::tensor_in float_input(const std::string& name, const at::Tensor& t) {
  return {name, TRITONSERVER_TYPE_FP32, t.sizes().vec(), t.data_ptr(), t.nbytes()};
}

std::string error_text(const tt::infer_result& r) { return r.error ? r.error->message : ""; }

at::Tensor output_tensor(const tt::infer_result& r, std::size_t i = 0) {
  REQUIRE(r.outputs.size() > i);
  const auto& o = r.outputs[i];
  REQUIRE(o.dtype == TRITONSERVER_TYPE_FP32);
  return torch::from_blob(const_cast<char*>(o.data.data()), o.shape, torch::kFloat).clone();
}

using direct_runner = torchloom::model_runner<torchloom::torchscript_loader>;

direct_runner& direct_mlp() {
  static direct_runner r(torchloom::model_spec::from_directory(repo().model("mlp")));
  return r;
}

// Inputs of batch 1 with their outputs from the runner called directly.
struct mlp_cases {
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> expected;
  explicit mlp_cases(int n) {
    for (int i = 0; i < n; ++i) {
      inputs.push_back(torch::randn({1, 64}));
      expected.push_back(direct_mlp().run({inputs.back()}).at(0));
    }
  }
};

// `threads` clients sending `per_thread` requests each to `model`; returns the number of
// responses that were wrong or failed, and the first failure.
std::pair<int, std::string> hammer(const std::string& model, const mlp_cases& cases,
                                   int threads, int per_thread, bool exact) {
  return ttest::from_clients(threads, per_thread, [&](int t, int i) {
    const std::size_t c = static_cast<std::size_t>(t * per_thread + i) % cases.inputs.size();
    const auto r = core().infer(model, {float_input("x", cases.inputs[c])});
    if (r.error) return r.error->message;
    if (r.outputs.size() != 1 || r.outputs[0].name != "y" ||
        r.outputs[0].shape != std::vector<std::int64_t>{1, 16}) {
      return std::string("unexpected outputs");
    }
    const at::Tensor got = torch::from_blob(const_cast<char*>(r.outputs[0].data.data()),
                                            {1, 16}, torch::kFloat);
    const bool same = exact ? torch::equal(got, cases.expected[c])
                            : torch::allclose(got, cases.expected[c], 1e-5, 1e-6);
    return same ? std::string() : std::string("output differs from the runner called directly");
  });
}

}  // namespace

TEST_CASE("the bundled model served by the torchloom backend answers like the runner",
          "[triton]") {
  require_loaded("mlp");
  const mlp_cases cases(4);
  for (std::size_t i = 0; i < cases.inputs.size(); ++i) {
    const auto r = core().infer("mlp", {float_input("x", cases.inputs[i])});
    INFO((r.error ? r.error->message : std::string()));
    REQUIRE_FALSE(r.error.has_value());
    REQUIRE(r.outputs.size() == 1);
    CHECK(r.outputs[0].name == "y");
    CHECK(torch::equal(output_tensor(r), cases.expected[i]));
  }
  // A request with a batch of 5 rows: the rows of the runner's batch-5 output.
  const at::Tensor x = torch::randn({5, 64});
  const auto r = core().infer("mlp", {float_input("x", x)});
  REQUIRE_FALSE(r.error.has_value());
  CHECK(r.outputs[0].shape == std::vector<std::int64_t>{5, 16});
  CHECK(torch::equal(output_tensor(r), direct_mlp().run({x}).at(0)));
}

TEST_CASE("the bundled repository is served as it is", "[triton]") {
  require_loaded("tiny_mlp");
  const at::Tensor x = torch::randn({3, 64});
  const auto r = core().infer("tiny_mlp", {float_input("x", x)});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  CHECK(r.outputs[0].name == "y");
  // KIND_AUTO: on a core with a GPU the instance is there, where GEMMs round differently from
  // the direct runner's on the CPU.
  CHECK(torch::allclose(output_tensor(r), direct_mlp().run({x}).at(0), 1e-4, 1e-5));
}

TEST_CASE("8 client threads x 500 requests each get the runner's answer", "[triton]") {
  require_loaded("mlp");
  const mlp_cases cases(32);
  const auto [bad, first] = hammer("mlp", cases, 8, 500, true);
  INFO(first);
  CHECK(bad == 0);
  CHECK(core().counter("mlp", "inference_count") >= 4000);
}

TEST_CASE("dynamic batching runs fewer executions than requests, every answer right",
          "[triton]") {
  require_loaded("mlp_batched");
  const mlp_cases cases(32);
  const auto [bad, first] = hammer("mlp_batched", cases, 8, 500, false);
  INFO(first);
  CHECK(bad == 0);
  const auto inferences = core().counter("mlp_batched", "inference_count");
  const auto executions = core().counter("mlp_batched", "execution_count");
  INFO(core().statistics("mlp_batched"));
  CHECK(inferences == 4000);
  CHECK(executions < inferences);
  CHECK(executions > 0);
}

TEST_CASE("instances that share weights, and KIND_MODEL on the named device, answer right",
          "[triton]") {
  for (const std::string model : {"mlp_shared", "mlp_model_kind", "mlp_model_saved"}) {
    INFO(model);
    require_loaded(model);
    const mlp_cases cases(4);
    const auto [bad, first] = hammer(model, cases, 4, 20, true);
    INFO(first);
    CHECK(bad == 0);
  }
}

TEST_CASE("a model with a dlopen hook and an op library is served", "[triton]") {
  require_loaded("embed");
  const at::Tensor keys = torch::tensor({{0, 3, 1, 7, 7, 9}}, torch::kLong);
  const auto r = core().infer(
      "embed", {{"keys", TRITONSERVER_TYPE_INT64, {1, 6}, keys.data_ptr(), keys.nbytes()}});
  INFO((r.error ? r.error->message : std::string()));
  REQUIRE_FALSE(r.error.has_value());
  const at::Tensor expected =
      torchloom_test::embed_reference(repo().table0, repo().table1, keys[0]).unsqueeze(0);
  CHECK(r.outputs[0].shape == std::vector<std::int64_t>{1, 6, 4});
  CHECK(torch::allclose(output_tensor(r), expected));
}

TEST_CASE("a failing run fails its batch with run_failed's message; the model stays loaded",
          "[triton]") {
  require_loaded("embed");
  // Key 42 is outside the 10-row tables: the lookup raises inside the model (it checks its
  // keys on the host first, so on a GPU instance too this is an exception, not a device-side
  // assert that would leave the process's CUDA context unusable).
  const at::Tensor bad_keys = torch::tensor({{0, 1, 2, 3, 4, 42}}, torch::kLong);
  const auto r = core().infer(
      "embed", {{"keys", TRITONSERVER_TYPE_INT64, {1, 6}, bad_keys.data_ptr(), bad_keys.nbytes()}});
  REQUIRE(r.error.has_value());
  INFO(r.error->message);
  CHECK(r.error->code == TRITONSERVER_ERROR_INTERNAL);
  CHECK(contains(r.error->message, "model 'embed'"));
  CHECK(contains(r.error->message, "[run_failed]"));
  CHECK(contains(r.error->message, "key 42 is outside the table"));
  CHECK(core().ready("embed"));
  const at::Tensor keys = torch::tensor({{1, 1, 1, 1, 1, 1}}, torch::kLong);
  const auto ok = core().infer(
      "embed", {{"keys", TRITONSERVER_TYPE_INT64, {1, 6}, keys.data_ptr(), keys.nbytes()}});
  CHECK_FALSE(ok.error.has_value());
}

TEST_CASE("a bad request fails alone with torchloom's message; the others succeed",
          "[triton]") {
  require_loaded("optional_in");
  const at::Tensor x = torch::randn({1, 4});
  const at::Tensor y = torch::randn({1, 4});
  std::atomic<int> good_failed{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        const auto r = core().infer("optional_in", {float_input("x", x), float_input("y", y)});
        if (r.error || r.outputs.empty() || !torch::equal(output_tensor(r), x + y)) ++good_failed;
      }
    });
  }
  const auto bad = core().infer("optional_in", {float_input("x", x)});
  for (auto& c : clients) c.join();
  REQUIRE(bad.error.has_value());
  INFO(bad.error->message);
  CHECK(bad.error->code == TRITONSERVER_ERROR_INVALID_ARG);
  CHECK(contains(bad.error->message, "model 'optional_in'"));
  CHECK(contains(bad.error->message, "expected 2 inputs (x, y), got 1"));
  CHECK(contains(bad.error->message, "[bad_input]"));
  CHECK(good_failed == 0);
  CHECK(core().ready("optional_in"));
}

TEST_CASE("a model that fails to load is unavailable with torchloom's message", "[triton]") {
  struct expectation {
    std::string model;
    std::vector<std::string> parts;
  };
  const std::vector<expectation> cases = {
      {"bad_key", {"model 'bad_key'", "INTRA_OP_THREADS", "INTRA_OP_THREAD_COUNT"}},
      {"bad_policy", {"model 'bad_policy'", "TORCHLOOM_STREAM", "fastest", "'pool'"}},
      {"missing_file", {"model 'missing_file'", "model.pt"}},
      {"embed_no_weights", {"model 'embed_no_weights'", "MODEL_INIT_LIBRARY", "weights"}},
  };
  for (const auto& c : cases) {
    INFO(c.model);
    const auto err = core().load(c.model);
    REQUIRE(err.has_value());
    CHECK_FALSE(core().ready(c.model));
    const std::string reason = core().reason(c.model);
    INFO(reason);
    CHECK(core().state(c.model) == "UNAVAILABLE");
    for (const auto& p : c.parts) {
      INFO("expected in Triton's model status: " << p);
      CHECK(contains(reason, p));
    }
  }
}

// --- Defects found by reading the backend against Triton's PyTorch backend -----------------

tt::tensor_in vec_input(const std::string& name, const at::Tensor& t) {
  return float_input(name, t);
}


TEST_CASE("an exception from torch after the run fails the request, never the server",
          "[triton][defect]") {
  require_loaded("meta_out");
  const at::Tensor x = torch::ones({1, 4});
  const auto r = core().infer("meta_out", {vec_input("x", x)});
  REQUIRE(r.error.has_value());
  INFO(r.error->message);
  CHECK(contains(r.error->message, "model 'meta_out'"));
  CHECK(contains(r.error->message, "meta"));
  CHECK(core().ready("meta_out"));
  // The instance survives: the next request gets the same clean error.
  CHECK(core().infer("meta_out", {vec_input("x", x)}).error.has_value());
}

// Sends lone requests of batch 1 and 3 to a mixed_io model, all outputs and two of them, with
// input `a` in one buffer and in two (the backend then gathers it with Triton's collector),
// and checks every output's name, type, shape and bytes. `in_device`: where the inputs are;
// `options`: where the outputs go.
void check_mixed_io(const std::string& model, c10::Device in_device,
                    const tt::request_options& options = {}) {
  require_loaded(model);
  for (const std::int64_t rows : {1, 3}) {
    const at::Tensor a = torch::randn({rows, 3});
    const at::Tensor b = torch::randint(-1000, 1000, {rows, 5}, torch::kInt64);
    const at::Tensor c = torch::randn({rows, 1}).to(torch::kHalf);
    const std::map<std::string, at::Tensor> expected = {
        {"a2", a * 2.0},
        {"b1", b + 1},
        {"c32", c.to(torch::kFloat) * 0.5},
        {"s", a.sum(1, true) + b.sum(1, true).to(torch::kFloat)}};
    const at::Tensor a_in = a.to(in_device);
    const at::Tensor b_in = b.to(in_device);
    const at::Tensor c_in = c.to(in_device);
#if TORCHLOOM_HAS_CUDA
    if (in_device.is_cuda()) torch::cuda::synchronize();
#endif
    const auto memory = in_device.is_cuda() ? TRITONSERVER_MEMORY_GPU : TRITONSERVER_MEMORY_CPU;
    const auto input = [&](const char* name, TRITONSERVER_DataType type, const at::Tensor& t) {
      tt::tensor_in in{name, type, t.sizes().vec(), t.data_ptr(), t.nbytes(), memory, 0};
      return in;
    };
    for (const std::size_t pieces : {std::size_t{1}, std::size_t{2}}) {
      for (const bool some : {false, true}) {
        INFO(model << ": rows " << rows << ", input a in " << pieces << " buffer(s), "
                   << (some ? "outputs b1 and s" : "every output"));
        tt::tensor_in in_a = input("a", TRITONSERVER_TYPE_FP32, a_in);
        in_a.pieces = pieces;
        tt::request_options o = options;
        if (some) o.outputs = {"b1", "s"};
        const auto r = core().infer(model,
                                    {in_a, input("b", TRITONSERVER_TYPE_INT64, b_in),
                                     input("c", TRITONSERVER_TYPE_FP16, c_in)},
                                    o);
        INFO(error_text(r));
        REQUIRE_FALSE(r.error.has_value());
        CHECK(r.outputs.size() == (some ? 2U : 4U));
        for (const auto& out : r.outputs) {
          INFO("output " << out.name);
          REQUIRE(expected.count(out.name) == 1);
          if (some) CHECK((out.name == "b1" || out.name == "s"));
          const at::Tensor& want = expected.at(out.name);
          CHECK(out.dtype == (want.scalar_type() == torch::kInt64 ? TRITONSERVER_TYPE_INT64
                                                                   : TRITONSERVER_TYPE_FP32));
          CHECK(out.shape == want.sizes().vec());
          REQUIRE(out.data.size() == want.nbytes());
          if (out.name == "s") {  // a sum: the GPU may add in another order
            const at::Tensor got = torch::from_blob(const_cast<char*>(out.data.data()),
                                                    want.sizes(), torch::kFloat);
            CHECK(torch::allclose(got, want, 1e-5, 1e-3));
          } else {
            CHECK(std::memcmp(out.data.data(), want.data_ptr(), want.nbytes()) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("a lone request with inputs and outputs of several types and sizes gets its own bytes",
          "[triton]") {
  check_mixed_io("mixed_io", c10::Device(c10::kCPU));
}

#if !TORCHLOOM_TRITON_GPU_CORE
// A CPU-only core hands the backend a buffer that claims to be in GPU memory; the input
// collector cannot copy it and fails that request alone. (On a GPU core the claim would be a
// real device copy; this case is for the CPU core.)
TEST_CASE("a request the input collector fails leaves the batch; the others are answered",
          "[triton][defect]") {
  require_loaded("pair");
  const at::Tensor good = torch::randn({1, 64});
  const at::Tensor bad = torch::randn({1, 64});
  const auto before_ok = core().duration("pair", "success", "count");
  const auto before_fail = core().duration("pair", "fail", "count");
  const auto before_exec = core().counter("pair", "execution_count");
  auto a = std::async(std::launch::async, [&] {
    return core().infer("pair", {float_input("x", good)});
  });
  auto b = std::async(std::launch::async, [&] {
    tt::tensor_in in = float_input("x", bad);
    in.memory_type = TRITONSERVER_MEMORY_GPU;
    return core().infer("pair", {in});
  });
  const auto ra = a.get();
  const auto rb = b.get();
  INFO("good: " << error_text(ra) << " / bad: " << error_text(rb));
  REQUIRE(rb.error.has_value());
  REQUIRE_FALSE(ra.error.has_value());
  REQUIRE(ra.outputs.size() == 1);
  CHECK(torch::equal(output_tensor(ra), direct_mlp().run({good}).at(0)));
  CHECK(core().duration("pair", "success", "count") == before_ok + 1);
  CHECK(core().duration("pair", "fail", "count") == before_fail + 1);
  INFO(core().statistics("pair"));
  CHECK(core().counter("pair", "execution_count") == before_exec + 1);
}
#endif

TEST_CASE("outputs named both ways must agree; a clash fails the load naming both",
          "[triton][defect]") {
  struct expectation {
    std::string model;
    std::vector<std::string> parts;
  };
  const std::vector<expectation> cases = {
      {"mixed_out", {"model 'mixed_out'", "probs__0", "logits"}},
      {"duplicate_out", {"model 'duplicate_out'", "a__0", "b__0"}},
      {"clash_in", {"model 'clash_in'", "'y'", "other"}},
  };
  for (const auto& c : cases) {
    INFO(c.model);
    const auto err = core().load(c.model);
    REQUIRE(err.has_value());
    const std::string reason = core().reason(c.model);
    INFO(reason);
    for (const auto& p : c.parts) {
      INFO("expected in Triton's model status: " << p);
      CHECK(contains(reason, p));
    }
  }
  // All by index, listed in another order: each gets its own output.
  require_loaded("reversed_out");
  const at::Tensor x = torch::randn({1, 4});
  const auto r = core().infer("reversed_out", {vec_input("x", x)});
  REQUIRE_FALSE(r.error.has_value());
  REQUIRE(r.outputs.size() == 2);
  for (const auto& o : r.outputs) {
    const at::Tensor got = torch::from_blob(const_cast<char*>(o.data.data()), o.shape,
                                            torch::kFloat).clone();
    CHECK(torch::equal(got, x + (o.name == "OUTPUT__0" ? 1.0 : 2.0)));
  }
}

TEST_CASE("an input with reshape gets the reshaped shape", "[triton][defect]") {
  require_loaded("reshaped");
  const at::Tensor x = torch::randn({3, 2, 32});
  const auto r = core().infer("reshaped", {float_input("x", x)});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  CHECK(r.outputs[0].shape == std::vector<std::int64_t>{3, 16});
  CHECK(torch::allclose(output_tensor(r), direct_mlp().run({x.reshape({3, 64})}).at(0)));
}

TEST_CASE("ragged batching with a batch input and a scattered batch output",
          "[triton][defect]") {
  require_loaded("ragged");
  const std::vector<std::int64_t> lengths = {3, 5, 2};
  std::vector<at::Tensor> xs;
  for (auto n : lengths) xs.push_back(torch::randn({1, n}));
  const auto before = core().counter("ragged", "execution_count");
  std::vector<std::future<tt::infer_result>> futures;
  for (const auto& x : xs) {
    futures.push_back(std::async(std::launch::async, [&srv = core(), x] {
      return srv.infer("ragged", {float_input("x", x)});
    }));
  }
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const auto r = futures[i].get();
    INFO("request " << i << ": " << error_text(r));
    REQUIRE_FALSE(r.error.has_value());
    CHECK(r.outputs[0].shape == xs[i].sizes().vec());
    CHECK(torch::equal(output_tensor(r), xs[i] * 2.0));
  }
  INFO(core().statistics("ragged"));
  CHECK(core().counter("ragged", "execution_count") == before + 1);  // one batch of three
}

TEST_CASE("sequence batching: control inputs and implicit state", "[triton][defect]") {
  require_loaded("sequence_control");
  const at::Tensor x = torch::randn({1, 4});
  const auto run = [&](std::uint32_t flags) {
    tt::request_options o;
    o.correlation_id = 7;
    o.flags = flags;
    const auto r = core().infer("sequence_control", {vec_input("x", x)}, o);
    INFO(error_text(r));
    REQUIRE_FALSE(r.error.has_value());
    return output_tensor(r);
  };
  CHECK(torch::equal(run(TRITONSERVER_REQUEST_FLAG_SEQUENCE_START), x + 100.0));
  CHECK(torch::equal(run(0), x));
  CHECK(torch::equal(run(TRITONSERVER_REQUEST_FLAG_SEQUENCE_END), x));

  require_loaded("sequence_state");
  at::Tensor sum = torch::zeros({1, 4});
  for (int step = 0; step < 3; ++step) {
    const at::Tensor v = torch::randn({1, 4});
    sum = sum + v;
    tt::request_options o;
    o.correlation_id = 11;
    if (step == 0) o.flags = TRITONSERVER_REQUEST_FLAG_SEQUENCE_START;
    if (step == 2) o.flags = TRITONSERVER_REQUEST_FLAG_SEQUENCE_END;
    const auto r = core().infer("sequence_state", {vec_input("INPUT__0", v)}, o);
    INFO("step " << step << ": " << error_text(r));
    REQUIRE_FALSE(r.error.has_value());
    REQUIRE(r.outputs.size() == 1);
    CHECK(r.outputs[0].name == "OUTPUT__0");
    CHECK(torch::allclose(output_tensor(r), sum));
  }
}

TEST_CASE("a model whose forward takes Dict[str, Tensor] gets the inputs by name",
          "[triton][defect]") {
  require_loaded("dict_in");
  const at::Tensor a = torch::randn({2, 4});
  const at::Tensor b = torch::randn({2, 4});
  const auto r = core().infer("dict_in", {vec_input("b", b), vec_input("a", a)});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  CHECK(torch::allclose(output_tensor(r), a + 2.0 * b));
}

TEST_CASE("model_warmup runs once per instance", "[triton][defect]") {
  core().unload("warm_count");
  require_loaded("warm_count");
  const auto r = core().infer("warm_count", {vec_input("x", torch::zeros({1, 4}))});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  REQUIRE(r.outputs.size() == 2);
  // One warm-up sample (Triton's), then this request.
  CHECK(output_tensor(r, 1).item<float>() == 2.0f);
}

TEST_CASE("statistics: a failed run is no execution; input and output time are counted",
          "[triton][defect]") {
  require_loaded("embed");
  const auto executions = core().counter("embed", "execution_count");
  const at::Tensor bad_keys = torch::tensor({{0, 1, 2, 3, 4, 42}}, torch::kLong);
  const auto r = core().infer(
      "embed", {{"keys", TRITONSERVER_TYPE_INT64, {1, 6}, bad_keys.data_ptr(), bad_keys.nbytes()}});
  REQUIRE(r.error.has_value());
  CHECK(core().counter("embed", "execution_count") == executions);

  // 64 MiB in, 64 MiB out: gathering the input (sent in two buffers, so the collector copies
  // it) and copying the output are work, which Triton must see as input and output time.
  // The bound is physical, not a timing target: 64 MiB cannot be copied in under 0.5 ms
  // (128 GB/s), while time taken on the wrong side of the copy is a few microseconds.
  require_loaded("big_io");
  const std::int64_t n = 16 << 20;
  const at::Tensor x = torch::rand({1, n});
  const auto in0 = core().duration("big_io", "compute_input", "ns");
  const auto out0 = core().duration("big_io", "compute_output", "ns");
  tt::tensor_in in = float_input("x", x);
  in.pieces = 2;
  const auto big = core().infer("big_io", {in});
  INFO(error_text(big));
  REQUIRE_FALSE(big.error.has_value());
  CHECK(torch::equal(output_tensor(big), x * 2.0));
  INFO(core().statistics("big_io"));
  CHECK(core().duration("big_io", "compute_input", "ns") - in0 >= 500000);
  CHECK(core().duration("big_io", "compute_output", "ns") - out0 >= 500000);
}

namespace tlb = torchloom::triton_backend;

// --- The model configuration Triton hands the backend ------------------------------------

// A config for the bundled MLP as the load API takes it (protobuf's JSON form).
std::string mlp_json(const std::string& name, const std::string& output,
                     const std::string& input_type, const std::string& parameters) {
  return R"({"name":")" + name + R"(","backend":"torchloom","max_batch_size":64,)" +
         R"("input":[{"name":"x","data_type":")" + input_type + R"(","dims":[64]}],)" +
         R"("output":[{"name":")" + output + R"(","data_type":"TYPE_FP32","dims":[16]}],)" +
         R"("instance_group":[{"kind":"KIND_CPU","count":1}],"parameters":{)" + parameters +
         "}}";
}

TEST_CASE("a configuration given through the load API is the one the backend serves",
          "[triton][config]") {
  // On disk: a stream policy that does not exist.
  REQUIRE(core().load("override").has_value());
  INFO(core().reason("override"));
  CHECK(contains(core().reason("override"), "fastest"));
  // Through the load API: a valid configuration whose output has another name.
  const auto err = core().load_with_config("override", mlp_json("override", "renamed",
                                                                "TYPE_FP32", ""));
  INFO((err ? err->message : std::string()));
  REQUIRE_FALSE(err.has_value());
  const at::Tensor x = torch::randn({2, 64});
  const auto r = core().infer("override", {float_input("x", x)});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  REQUIRE(r.outputs.size() == 1);
  CHECK(r.outputs[0].name == "renamed");
  CHECK(torch::equal(output_tensor(r), direct_mlp().run({x}).at(0)));
  core().unload("override");
}

TEST_CASE("an invalid configuration fails the same way from disk and through the load API",
          "[triton][config]") {
  struct expectation {
    std::string model;
    std::string json;
    std::string message;  // the library's own words, after the location
  };
  const std::vector<expectation> cases = {
      {"bad_param",
       mlp_json("bad_param", "y", "TYPE_FP32",
                R"("INFERENCE_MODE":{"string_value":"maybe"})"),
       "parameters: "},
      {"bad_type", mlp_json("bad_type", "y", "TYPE_UINT32", ""), "input 'x': data_type "},
  };
  for (const auto& c : cases) {
    INFO(c.model);
    REQUIRE(core().load(c.model).has_value());
    const std::string from_disk = core().reason(c.model);
    REQUIRE(core().load_with_config(c.model, c.json).has_value());
    const std::string from_api = core().reason(c.model);
    INFO("disk: " << from_disk << "\nload API: " << from_api);
    CHECK(from_disk == from_api);
    // The library's config parser on the file says the same after its file:line.
    const auto e = torchloom_test::capture_error(
        [&] { (void)torchloom::model_spec::from_directory(repo().model(c.model)); });
    const std::string library = e.message();
    const auto at = library.find(c.message);
    REQUIRE(at != std::string::npos);
    INFO("library: " << library);
    CHECK(contains(from_api, "the model configuration: " + library.substr(at)));
  }
}

// --- TYPE_STRING: List[str] in and out (Triton's wire format: 4-byte length + bytes) ------

tt::tensor_in string_input(const std::string& name, const std::string& wire,
                           std::vector<std::int64_t> shape) {
  return {name, TRITONSERVER_TYPE_BYTES, std::move(shape), wire.data(), wire.size()};
}

TEST_CASE("TYPE_STRING inputs and outputs are List[str], one-dimensional", "[triton][strings]") {
  require_loaded("strings");
  const std::vector<std::string> words = {"triton", "", "torch loom", std::string("nul\0in", 6)};
  const std::string wire = tt::serialize_strings(words);
  const auto r = core().infer("strings", {string_input("words", wire, {4})});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  REQUIRE(r.outputs.size() == 2);
  for (const auto& o : r.outputs) {
    if (o.name == "upper") {
      CHECK(o.dtype == TRITONSERVER_TYPE_BYTES);
      CHECK(o.shape == std::vector<std::int64_t>{4});
      CHECK(o.strings() == std::vector<std::string>{"TRITON", "", "TORCH LOOM",
                                                    std::string("NUL\0IN", 6)});
    } else {
      CHECK(o.name == "lengths");
      CHECK(std::vector<std::int64_t>(o.as<std::int64_t>(), o.as<std::int64_t>() + 4) ==
            std::vector<std::int64_t>{6, 0, 10, 6});
    }
  }
  // Only the output asked for.
  tt::request_options only;
  only.outputs = {"upper"};
  const auto one = core().infer("strings", {string_input("words", wire, {4})}, only);
  REQUIRE_FALSE(one.error.has_value());
  REQUIRE(one.outputs.size() == 1);
  CHECK(one.outputs[0].name == "upper");
}

TEST_CASE("strings in a dynamic batch: each request gets its own rows back", "[triton][strings]") {
  require_loaded("strings_batched");
  const std::vector<std::vector<std::string>> texts = {{"a"}, {"bb", "ccc"}, {"dddd"}};
  std::vector<std::string> wires;
  std::vector<at::Tensor> xs;
  for (const auto& t : texts) {
    wires.push_back(tt::serialize_strings(t));
    xs.push_back(torch::randn({static_cast<std::int64_t>(t.size()), 2}));
  }
  const auto before = core().counter("strings_batched", "execution_count");
  std::vector<std::future<tt::infer_result>> futures;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    futures.push_back(std::async(std::launch::async, [&, i] {
      const auto rows = static_cast<std::int64_t>(texts[i].size());
      return core().infer("strings_batched",
                          {string_input("text", wires[i], {rows, 1}), float_input("x", xs[i])});
    }));
  }
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto r = futures[i].get();
    INFO("request " << i << ": " << error_text(r));
    REQUIRE_FALSE(r.error.has_value());
    REQUIRE(r.outputs.size() == 2);
    for (const auto& o : r.outputs) {
      if (o.name == "y") {
        const at::Tensor y =
            torch::from_blob(const_cast<char*>(o.data.data()), o.shape, torch::kFloat).clone();
        CHECK(torch::equal(y, xs[i] * 2.0));
        continue;
      }
      CHECK(o.shape == std::vector<std::int64_t>{static_cast<std::int64_t>(texts[i].size()), 1});
      std::vector<std::string> expected;
      for (const auto& t : texts[i]) expected.push_back(t + "!");
      CHECK(o.strings() == expected);
    }
  }
  INFO(core().statistics("strings_batched"));
  CHECK(core().counter("strings_batched", "execution_count") == before + 1);  // 4 rows, one run
}

TEST_CASE("a TYPE_STRING input that is not one List[str] fails the load saying why",
          "[triton][strings]") {
  const auto err = core().load("strings_2d");
  REQUIRE(err.has_value());
  std::string reason = core().reason("strings_2d");
  INFO(reason);
  CHECK(contains(reason, "model 'strings_2d'"));
  CHECK(contains(reason, "'words'"));
  CHECK(contains(reason, "one-dimensional"));
  REQUIRE(core().load("strings_to_tensor").has_value());
  reason = core().reason("strings_to_tensor");
  INFO(reason);
  CHECK(contains(reason, "'x' is TYPE_STRING"));
  CHECK(contains(reason, "not List[str]"));
}

TEST_CASE("the string wire format: read exactly, written back the same", "[triton][logic]") {
  const std::vector<std::string> words = {"a", "", std::string(300, 'x')};
  const std::string wire = tt::serialize_strings(words);
  c10::List<std::string> list;
  tlb::read_strings("m", "s", wire.data(), wire.size(), 3, list);
  REQUIRE(list.size() == 3);
  CHECK(list.get(2) == words[2]);
  CHECK(tlb::write_strings("m", "s", list, 0, 3) == wire);
  CHECK(tlb::write_strings("m", "s", list, 1, 2) == tt::serialize_strings({""}));
  c10::List<std::string> more;
  CHECK_TORCHLOOM_ERROR(tlb::read_strings("m", "s", wire.data(), wire.size(), 4, more),
                        torchloom::errc::bad_input, "'s'", "3 strings, not 4");
  CHECK_TORCHLOOM_ERROR(tlb::read_strings("m", "s", wire.data(), wire.size(), 2, more),
                        torchloom::errc::bad_input, "left over");
  CHECK_TORCHLOOM_ERROR(tlb::read_strings("m", "s", wire.data(), wire.size() - 1, 3, more),
                        torchloom::errc::bad_input, "string 2", "300 bytes");
}

// --- On a GPU core ([cuda]: skipped without a GPU or with a CPU-only Triton core) ----------

#define REQUIRE_GPU_CORE()                                                      \
  do {                                                                          \
    TORCHLOOM_REQUIRE_CUDA();                                                   \
    if (!TORCHLOOM_TRITON_GPU_CORE) {                                           \
      TORCHLOOM_CATCH_SKIP("the Triton kit's core was built without GPU support"); \
    }                                                                           \
  } while (false)

#if TORCHLOOM_HAS_CUDA
// Response buffers in device memory (the client's allocator says where outputs go).
const tt::output_memory& device_outputs() {
  static const tt::output_memory memory{
      [](std::size_t bytes, TRITONSERVER_MemoryType* type, std::int64_t* id) {
        *type = TRITONSERVER_MEMORY_GPU;
        *id = 0;
        void* p = nullptr;
        if (cudaMalloc(&p, bytes) != cudaSuccess) throw std::bad_alloc();
        return p;
      },
      [](void* buffer, TRITONSERVER_MemoryType, std::int64_t) { cudaFree(buffer); },
      [](void* host, const void* buffer, std::size_t bytes, TRITONSERVER_MemoryType,
         std::int64_t) { cudaMemcpy(host, buffer, bytes, cudaMemcpyDeviceToHost); }};
  return memory;
}

std::int64_t reserved_bytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.reserved_bytes[0].current;  // all pools
}
#endif

// The MLP through one model, against the runner called directly on the CPU: 4 threads, each
// with batches of 1 and 3, enough runs for graphed<...> to capture and replay.
void check_gpu_model(const std::string& model, int threads = 4, int requests = 12) {
  INFO(model);
  const auto err = core().load(model);
  INFO((err ? err->message : std::string()));
  REQUIRE_FALSE(err.has_value());
  const auto [bad, first] = ttest::from_clients(threads, requests, [&](int t, int i) {
    const at::Tensor x = torch::randn({i % 2 == 0 ? 1 : 3 + (i + t) % 5, 64});
    const auto r = core().infer(model, {float_input("x", x)});
    if (r.error) return r.error->message;
    if (!torch::allclose(output_tensor(r), direct_mlp().run({x}).at(0), 1e-4, 1e-5)) {
      return std::string("output differs from the runner on the CPU");
    }
    return std::string();
  });
  INFO(first);
  CHECK(bad == 0);
  core().unload(model);
}

TEST_CASE("KIND_GPU instances: inputs and outputs in host or device memory", "[triton][cuda]") {
  REQUIRE_GPU_CORE();
#if TORCHLOOM_HAS_CUDA
  require_loaded("gpu_mlp");
  const at::Tensor x = torch::randn({3, 64});
  const at::Tensor expected = direct_mlp().run({x}).at(0);
  const at::Tensor x_gpu = x.to(torch::kCUDA);
  torch::cuda::synchronize();
  tt::tensor_in in_gpu = float_input("x", x_gpu);
  in_gpu.memory_type = TRITONSERVER_MEMORY_GPU;
  tt::request_options to_gpu;
  to_gpu.memory = &device_outputs();
  struct route {
    const char* what;
    tt::tensor_in in;
    tt::request_options options;
    TRITONSERVER_MemoryType out;
  };
  const std::vector<route> routes = {
      {"host in, host out", float_input("x", x), {}, TRITONSERVER_MEMORY_CPU},
      {"device in, host out", in_gpu, {}, TRITONSERVER_MEMORY_CPU},
      {"host in, device out", float_input("x", x), to_gpu, TRITONSERVER_MEMORY_GPU},
      {"device in, device out", in_gpu, to_gpu, TRITONSERVER_MEMORY_GPU},
  };
  for (const auto& rt : routes) {
    INFO(rt.what);
    for (int i = 0; i < 4; ++i) {
      const auto r = core().infer("gpu_mlp", {rt.in}, rt.options);
      INFO(error_text(r));
      REQUIRE_FALSE(r.error.has_value());
      CHECK(r.outputs[0].memory_type == rt.out);
      CHECK(torch::allclose(output_tensor(r), expected, 1e-4, 1e-5));
    }
  }
#endif
}

// A GPU instance answers a request from a thread of its own once the device is done, while
// it prepares the next: with 8 clients several requests are queued at once, each in its own
// slot, with inputs of several sizes.
TEST_CASE("KIND_GPU: requests queued on the device at once each get their own answer",
          "[triton][cuda]") {
  REQUIRE_GPU_CORE();
  for (const std::string model : {"gpu_caller", "gpu_caller_graphed", "gpu_pool_graphed"}) {
    check_gpu_model(model, 8, 40);
  }
}

// Requests of 16 floats to 2.5 M (10 MiB: more than a slot's staging ever holds, so the
// collector stages that input and the output goes to the response without staging), from 8
// clients to one instance; and a model whose output is in host memory.
TEST_CASE("KIND_GPU: slots grow while others are in flight; large and host outputs are right",
          "[triton][cuda]") {
  REQUIRE_GPU_CORE();
  for (const std::string model : {"gpu_wide", "gpu_host_out"}) {
    INFO(model);
    require_loaded(model);
    const std::array<std::int64_t, 5> sizes = {16, 4096, 20000, 300000, 2500000};
    const auto [bad, first] = ttest::from_clients(8, 15, [&](int t, int i) {
      const std::int64_t n = sizes[static_cast<std::size_t>(i + t) % sizes.size()];
      const at::Tensor x = torch::randn({n});
      const auto r = core().infer(model, {float_input("x", x)});
      if (r.error) return r.error->message;
      if (r.outputs.size() != 1 || r.outputs[0].shape != std::vector<std::int64_t>{n} ||
          !torch::equal(output_tensor(r), x * 2.0 + 1.0)) {
        return "a request of " + std::to_string(n) + " floats got another answer";
      }
      return std::string();
    });
    INFO(first);
    CHECK(bad == 0);
    core().unload(model);
  }
}

TEST_CASE("KIND_GPU: a lone request's inputs and outputs of several types, host or device memory",
          "[triton][cuda]") {
  REQUIRE_GPU_CORE();
#if TORCHLOOM_HAS_CUDA
  tt::request_options to_gpu;
  to_gpu.memory = &device_outputs();
  SECTION("host in, host out") { check_mixed_io("gpu_mixed_io", c10::Device(c10::kCPU)); }
  SECTION("device in, host out") { check_mixed_io("gpu_mixed_io", c10::Device(c10::kCUDA, 0)); }
  SECTION("host in, device out") {
    check_mixed_io("gpu_mixed_io", c10::Device(c10::kCPU), to_gpu);
  }
  SECTION("device in, device out") {
    check_mixed_io("gpu_mixed_io", c10::Device(c10::kCUDA, 0), to_gpu);
  }
#endif
}

TEST_CASE("every stream policy, graphed or not, and every residency, chosen by parameters",
          "[triton][cuda]") {
  REQUIRE_GPU_CORE();
  for (const std::string model :
       {"gpu_caller", "gpu_caller_graphed", "gpu_pool", "gpu_pool_graphed", "gpu_adaptive",
        "gpu_adaptive_graphed", "gpu_green", "gpu_green_graphed", "gpu_shared", "gpu_streamed",
        "gpu_mapped", "gpu_mapped_graphed"}) {
    check_gpu_model(model);
  }
  // Graphs replay fixed copies; streamed weights move at every run.
  REQUIRE(core().load("gpu_streamed_graphed").has_value());
  INFO(core().reason("gpu_streamed_graphed"));
  CHECK(contains(core().reason("gpu_streamed_graphed"), "TORCHLOOM_GRAPHS"));
}

TEST_CASE("KIND_MODEL without TORCHLOOM_DEVICE runs where the model was saved",
          "[triton][cuda]") {
  REQUIRE_GPU_CORE();
  // Saved on cuda:0; it says where its weights are.
  torch::jit::Module m("placed");
  m.register_parameter("w", torch::ones({4}).to(torch::kCUDA), false);
  m.define(R"(
def forward(self, x):
    return x * self.w, torch.full([x.size(0), 1], 1.0 if self.w.is_cuda else 0.0)
)");
  torchloom_test::write_triton_model(repo().model("gpu_placed"), m, R"(name: "gpu_placed"
backend: "torchloom"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "on_gpu" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_MODEL } ]
)");
  require_loaded("gpu_placed");
  const at::Tensor x = torch::randn({2, 4});
  const auto r = core().infer("gpu_placed", {float_input("x", x)});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  CHECK(torch::equal(output_tensor(r, 0), x));
  CHECK(torch::equal(output_tensor(r, 1), torch::ones({2, 1})));
}

// Two GPUs: the instance's device is cuda:0, where the model's first weight is; its output is
// made on cuda:1 at the end of a long run there. The answer must be what that run wrote, not
// what the output's memory held when the copy out was queued.
TEST_CASE("KIND_MODEL across two GPUs: an output on the second GPU is sent once it is written",
          "[triton][cuda][multi_gpu]") {
  REQUIRE_GPU_CORE();
#if TORCHLOOM_HAS_CUDA
  if (torch::cuda::device_count() < 2) TORCHLOOM_CATCH_SKIP("fewer than two CUDA devices");
  torch::jit::Module m("split");
  m.register_parameter("w0", torch::eye(256).to(torch::Device("cuda:0")), false);
  m.register_parameter("slow", torch::zeros({4096, 4096}).to(torch::Device("cuda:1")), false);
  m.define(R"(
def forward(self, x):
    h = torch.matmul(x, self.w0).to(self.slow.device)
    z = self.slow
    for _ in range(6):
        z = torch.matmul(z, self.slow)
    return h + z[0, 0]
)");
  torchloom_test::write_triton_model(repo().model("gpu_split"), m, R"(name: "gpu_split"
backend: "torchloom"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 256 ] } ]
instance_group [ { kind: KIND_MODEL } ]
)");
  require_loaded("gpu_split");
  for (int i = 0; i < 8; ++i) {
    const at::Tensor x = torch::randn({2, 256});
    const auto r = core().infer("gpu_split", {float_input("x", x)});
    INFO("request " << i << ": " << error_text(r));
    REQUIRE_FALSE(r.error.has_value());
    CHECK(torch::allclose(output_tensor(r), x, 1e-3, 1e-3));
  }
  core().unload("gpu_split");
#endif
}

TEST_CASE("an instance group changed in place: new instances use their own kind",
          "[triton][cuda]") {
  REQUIRE_GPU_CORE();
  const auto config = [](const std::string& group) {
    return "name: \"gpu_regroup\"\nbackend: \"torchloom\"\n" + std::string(mlp_io) + group;
  };
  const fs::path dir = repo().model("gpu_regroup");
  fs::create_directories(dir / "1");
  fs::copy_file(fs::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt", dir / "1" / "model.pt",
                fs::copy_options::overwrite_existing);
  write_file(dir / "config.pbtxt",
             config("instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"));
  require_loaded("gpu_regroup");
  // Only the instance group changes: Triton keeps the model and adds the new instances.
  write_file(dir / "config.pbtxt", config("instance_group [ { kind: KIND_CPU count: 2 } ]\n"));
  const auto err = core().load("gpu_regroup");
  INFO((err ? err->message : std::string()));
  REQUIRE_FALSE(err.has_value());
  const at::Tensor x = torch::randn({2, 64});
  const auto r = core().infer("gpu_regroup", {float_input("x", x)});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  CHECK(torch::allclose(output_tensor(r), direct_mlp().run({x}).at(0), 1e-4, 1e-5));
  core().unload("gpu_regroup");
}

TEST_CASE("ENABLE_CACHE_CLEANING empties the cache once the outputs are freed; unload does",
          "[triton][cuda]") {
  REQUIRE_GPU_CORE();
#if TORCHLOOM_HAS_CUDA
  const at::Tensor x = torch::ones({1, 4});
  require_loaded("gpu_clean");
  REQUIRE_FALSE(core().infer("gpu_clean", {float_input("x", x)}).error.has_value());
  c10::cuda::CUDACachingAllocator::emptyCache();
  const std::int64_t before = reserved_bytes();
  const auto r = core().infer("gpu_clean", {float_input("x", x)});
  INFO(error_text(r));
  REQUIRE_FALSE(r.error.has_value());
  CHECK(r.outputs[0].data.size() == std::size_t{256} << 20);
  // The 256 MiB output went back to the cache after the response, and the cache was emptied
  // after that (emptied before, it would keep the block).
  CHECK(reserved_bytes() <= before);
  core().unload("gpu_clean");

  // Unloading empties the cache whatever the model says: the weights and the cached output
  // of the last run go back to the device.
  c10::cuda::CUDACachingAllocator::emptyCache();
  const std::int64_t idle = reserved_bytes();
  require_loaded("gpu_unload");
  REQUIRE_FALSE(core().infer("gpu_unload", {float_input("x", x)}).error.has_value());
  CHECK(reserved_bytes() > idle);
  core().unload("gpu_unload");
  CHECK(reserved_bytes() <= idle);
#endif
}

TEST_CASE("a request that runs out of device memory fails alone; the next one is served",
          "[triton][cuda]") {
  REQUIRE_GPU_CORE();
  require_loaded("gpu_oom");
  const at::Tensor huge = torch::full({1, 4}, 1000.0f);  // 1000 GiB of scratch
  const auto r = core().infer("gpu_oom", {float_input("x", huge)});
  REQUIRE(r.error.has_value());
  INFO(r.error->message);
  CHECK(contains(r.error->message, "model 'gpu_oom'"));
  CHECK(contains(r.error->message, "out of memory"));
  const at::Tensor small = torch::zeros({2, 4});
  const auto ok = core().infer("gpu_oom", {float_input("x", small)});
  INFO(error_text(ok));
  REQUIRE_FALSE(ok.error.has_value());
  CHECK(torch::equal(output_tensor(ok), small));
}

// Malformed requests: Triton's checks and the backend's refuse them before anything runs.
void check_malformed_requests(const std::string& model) {
  INFO(model);
  require_loaded(model);
  const auto executions = core().counter(model, "execution_count");
  const auto inferences = core().counter(model, "inference_count");
  const at::Tensor ints = torch::zeros({1, 64}, torch::kInt);
  const at::Tensor narrow = torch::zeros({1, 63});
  const at::Tensor too_many = torch::zeros({65, 64});
  // 1 GiB of input that no one may read: mapped without access.
  const std::size_t gib = std::size_t{1} << 30;
  void* region = ::mmap(nullptr, gib, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
  REQUIRE(region != MAP_FAILED);
  struct unmap {
    void* p;
    std::size_t n;
    ~unmap() { ::munmap(p, n); }
  } unmapped{region, gib};
  struct malformed {
    const char* what;
    std::vector<tt::tensor_in> inputs;
  };
  const std::vector<malformed> cases = {
      {"wrong dtype", {{"x", TRITONSERVER_TYPE_INT32, {1, 64}, ints.data_ptr(), ints.nbytes()}}},
      {"wrong shape", {float_input("x", narrow)}},
      {"batch beyond max_batch_size", {float_input("x", too_many)}},
      {"missing input", {}},
      {"a 1 GiB batch",
       {{"x", TRITONSERVER_TYPE_FP32, {static_cast<std::int64_t>(gib / 256), 64}, region, gib}}},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    const auto r = core().infer(model, c.inputs);
    REQUIRE(r.error.has_value());
    INFO(r.error->message);
    CHECK(r.error->code == TRITONSERVER_ERROR_INVALID_ARG);
  }
  CHECK(core().counter(model, "execution_count") == executions);
  CHECK(core().counter(model, "inference_count") == inferences);
  CHECK(core().ready(model));
}

TEST_CASE("malformed requests get INVALID_ARG and never run the model", "[triton]") {
  check_malformed_requests("mlp");
}

TEST_CASE("statistics on the GPU: compute infer holds the run's device time", "[triton][cuda]") {
  REQUIRE_GPU_CORE();
  require_loaded("gpu_busy");
  const at::Tensor x = torch::randn({2048, 2048});
  const auto infer0 = core().duration("gpu_busy", "compute_infer", "ns");
  const auto success0 = core().duration("gpu_busy", "success", "ns");
  constexpr int requests = 3;
  for (int i = 0; i < requests; ++i) {
    const auto r = core().infer("gpu_busy", {float_input("x", x)});
    INFO(error_text(r));
    REQUIRE_FALSE(r.error.has_value());
    CHECK(torch::allclose(output_tensor(r), x, 1e-3, 1e-3));
  }
  INFO(core().statistics("gpu_busy"));
  const auto infer = core().duration("gpu_busy", "compute_infer", "ns") - infer0;
  // A physical bound, not a timing target: 344 GFLOP take at least 344 µs at 1 PFLOP/s, more
  // than any GPU does in FP32, while a compute end taken when the kernels were queued, not
  // when they finished, comes some tens of microseconds after the start.
  CHECK(infer >= requests * std::uint64_t{344000});
  CHECK(infer <= core().duration("gpu_busy", "success", "ns") - success0);
}

TEST_CASE("malformed requests never reach the GPU", "[triton][cuda]") {
  REQUIRE_GPU_CORE();
  check_malformed_requests("gpu_mlp");
}

TEST_CASE("a parameter torchloom does not read fails the load, unless the config says to "
          "ignore it",
          "[triton]") {
  const std::string foreign =
      "parameters { key: \"MY_TOOL_SETTING\" value { string_value: \"7\" } }\n";
  repo().add_mlp("foreign_key", foreign);
  REQUIRE(core().load("foreign_key").has_value());
  INFO(core().reason("foreign_key"));
  CHECK(contains(core().reason("foreign_key"), "MY_TOOL_SETTING"));
  CHECK(contains(core().reason("foreign_key"), "TORCHLOOM_IGNORE_PARAMETERS"));
  repo().add_mlp("foreign_ignored",
                 foreign + "parameters { key: \"TORCHLOOM_IGNORE_PARAMETERS\" value { "
                           "string_value: \"OTHER; MY_TOOL_SETTING\" } }\n");
  require_loaded("foreign_ignored");
  const at::Tensor x = torch::randn({1, 64});
  const auto r = core().infer("foreign_ignored", {float_input("x", x)});
  REQUIRE_FALSE(r.error.has_value());
  // No instance_group: on a core with a GPU the instance is there (see above).
  CHECK(torch::allclose(output_tensor(r), direct_mlp().run({x}).at(0), 1e-4, 1e-5));
}

TEST_CASE("TORCHLOOM_GRAPHS: a boolean; graphed<S> around the stream policy, a no-op on the "
          "CPU; graphed_caller is the same; never with streamed weights",
          "[triton]") {
  const auto param = [](const std::string& k, const std::string& v) {
    return "parameters { key: \"" + k + "\" value { string_value: \"" + v + "\" } }\n";
  };
  repo().add_mlp("graphs_maybe", param("TORCHLOOM_GRAPHS", "maybe"));
  REQUIRE(core().load("graphs_maybe").has_value());
  INFO(core().reason("graphs_maybe"));
  CHECK(contains(core().reason("graphs_maybe"), "TORCHLOOM_GRAPHS='maybe' is not a boolean"));
  // On a CPU instance graphs are a no-op (in a build with or without CUDA): the model serves
  // as torch computes it, with every stream policy a CPU has, and with graphed_caller too.
  const std::string cpu = "instance_group [ { kind: KIND_CPU } ]\n";
  for (const std::string stream : {"caller", "pool", "adaptive", "graphed_caller"}) {
    const std::string model = "graphs_cpu_" + stream;
    repo().add_mlp(model, cpu + param("TORCHLOOM_GRAPHS", "true") +
                              param("TORCHLOOM_STREAM", stream));
    const auto err = core().load(model);
    INFO(model << ": " << (err ? err->message : std::string()));
    REQUIRE_FALSE(err.has_value());
    const at::Tensor x = torch::randn({1, 64});
    const auto r = core().infer(model, {float_input("x", x)});
    REQUIRE_FALSE(r.error.has_value());
    CHECK(torch::equal(output_tensor(r), direct_mlp().run({x}).at(0)));
    core().unload(model);
  }
  // Graphs replay the copies of their capture; streamed weights move at every run.
  repo().add_mlp("graphs_streamed", cpu + param("TORCHLOOM_GRAPHS", "true") +
                                        param("TORCHLOOM_RESIDENCY", "streamed"));
  REQUIRE(core().load("graphs_streamed").has_value());
  INFO(core().reason("graphs_streamed"));
  CHECK(contains(core().reason("graphs_streamed"), "TORCHLOOM_GRAPHS=true with "
                                                   "TORCHLOOM_RESIDENCY=streamed"));
}

// --- The backend's logic on its own ---------------------------------------------------------

TEST_CASE("whatever a backend call throws becomes one Triton error; the utilities' own is "
          "handed on, not leaked",
          "[triton][logic]") {
  using torchloom::errc;
  // The backend utilities' exception types derive from nothing and carry an error object the
  // catcher owns: it must come back as the call's error, the same object.
  TRITONSERVER_Error* own = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, "from a base");
  TRITONSERVER_Error* got = tlb::call_guarded("m", errc::load_failed, [&] {
    throw triton::backend::BackendModelException(own);
  });
  CHECK(got == own);
  TRITONSERVER_ErrorDelete(got);
  own = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "from an instance base");
  got = tlb::call_guarded("m", errc::load_failed, [&] {
    throw triton::backend::BackendModelInstanceException(own);
  });
  CHECK(got == own);
  TRITONSERVER_ErrorDelete(got);

  const auto message = [](TRITONSERVER_Error* err) {
    REQUIRE(err != nullptr);
    std::pair<TRITONSERVER_Error_Code, std::string> out{TRITONSERVER_ErrorCode(err),
                                                        TRITONSERVER_ErrorMessage(err)};
    TRITONSERVER_ErrorDelete(err);
    return out;
  };
  // torch's error: its message without the C++ backtrace, named as the model's.
  const auto torch_err = message(tlb::call_guarded("m", errc::run_failed, [] {
    (void)torch::zeros({2}).view({3});
  }));
  CHECK(torch_err.first == TRITONSERVER_ERROR_INTERNAL);
  CHECK(contains(torch_err.second, "model 'm'"));
  CHECK(contains(torch_err.second, "[run_failed]"));
  CHECK_FALSE(contains(torch_err.second, "frame #"));
  const auto tl_err = message(tlb::call_guarded("m", errc::run_failed, [] {
    throw torchloom::error(errc::bad_input, "m", "bad");
  }));
  CHECK(tl_err.first == TRITONSERVER_ERROR_INVALID_ARG);
  const auto odd = message(tlb::call_guarded("m", errc::run_failed, [] { throw 42; }));
  CHECK(contains(odd.second, "unknown type"));
  CHECK(tlb::call_guarded("m", errc::run_failed, [] {}) == nullptr);
}

TEST_CASE("Triton's naming rules bind inputs and outputs, and contradictions are refused",
          "[triton][logic]") {
  using tlb::io_naming;
  const std::vector<std::string> args = {"x", "y", "z"};
  // By forward's argument names, in any order.
  auto b = tlb::bind_input_names("m", {"z", "x", "y"}, args);
  CHECK(b.naming == io_naming::arguments);
  CHECK(b.positions == std::vector<std::size_t>{2, 0, 1});
  // By index.
  b = tlb::bind_input_names("m", {"INPUT__1", "INPUT__0"}, args);
  CHECK(b.naming == io_naming::index_suffix);
  CHECK(b.positions == std::vector<std::size_t>{1, 0});
  // Config order, where every name that says something agrees with its position.
  b = tlb::bind_input_names("m", {"x", "INPUT__1", "other"}, args);
  CHECK(b.naming == io_naming::config_order);
  CHECK(b.positions == std::vector<std::size_t>{0, 1, 2});
  CHECK_TORCHLOOM_ERROR(tlb::bind_input_names("m", {"y", "other"}, args),
                        torchloom::errc::invalid_option, "'y'", "argument 1", "'other'");
  CHECK_TORCHLOOM_ERROR(tlb::bind_input_names("m", {"a__1", "other"}, args),
                        torchloom::errc::invalid_option, "'a__1'", "'other'");
  CHECK_TORCHLOOM_ERROR(tlb::bind_input_names("m", {"a__0", "b__0"}, args),
                        torchloom::errc::invalid_option, "'a__0'", "'b__0'");
  CHECK_TORCHLOOM_ERROR(tlb::bind_input_names("m", {"INPUT__3"}, args),
                        torchloom::errc::invalid_option, "INPUT__3", "forward takes 3");
  CHECK_TORCHLOOM_ERROR(tlb::bind_input_names("m", {"a", "b", "c", "d"}, args),
                        torchloom::errc::invalid_option, "4 inputs", "forward takes 3");

  auto o = tlb::bind_output_names("m", {"OUTPUT__1", "OUTPUT__0"});
  CHECK(o.naming == io_naming::index_suffix);
  CHECK(o.positions == std::vector<std::size_t>{1, 0});
  o = tlb::bind_output_names("m", {"logits", "probs__1"});
  CHECK(o.naming == io_naming::config_order);
  CHECK(o.positions == std::vector<std::size_t>{0, 1});
  CHECK_TORCHLOOM_ERROR(tlb::bind_output_names("m", {"logits", "probs__0"}),
                        torchloom::errc::invalid_option, "'probs__0'", "'logits'", "output 1");
  CHECK_TORCHLOOM_ERROR(tlb::bind_output_names("m", {"a__2", "b__2"}),
                        torchloom::errc::invalid_option, "'a__2'", "'b__2'");
}

TEST_CASE("50 unload/reload cycles of the served models", "[reload]") {
  const at::Tensor keys = torch::tensor({{0, 3, 1, 7, 7, 9}}, torch::kLong);
  const at::Tensor x = torch::randn({1, 64});
  const at::Tensor expected = direct_mlp().run({x}).at(0);
  for (int cycle = 0; cycle < 50; ++cycle) {
    INFO("cycle " << cycle);
    for (const std::string model : {"mlp", "embed"}) {
      const auto err = core().load(model);
      INFO((err ? err->message : std::string()));
      REQUIRE_FALSE(err.has_value());
    }
    const auto a = core().infer("mlp", {float_input("x", x)});
    REQUIRE_FALSE(a.error.has_value());
    CHECK(torch::equal(output_tensor(a), expected));
    const auto b = core().infer(
        "embed", {{"keys", TRITONSERVER_TYPE_INT64, {1, 6}, keys.data_ptr(), keys.nbytes()}});
    REQUIRE_FALSE(b.error.has_value());
    core().unload("mlp");
    core().unload("embed");
    REQUIRE_FALSE(core().ready("embed"));
  }
}

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--make-embed-model") == 0) {
    return make_embed_model(argv[2], argv[3]);
  }
  self_path = fs::canonical("/proc/self/exe").string();
  const int rc = Catch::Session().run(argc, argv);
  the_server.reset();
  return rc;
}
