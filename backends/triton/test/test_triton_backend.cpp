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

#include "in_process_triton.hpp"

#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
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

tt::server& triton() {
  if (!the_server) {
    the_server = std::make_unique<tt::server>(
        tt::server_options{{repo().dir.path().string()},
                           TORCHLOOM_TRITON_BACKEND_DIR,
                           true,
                           {},
                           std::getenv("TORCHLOOM_TRITON_LOG") != nullptr});
  }
  return *the_server;
}

// Loads `model` once; later calls find it loaded.
void require_loaded(const std::string& model) {
  if (triton().ready(model)) return;
  const auto err = triton().load(model);
  INFO((err ? err->message : std::string()));
  REQUIRE_FALSE(err.has_value());
  REQUIRE(triton().ready(model));
}

tt::tensor_in float_input(const std::string& name, const at::Tensor& t) {
  return {name, TRITONSERVER_TYPE_FP32, t.sizes().vec(), t.data_ptr(), t.nbytes()};
}

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
  std::atomic<int> bad{0};
  std::mutex mutex;
  std::string first;
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        const std::size_t c = static_cast<std::size_t>(t * per_thread + i) % cases.inputs.size();
        const auto r = triton().infer(model, {float_input("x", cases.inputs[c])});
        std::string why;
        if (r.error) {
          why = r.error->message;
        } else if (r.outputs.size() != 1 || r.outputs[0].name != "y" ||
                   r.outputs[0].shape != std::vector<std::int64_t>{1, 16}) {
          why = "unexpected outputs";
        } else {
          const at::Tensor got = torch::from_blob(const_cast<char*>(r.outputs[0].data.data()),
                                                  {1, 16}, torch::kFloat);
          const bool same = exact ? torch::equal(got, cases.expected[c])
                                  : torch::allclose(got, cases.expected[c], 1e-5, 1e-6);
          if (!same) why = "output differs from the runner called directly";
        }
        if (!why.empty()) {
          ++bad;
          std::lock_guard lock(mutex);
          if (first.empty()) first = why;
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  return {bad.load(), first};
}

}  // namespace

TEST_CASE("the bundled model served by the torchloom backend answers like the runner",
          "[triton]") {
  require_loaded("mlp");
  const mlp_cases cases(4);
  for (std::size_t i = 0; i < cases.inputs.size(); ++i) {
    const auto r = triton().infer("mlp", {float_input("x", cases.inputs[i])});
    INFO((r.error ? r.error->message : std::string()));
    REQUIRE_FALSE(r.error.has_value());
    REQUIRE(r.outputs.size() == 1);
    CHECK(r.outputs[0].name == "y");
    CHECK(torch::equal(output_tensor(r), cases.expected[i]));
  }
  // A request with a batch of 5 rows: the rows of the runner's batch-5 output.
  const at::Tensor x = torch::randn({5, 64});
  const auto r = triton().infer("mlp", {float_input("x", x)});
  REQUIRE_FALSE(r.error.has_value());
  CHECK(r.outputs[0].shape == std::vector<std::int64_t>{5, 16});
  CHECK(torch::equal(output_tensor(r), direct_mlp().run({x}).at(0)));
}

TEST_CASE("8 client threads x 500 requests each get the runner's answer", "[triton]") {
  require_loaded("mlp");
  const mlp_cases cases(32);
  const auto [bad, first] = hammer("mlp", cases, 8, 500, true);
  INFO(first);
  CHECK(bad == 0);
  CHECK(triton().counter("mlp", "inference_count") >= 4000);
}

TEST_CASE("dynamic batching runs fewer executions than requests, every answer right",
          "[triton]") {
  require_loaded("mlp_batched");
  const mlp_cases cases(32);
  const auto [bad, first] = hammer("mlp_batched", cases, 8, 500, false);
  INFO(first);
  CHECK(bad == 0);
  const auto inferences = triton().counter("mlp_batched", "inference_count");
  const auto executions = triton().counter("mlp_batched", "execution_count");
  INFO(triton().statistics("mlp_batched"));
  CHECK(inferences == 4000);
  CHECK(executions < inferences);
  CHECK(executions > 0);
}

TEST_CASE("instances that share weights, and KIND_MODEL on the named device, answer right",
          "[triton]") {
  for (const std::string model : {"mlp_shared", "mlp_model_kind"}) {
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
  const auto r = triton().infer(
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
  // Key 42 is outside the 10-row tables: the lookup raises inside the model.
  const at::Tensor bad_keys = torch::tensor({{0, 1, 2, 3, 4, 42}}, torch::kLong);
  const auto r = triton().infer(
      "embed", {{"keys", TRITONSERVER_TYPE_INT64, {1, 6}, bad_keys.data_ptr(), bad_keys.nbytes()}});
  REQUIRE(r.error.has_value());
  INFO(r.error->message);
  CHECK(r.error->code == TRITONSERVER_ERROR_INTERNAL);
  CHECK(contains(r.error->message, "model 'embed'"));
  CHECK(contains(r.error->message, "[run_failed]"));
  CHECK(triton().ready("embed"));
  const at::Tensor keys = torch::tensor({{1, 1, 1, 1, 1, 1}}, torch::kLong);
  const auto ok = triton().infer(
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
        const auto r = triton().infer("optional_in", {float_input("x", x), float_input("y", y)});
        if (r.error || r.outputs.empty() || !torch::equal(output_tensor(r), x + y)) ++good_failed;
      }
    });
  }
  const auto bad = triton().infer("optional_in", {float_input("x", x)});
  for (auto& c : clients) c.join();
  REQUIRE(bad.error.has_value());
  INFO(bad.error->message);
  CHECK(bad.error->code == TRITONSERVER_ERROR_INVALID_ARG);
  CHECK(contains(bad.error->message, "model 'optional_in'"));
  CHECK(contains(bad.error->message, "expected 2 inputs (x, y), got 1"));
  CHECK(contains(bad.error->message, "[bad_input]"));
  CHECK(good_failed == 0);
  CHECK(triton().ready("optional_in"));
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
    const auto err = triton().load(c.model);
    REQUIRE(err.has_value());
    CHECK_FALSE(triton().ready(c.model));
    const std::string reason = triton().reason(c.model);
    INFO(reason);
    CHECK(triton().state(c.model) == "UNAVAILABLE");
    for (const auto& p : c.parts) {
      INFO("expected in Triton's model status: " << p);
      CHECK(contains(reason, p));
    }
  }
}

TEST_CASE("50 unload/reload cycles of the served models", "[reload]") {
  const at::Tensor keys = torch::tensor({{0, 3, 1, 7, 7, 9}}, torch::kLong);
  const at::Tensor x = torch::randn({1, 64});
  const at::Tensor expected = direct_mlp().run({x}).at(0);
  for (int cycle = 0; cycle < 50; ++cycle) {
    INFO("cycle " << cycle);
    for (const std::string model : {"mlp", "embed"}) {
      const auto err = triton().load(model);
      INFO((err ? err->message : std::string()));
      REQUIRE_FALSE(err.has_value());
    }
    const auto a = triton().infer("mlp", {float_input("x", x)});
    REQUIRE_FALSE(a.error.has_value());
    CHECK(torch::equal(output_tensor(a), expected));
    const auto b = triton().infer(
        "embed", {{"keys", TRITONSERVER_TYPE_INT64, {1, 6}, keys.data_ptr(), keys.nbytes()}});
    REQUIRE_FALSE(b.error.has_value());
    triton().unload("mlp");
    triton().unload("embed");
    REQUIRE_FALSE(triton().ready("embed"));
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
