// Triton model repositories as they are: the config corpus (tests/data/configs), the keys
// of Triton's PyTorch backend, instance_group devices, KIND_MODEL, inputs and outputs by
// name, model_warmup, and hostile configs and model directories.
#include "../../support/fixtures.hpp"
#include "../../support/model_archive.hpp"

#include <torchloom/detail/json.hpp>
#include <torchloom/loader/aoti_call_spec.hpp>
#include <torchloom/torchloom.hpp>

#include <ATen/Parallel.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::temp_dir;
namespace fs = std::filesystem;

namespace {

using runner = torchloom::model_runner<torchloom::torchscript_loader>;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What a corpus file's leading comments say must happen.
struct expectation {
  std::string code = "ok";
  std::size_t line = 0;
  std::vector<std::string> messages;
  std::vector<std::string> files;  // "PATH KIND": made in the model directory first
  std::optional<std::string> platform;    // the resolved platform ("none": not decided)
  std::optional<std::string> model_file;  // the model file, relative to the model directory
  std::optional<std::string> loader;      // what loader_for says
};

expectation expectation_of(const std::string& text) {
  expectation e;
  std::istringstream lines(text);
  for (std::string l; std::getline(lines, l) && l.rfind("#", 0) == 0;) {
    auto value = [&](std::string_view key) -> std::optional<std::string> {
      if (l.rfind(key, 0) != 0) return std::nullopt;
      return l.substr(key.size());
    };
    if (auto v = value("# expect: ")) e.code = *v;
    if (auto v = value("# line: ")) e.line = std::stoul(*v);
    if (auto v = value("# message: ")) e.messages.push_back(*v);
    if (auto v = value("# file: ")) e.files.push_back(*v);
    if (auto v = value("# platform: ")) e.platform = *v;
    if (auto v = value("# model-file: ")) e.model_file = *v;
    if (auto v = value("# loader: ")) e.loader = *v;
  }
  return e;
}

// Makes `<dir>/PATH` as `KIND` says: a TorchScript archive, an AOTInductor package's layout,
// an empty file, or a directory.
void make_corpus_file(const fs::path& dir, const std::string& line) {
  const auto space = line.find(' ');
  REQUIRE(space != std::string::npos);
  const fs::path path = dir / line.substr(0, space);
  const std::string kind = line.substr(space + 1);
  fs::create_directories(path.parent_path());
  if (kind == "torchscript") {
    torchloom_test::make_linear().save(path.string());
  } else if (kind == "aoti") {
    torchloom_test::write_package_layout(path);
  } else if (kind == "empty") {
    torchloom_test::write_file(path, "");
  } else {
    REQUIRE(kind == "dir");
    fs::create_directories(path);
  }
}

// x -> x * 2 + y, with argument names x and y, returning (sum, x).
torch::jit::Module two_input_model() {
  torch::jit::Module m("two");
  m.define(R"(
def forward(self, x, y):
    return (x * 2 + y, x)
)");
  return m;
}

}  // namespace

TEST_CASE("config corpus: every file loads or fails as Triton would, naming field and line",
          "[triton][spec]") {
  const fs::path corpus = fs::path(TORCHLOOM_TEST_DATA_DIR) / "configs";
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(corpus)) {
    if (entry.path().extension() != ".pbtxt") continue;
    ++files;
    const std::string text = read_text(entry.path());
    const expectation want = expectation_of(text);
    temp_dir t;
    const fs::path dir = t / entry.path().stem().string();
    fs::create_directories(dir / "1");
    { std::ofstream(dir / "config.pbtxt", std::ios::binary) << text; }
    INFO("config " << entry.path().filename().string());
    for (const auto& f : want.files) make_corpus_file(dir, f);
    if (want.code == "ok") {
      std::optional<model_spec> spec;
      CHECK_NOTHROW(spec.emplace(model_spec::from_directory(dir)));
      if (!spec) continue;
      if (want.platform) {
        CHECK(spec->platform.name == (*want.platform == "none" ? "" : *want.platform));
      }
      if (want.model_file) {
        CHECK(spec->model_file(spec->platform.default_filename()) == dir / *want.model_file);
      }
      if (want.loader) CHECK(torchloom::to_string(torchloom::loader_for(*spec)) == *want.loader);
      continue;
    }
    const auto e = torchloom_test::capture_error([&] { (void)model_spec::from_directory(dir); });
    INFO(e.what());
    CHECK(std::string(torchloom::to_string(e.code())) == want.code);
    // A platform decided by the version directory's files has no line to name.
    const std::string where =
        (dir / "config.pbtxt").string() + ":" + std::to_string(want.line) + ":";
    if (want.line > 0) CHECK(torchloom_test::contains(e.what(), where));
    for (const auto& m : want.messages) {
      INFO("expected in the message: " << m);
      CHECK(torchloom_test::contains(e.what(), m));
    }
  }
  CHECK(files >= 20);
}

// The same configurations as Triton's core hands them to a backend: tests/data/configs_json
// holds, for each model, the config.pbtxt and the JSON that the Triton kit's core returned for
// it (TRITONSERVER_ServerModelConfig, what TRITONBACKEND_ModelConfig gives a backend): every
// field printed, defaults included, 64-bit integers sometimes as strings.
TEST_CASE("a configuration as Triton's core prints it reads as its config.pbtxt",
          "[triton][spec][json]") {
  const fs::path dir = fs::path(TORCHLOOM_TEST_DATA_DIR) / "configs_json";
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    INFO(entry.path().filename().string());
    auto pbtxt = entry.path();
    pbtxt.replace_extension(".pbtxt");
    const auto a = torchloom::parse_triton_config(read_text(pbtxt), pbtxt);
    const auto b = torchloom::parse_triton_config_json(read_text(entry.path()), "the config");
    CHECK(a.name == b.name);
    CHECK(a.backend == b.backend);
    CHECK(a.platform == b.platform);
    CHECK(a.max_batch_size == b.max_batch_size);
    CHECK(a.default_model_filename == b.default_model_filename);
    CHECK(a.parameters == b.parameters);
    REQUIRE(a.inputs.size() == b.inputs.size());
    for (std::size_t i = 0; i < a.inputs.size(); ++i) {
      CHECK(a.inputs[i].name == b.inputs[i].name);
      CHECK(a.inputs[i].dtype == b.inputs[i].dtype);
      CHECK(a.inputs[i].is_string == b.inputs[i].is_string);
      CHECK(a.inputs[i].dims == b.inputs[i].dims);
    }
    REQUIRE(a.outputs.size() == b.outputs.size());
    for (std::size_t i = 0; i < a.outputs.size(); ++i) {
      CHECK(a.outputs[i].name == b.outputs[i].name);
      CHECK(a.outputs[i].dtype == b.outputs[i].dtype);
      CHECK(a.outputs[i].dims == b.outputs[i].dims);
    }
    // The core fills in instance groups (a name, KIND_AUTO resolved, count 1).
    REQUIRE(b.instance_groups.size() == std::max<std::size_t>(1, a.instance_groups.size()));
    for (std::size_t i = 0; i < a.instance_groups.size(); ++i) {
      CHECK(a.instance_groups[i].kind == b.instance_groups[i].kind);
      CHECK(a.instance_groups[i].count == b.instance_groups[i].count);
    }
    REQUIRE(a.warmups.size() == b.warmups.size());
    for (std::size_t i = 0; i < a.warmups.size(); ++i) {
      CHECK(a.warmups[i].name == b.warmups[i].name);
      CHECK(a.warmups[i].batch_size == b.warmups[i].batch_size);
      CHECK(a.warmups[i].count == b.warmups[i].count);
      REQUIRE(a.warmups[i].inputs.size() == b.warmups[i].inputs.size());
      CHECK(a.warmups[i].inputs[0].dims == b.warmups[i].inputs[0].dims);
      CHECK(a.warmups[i].inputs[0].source == b.warmups[i].inputs[0].source);
    }
  }
  CHECK(files >= 6);
}

TEST_CASE("a JSON configuration is checked as a config.pbtxt is, naming its fields",
          "[triton][spec][json]") {
  using torchloom::parse_triton_config_json;
  const auto parse = [](std::string_view json) {
    return parse_triton_config_json(json, "the model configuration");
  };
  // Protobuf's JSON forms: lowerCamelCase names, 64-bit integers as strings.
  const auto c = parse(R"({"name":"m","maxBatchSize":4,"input":[{"name":"x","dataType":
      "TYPE_INT64","dims":["3","-1"]}],"parameters":{"INFERENCE_MODE":{"stringValue":"false"}}})");
  CHECK(c.max_batch_size == 4);
  REQUIRE(c.inputs.size() == 1);
  CHECK(c.inputs[0].dtype == c10::ScalarType::Long);
  CHECK(c.inputs[0].dims == std::vector<std::int64_t>{3, -1});
  CHECK(c.parameters.at("INFERENCE_MODE") == "false");
  // A default value of a field this schema does not know says nothing (a newer core);
  // any other value is refused by name.
  CHECK_NOTHROW(parse(R"({"name":"m","brand_new_flag":false,"brand_new_list":[]})"));
  CHECK_TORCHLOOM_ERROR(parse(R"({"name":"m","max_batch_sise":4})"), errc::invalid_option,
                        "the model configuration: unknown field 'max_batch_sise'",
                        "max_batch_size");
  CHECK_TORCHLOOM_ERROR(parse(R"({"input":[{"name":"x","data_type":"TYPE_UINT16"}]})"),
                        errc::unsupported, "the model configuration: input 'x'", "TYPE_UINT16");
  CHECK_TORCHLOOM_ERROR(parse(R"({"platform":"onnxruntime_onnx"})"), errc::unsupported,
                        "the model configuration: this config is for Triton's onnxruntime");
  CHECK_TORCHLOOM_ERROR(parse(R"({"max_batch_size":"four"})"), errc::invalid_option,
                        "'max_batch_size' takes an integer (int32), not 'four'");
  CHECK_TORCHLOOM_ERROR(parse(R"({"dynamic_batching":{},"sequence_batching":{}})"),
                        errc::invalid_option, "exclude each other");
  // Not JSON at all: where and why.
  CHECK_TORCHLOOM_ERROR(parse(R"({"name":"m",})"), errc::invalid_option,
                        "the model configuration: not valid JSON: ", "at byte 12");
  CHECK_TORCHLOOM_ERROR(parse(R"({"name":"m","name":"n"})"), errc::invalid_option,
                        "'name' is given twice");
  CHECK_TORCHLOOM_ERROR(parse(R"({"name":"a\ud800"})"), errc::invalid_option, "surrogate");
  CHECK(parse(R"({"name":"\u00e9\ud83d\ude00"})").name == "\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(parse("").name.empty());

  // A model directory with its configuration as JSON: config.pbtxt is not read, and a
  // parameter is checked as from config.pbtxt.
  temp_dir t;
  fs::create_directories(t / "m" / "1");
  torchloom_test::write_file(t / "m" / "config.pbtxt", "this is not a config");
  const auto s = model_spec::from_directory(
      t / "m", std::nullopt, {},
      R"({"name":"m","parameters":{"INTRA_OP_THREAD_COUNT":{"string_value":"2"}}})");
  CHECK(*s.options.intra_op_thread_count == 2);
  CHECK_TORCHLOOM_ERROR(
      model_spec::from_directory(
          t / "m", std::nullopt, {},
          R"({"name":"m","parameters":{"INFERENCE_MODE":{"string_value":"maybe"}}})"),
      errc::invalid_option, "model 'm'", "the model configuration: parameters: ",
      "INFERENCE_MODE");
}

TEST_CASE("config corpus: the values of the configs that load", "[triton][spec]") {
  const fs::path corpus = fs::path(TORCHLOOM_TEST_DATA_DIR) / "configs";
  const auto syntax =
      torchloom::parse_triton_config(read_text(corpus / "04_text_format_syntax.pbtxt"));
  CHECK(syntax.name == "syntax");
  CHECK(syntax.max_batch_size == 16);
  REQUIRE(syntax.inputs.size() == 1);
  CHECK(syntax.inputs[0].name == "in_0");
  CHECK(syntax.inputs[0].dtype == c10::ScalarType::Float);
  CHECK(syntax.inputs[0].dims == std::vector<std::int64_t>{-1, 8});
  CHECK(syntax.outputs[0].name == "out_0");
  REQUIRE(syntax.instance_groups.size() == 1);
  CHECK(syntax.instance_groups[0].kind == "KIND_CPU");
  CHECK(syntax.parameters.at("AOTI_MODEL_NAME") == "a\tb\"c\\d");

  temp_dir t;
  fs::create_directories(t / "all" / "1");
  fs::copy_file(corpus / "02_every_pytorch_key.pbtxt", t / "all" / "config.pbtxt");
  const auto s = model_spec::from_directory(t / "all");
  CHECK(s.options.disable_optimized_execution);
  CHECK_FALSE(s.options.inference_mode);
  CHECK(s.options.disable_cudnn == true);
  CHECK(s.options.enable_weight_sharing == false);
  CHECK(s.options.enable_cache_cleaning);
  CHECK(*s.options.inter_op_thread_count == 0);
  CHECK(*s.options.intra_op_thread_count == -1);
  CHECK(s.options.enable_tensor_fuser == false);
  CHECK(s.options.enable_nvfuser == false);

  const auto warm = torchloom::parse_triton_config(read_text(corpus / "29_model_warmup.pbtxt"));
  REQUIRE(warm.warmups.size() == 2);
  CHECK(warm.warmups[0].name == "zeros");
  CHECK(warm.warmups[0].batch_size == 2);
  CHECK(warm.warmups[0].count == 3);
  REQUIRE(warm.warmups[0].inputs.size() == 1);
  CHECK(warm.warmups[0].inputs[0].source == torchloom::warmup_input_decl::data::zero);
  CHECK(warm.warmups[1].inputs[0].source == torchloom::warmup_input_decl::data::random);
  CHECK(warm.warmups[1].count == 1);
}

TEST_CASE("pytorch_backend keys: aliases, torch defaults, Python-runtime keys, case",
          "[triton][options]") {
  torchloom::runner_options o;
  torchloom::set_option(o, "CACHE_CLEANING_ENABLED", "true");
  CHECK(o.enable_cache_cleaning);
  CHECK(torchloom::get_option(o, "CACHE_CLEANING_ENABLED") == "true");
  torchloom::set_option(o, "DISABLE_CUDNN", "1");
  CHECK(o.disable_cudnn == true);
  torchloom::set_option(o, "ENABLE_TENSOR_FUSER", "off");
  CHECK(o.enable_tensor_fuser == false);
  torchloom::set_option(o, "INTRA_OP_THREAD_COUNT", "0");
  CHECK(*o.intra_op_thread_count == 0);
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "INTRA_OP_THREAD_COUNT", "4097"),
                        errc::invalid_option, "'4097'", "up to 4096", "torch's default");
  for (const char* key :
       {"NUM_THREADS", "NUM_INTEROP_THREADS", "TORCH_COMPILE_OPTIONAL_PARAMETERS"}) {
    CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, key, "4", "m"), errc::unsupported, "model 'm'",
                          key, "Triton's Python runtime for PyTorch");
  }
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "Inference_Mode", "true"), errc::invalid_option,
                        "case-sensitive", "'INFERENCE_MODE'");
  // Nothing close: no list of unrelated keys.
  const auto far =
      torchloom_test::capture_error([&] { torchloom::set_option(o, "EXECUTION_ENV_PATH", "x"); });
  CHECK_FALSE(torchloom_test::contains(far.what(), "did you mean"));
}

TEST_CASE("thread counts of 0 or less leave torch's default", "[triton][runner]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  torchloom_test::write_triton_model(t / "m", m, R"(
parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "0" } }
parameters { key: "INTER_OP_THREAD_COUNT" value { string_value: "-4" } }
)");
  const int before = at::get_num_threads();
  runner r(model_spec::from_directory(t / "m"));
  CHECK(at::get_num_threads() == before);
  CHECK(r.run({torch::rand({2, 8})}).size() == 1);
}

TEST_CASE("DISABLE_CUDNN and ENABLE_TENSOR_FUSER are process-wide settings with conflicts",
          "[triton][runner]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  torchloom_test::write_triton_model(t / "a", m, R"(
name: "a"
parameters { key: "DISABLE_CUDNN" value { string_value: "true" } }
parameters { key: "ENABLE_TENSOR_FUSER" value { string_value: "false" } }
)");
  torchloom_test::write_triton_model(t / "b", m, R"(
name: "b"
parameters { key: "DISABLE_CUDNN" value { string_value: "false" } }
)");
  torchloom_test::write_triton_model(t / "c", m, R"(
name: "c"
parameters { key: "ENABLE_TENSOR_FUSER" value { string_value: "true" } }
)");
  const bool cudnn_before = at::globalContext().userEnabledCuDNN();
  const bool fuser_before = torch::jit::tensorExprFuserEnabled();
  {
    runner a(model_spec::from_directory(t / "a"));
    CHECK_FALSE(at::globalContext().userEnabledCuDNN());
    CHECK_FALSE(torch::jit::tensorExprFuserEnabled());
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "b")), errc::invalid_option,
                          "model 'b'", "DISABLE_CUDNN=false conflicts with DISABLE_CUDNN=true",
                          "model 'a'");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "c")), errc::invalid_option,
                          "model 'c'", "ENABLE_TENSOR_FUSER");
  }
  at::globalContext().setUserEnabledCuDNN(cudnn_before);
  torch::jit::setTensorExprFuserEnabled(fuser_before);
}

TEST_CASE("an option for a policy the runner does not have is refused, naming the policy",
          "[triton][runner]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  torchloom_test::write_triton_model(t / "m", m);
  const auto spec = [&] { return model_spec::from_directory(t / "m"); };
  CHECK_TORCHLOOM_ERROR(runner(spec().set("MODEL_INIT_LIBRARY", "libinit.so")),
                        errc::invalid_option, "MODEL_INIT_LIBRARY", "dlopen_hook",
                        "would be ignored");
  CHECK_TORCHLOOM_ERROR(runner(spec().set("WEIGHT_OFFLOAD_BUDGET_MB", "64")), errc::invalid_option,
                        "WEIGHT_OFFLOAD_BUDGET_MB", "streamed_weights");
  CHECK_TORCHLOOM_ERROR(runner(spec().set("GREEN_CONTEXT_SM_COUNT", "8")), errc::invalid_option,
                        "GREEN_CONTEXT_SM_COUNT", "green_context_stream");
  CHECK_TORCHLOOM_ERROR(runner(spec().set("AOTI_NUM_RUNNERS", "2")), errc::invalid_option,
                        "AOTI_NUM_RUNNERS", "aoti_loader");
  // The default value is not "given".
  CHECK_NOTHROW(runner(spec().set("WEIGHT_OFFLOAD_PREFETCH_DEPTH", "2")));
  // A policy that reads the key takes it (the hook fails on the missing library, later).
  using hooked = torchloom::model_runner<torchloom::torchscript_loader, torchloom::dlopen_hook>;
  CHECK_TORCHLOOM_ERROR(hooked(spec().set("MODEL_INIT_LIBRARY", "libinit.so")), errc::hook_failed,
                        "libinit.so");
}

TEST_CASE("instance_group: the device comes from the config; a contradicting one is refused",
          "[triton][runner]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  torchloom_test::write_triton_model(t / "cpu", m,
                                     "instance_group [ { kind: KIND_CPU count: 2 } ]");
  runner on_cpu(model_spec::from_directory(t / "cpu"));
  CHECK(on_cpu.device().is_cpu());
  CHECK(on_cpu.run({torch::rand({2, 8})})[0].device().is_cpu());

  torchloom_test::write_triton_model(t / "gpu", m,
                                     "instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]");
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "gpu"), c10::Device(c10::kCPU)),
                        errc::invalid_option, "model 'gpu'", "device cpu contradicts",
                        "instance_group", "cuda:1");
  if (torch::cuda::device_count() < 2) {
    // Without the device asked for, the runner takes cuda:1 from the config, and says that
    // this machine lacks it.
    const auto e =
        torchloom_test::capture_error([&] { runner r(model_spec::from_directory(t / "gpu")); });
    CHECK(e.code() == errc::unsupported);
    CHECK(torchloom_test::contains(e.what(), "cuda:1"));
  }
  torchloom_test::write_triton_model(t / "two", m, R"(
instance_group [ { kind: KIND_GPU gpus: [ 0 ] }, { kind: KIND_CPU } ]
)");
  CHECK(runner(model_spec::from_directory(t / "two"), c10::Device(c10::kCPU)).device().is_cpu());
}

TEST_CASE("KIND_MODEL on a CPU-only model: loaded as saved, run on its parameters' device",
          "[triton][runner]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  torchloom_test::write_triton_model(t / "m", m, "instance_group [ { kind: KIND_MODEL } ]");
  const auto spec = model_spec::from_directory(t / "m");
  CHECK(spec.model_placement());
  if (torch::cuda::device_count() == 0) {
    runner r(spec);
    CHECK(r.device().is_cpu());
    CHECK(torch::allclose(
        r.run({torch::ones({1, 8})})[0],
        torch::linear(torch::ones({1, 8}), m.attr("w").toTensor(), m.attr("b").toTensor())));
  }
}

TEST_CASE("run_named: inputs by argument name, INPUT__i, the config's names; outputs by name",
          "[triton][runner]") {
  temp_dir t;
  auto m = two_input_model();
  const auto x = torch::rand({3});
  const auto y = torch::rand({3});
  SECTION("forward-argument names, outputs OUTPUT__i") {
    torchloom_test::write_triton_model(t / "m", m);
    runner r(model_spec::from_directory(t / "m"));
    auto out = r.run_named({{"y", y}, {"x", x}});
    REQUIRE(out.size() == 2);
    CHECK(torch::allclose(out.at("OUTPUT__0").toTensor(), x * 2 + y));
    CHECK(torch::equal(out.at("OUTPUT__1").toTensor(), x));
    CHECK_TORCHLOOM_ERROR(r.run_named({{"x", x}, {"z", y}}), errc::bad_input, "'z'",
                          "did you mean 'x'");
    CHECK_TORCHLOOM_ERROR(r.run_named({{"x", x}}), errc::bad_input, "no value for input 1 ('y')");
  }
  SECTION("Triton's INPUT__i convention and the config's output names") {
    torchloom_test::write_triton_model(t / "m", m, R"(
input [ { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 3 ] },
        { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "COPY__1" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "SUM__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
)");
    runner r(model_spec::from_directory(t / "m"));
    auto out = r.run_named({{"INPUT__0", x}, {"INPUT__1", y}});
    CHECK(torch::allclose(out.at("SUM__0").toTensor(), x * 2 + y));
    CHECK(torch::equal(out.at("COPY__1").toTensor(), x));
  }
  SECTION("the config's names in strict order") {
    torchloom_test::write_triton_model(t / "m", m, R"(
input [ { name: "first" data_type: TYPE_FP32 dims: [ 3 ] },
        { name: "second" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "sum" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "copy" data_type: TYPE_FP32 dims: [ 3 ] } ]
)");
    runner r(model_spec::from_directory(t / "m"));
    auto out = r.run_named({{"second", y}, {"first", x}});
    CHECK(torch::allclose(out.at("sum").toTensor(), x * 2 + y));
    CHECK(torch::equal(out.at("copy").toTensor(), x));
    CHECK_TORCHLOOM_ERROR(r.run_named({{"first", torch::rand({4})}, {"second", y}}),
                          errc::bad_input, "input 0", "shape");
  }
}

TEST_CASE("lists of strings in and out, and dicts of tensors in, through run_ivalue",
          "[triton][runner]") {
  temp_dir t;
  torch::jit::Module strings("strings");
  strings.define(R"(
def forward(self, words: List[str]) -> List[str]:
    out: List[str] = []
    for w in words:
        out.append(w + "!")
    return out
)");
  torchloom_test::write_triton_model(t / "s", strings);
  runner rs(model_spec::from_directory(t / "s"));
  c10::List<std::string> words({"a", "bc"});
  const auto out = rs.run_ivalue({words}).toList();
  REQUIRE(out.size() == 2);
  CHECK(out.get(0).toStringRef() == "a!");
  CHECK(out.get(1).toStringRef() == "bc!");
  CHECK_TORCHLOOM_ERROR(rs.run_ivalue({torch::rand({2})}), errc::bad_input,
                        "input 0 ('words') must be", "got a Tensor");

  torch::jit::Module dict("dict");
  dict.define(R"(
def forward(self, d: Dict[str, Tensor]):
    return d["a"] + d["b"]
)");
  torchloom_test::write_triton_model(t / "d", dict);
  runner rd(model_spec::from_directory(t / "d"));
  c10::Dict<std::string, at::Tensor> in;
  in.insert("a", torch::ones({2}));
  in.insert("b", torch::ones({2}));
  CHECK(torch::equal(rd.run({in})[0], torch::full({2}, 2.0)));
  // run_named: a model of one Dict[str, Tensor] argument gets the named inputs as the dict,
  // or the dict under the argument's own name.
  auto named = rd.run_named({{"a", torch::ones({2})}, {"b", torch::full({2}, 3.0)}});
  CHECK(torch::equal(named.at("OUTPUT__0").toTensor(), torch::full({2}, 4.0)));
  CHECK(torch::equal(rd.run_named({{"d", in}}).at("OUTPUT__0").toTensor(), torch::full({2}, 2.0)));
  CHECK_TORCHLOOM_ERROR(rd.run_named({{"a", torch::ones({2})}, {"b", c10::IValue(1)}}),
                        errc::bad_input, "input 'b' must be a Tensor");
  c10::Dict<std::string, at::Tensor> bad;
  bad.insert("a", at::Tensor());
  bad.insert("b", torch::ones({2}));
  CHECK_TORCHLOOM_ERROR(rd.run({bad}), errc::bad_input, "input 0 ('d')", "undefined Tensor", "'a'");
}

TEST_CASE("model_warmup: every sample runs count times with zero, random or file data",
          "[triton][runner]") {
  temp_dir t;
  torch::jit::Module m("counter");
  m.register_buffer("calls", torch::zeros({1}));
  m.register_buffer("last", torch::zeros({2, 4}));
  m.define(R"(
def forward(self, x):
    self.calls.add_(1)
    self.last.copy_(x)
    return x
)");
  const auto data = torch::arange(8, torch::kFloat).reshape({2, 4});
  torchloom_test::write_triton_model(t / "m", m, R"(
max_batch_size: 2
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "INFERENCE_MODE" value { string_value: "false" } }
model_warmup [
  { name: "zeros" batch_size: 2 count: 3 inputs { key: "INPUT__0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } },
  { name: "random" batch_size: 1 count: 2 inputs { key: "INPUT__0" value { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } },
  { name: "file" batch_size: 2 inputs { key: "INPUT__0" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.bin" } } }
]
)");
  fs::create_directories(t / "m" / "warmup");
  {
    std::ofstream f(t / "m" / "warmup" / "x.bin", std::ios::binary);
    f.write(static_cast<const char*>(data.data_ptr()), 8 * sizeof(float));
  }
  runner r(model_spec::from_directory(t / "m"));
  CHECK(r.model().module.attr("calls").toTensor().item<float>() == 6.0f);  // 3 + 2 + 1
  CHECK(torch::equal(r.model().module.attr("last").toTensor(), data));

  // A file of the wrong size names the file and both sizes.
  {
    std::ofstream f(t / "m" / "warmup" / "x.bin", std::ios::binary);
    f << "short";
  }
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::invalid_option, "x.bin",
                        "holds 5 bytes", "needs 32");
}

TEST_CASE("hostile config.pbtxt: nesting, size, fields, NUL, pipes, devices, directories",
          "[triton][hostile]") {
  temp_dir t;
  fs::create_directories(t / "m" / "1");
  const fs::path config = t / "m" / "config.pbtxt";
  SECTION("nested 20,000 deep") {
    std::string deep;
    for (int i = 0; i < 20000; ++i) deep += "a{";
    CHECK_TORCHLOOM_ERROR(torchloom::parse_triton_config(deep, "c.pbtxt"), errc::invalid_option,
                          "c.pbtxt:1", "nested deeper than 64");
    torchloom_test::write_file(config, deep);
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                          "nested deeper than 64");
    std::string lists;
    for (int i = 0; i < 20000; ++i) lists += "a [ {";
    CHECK_TORCHLOOM_ERROR(torchloom::parse_triton_config(lists, "c.pbtxt"), errc::invalid_option,
                          "nested deeper than 64");
  }
  SECTION("larger than 1 MiB") {
    torchloom_test::write_file(config, "# " + std::string(std::size_t{2} << 20, 'x') + "\n");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                          "larger than 1048576 bytes");
  }
  SECTION("many fields") {
    std::string many;
    for (int i = 0; i < 200000; ++i) many += "a:1\n";
    CHECK_TORCHLOOM_ERROR(torchloom::parse_triton_config(many, "c.pbtxt"), errc::invalid_option,
                          "more than 100000 fields");
  }
  SECTION("a NUL byte, and everything after it") {
    const std::string text("name: \"m\"\n\0max_batch_size: -1\n", 30);
    CHECK_TORCHLOOM_ERROR(torchloom::parse_triton_config(text, "c.pbtxt"), errc::invalid_option,
                          "c.pbtxt:2", "NUL byte");
  }
  SECTION("a named pipe does not block") {
    REQUIRE(::mkfifo(config.c_str(), 0600) == 0);
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                          "not a regular file", "named pipe");
  }
  SECTION("/dev/zero is not read") {
    fs::create_symlink("/dev/zero", config);
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                          "not a regular file", "device");
  }
  SECTION("a directory is not 'no config'") {
    fs::create_directories(config);
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                          "not a regular file", "a directory");
  }
  SECTION("an 8 MiB unknown key: a short message") {
    const std::string key(std::size_t{8} << 20, 'K');
    const auto e = torchloom_test::capture_error([&] {
      torchloom::runner_options o;
      torchloom::set_option(o, key, "1");
    });
    CHECK(e.code() == errc::invalid_option);
    CHECK(std::string(e.what()).size() < 400);
    CHECK(torchloom_test::contains(e.what(), "(8388608 characters)"));
  }
  SECTION("a newline in a value cannot forge a line") {
    torchloom_test::write_file(
        config, "parameters { key: \"WARMUP_ITERATIONS\" value { string_value: \"1\\nforged\" } }");
    const auto e =
        torchloom_test::capture_error([&] { (void)model_spec::from_directory(t / "m"); });
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
    CHECK(torchloom_test::contains(e.what(), "1\\nforged"));
  }
  SECTION("the same parameter twice") {
    torchloom_test::write_file(config, R"(
parameters { key: "INFERENCE_MODE" value { string_value: "true" } }
parameters { key: "INFERENCE_MODE" value { string_value: "false" } }
)");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                          "config.pbtxt:3", "'INFERENCE_MODE' is given twice (first on line 2)");
  }
  SECTION("default_model_filename outside the model directory") {
    torchloom_test::write_file(config, "default_model_filename: \"/etc/passwd\"");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option, "/etc/passwd",
                          "inside the version directory");
    torchloom_test::write_file(config, "default_model_filename: \"sub/../../m.pt\"");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option, "'..'");
  }
}

TEST_CASE("hostile model directories: each reported as what it is", "[triton][hostile]") {
  temp_dir t;
  SECTION("a symlink loop") {
    fs::create_symlink(t / "loop", t / "loop");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "loop"), errc::invalid_option,
                          "cannot be read", "symbolic links");
    CHECK_TORCHLOOM_ERROR(model_spec::from_path(t / "loop"), errc::invalid_option,
                          "symbolic links");
    fs::create_directories(t / "m" / "1");
    fs::create_symlink(t / "m" / "1" / "model.pt", t / "m" / "1" / "model.pt");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "model.pt", "symbolic links");
  }
  SECTION("a directory named model.pt") {
    fs::create_directories(t / "m" / "1" / "model.pt");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "not a regular file (a directory)");
  }
  SECTION("a name too long") {
    const std::string long_name(300, 'n');
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / long_name), errc::invalid_option,
                          "File name too long");
    CHECK_TORCHLOOM_ERROR(model_spec::from_file(t / (long_name + ".pt")), errc::load_failed,
                          "File name too long");
  }
  SECTION("01/ as the only version directory") {
    fs::create_directories(t / "m" / "01");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::model_not_found,
                          "no version directory", "'01/' is not a version directory",
                          "leading zeros");
  }
  SECTION("a negative version") {
    fs::create_directories(t / "m" / "1");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m", -1), errc::invalid_option,
                          "version -1");
  }
  SECTION("a file where the directory should be") {
    torchloom_test::write_file(t / "f", "x");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "f"), errc::invalid_option,
                          "is not a directory");
  }
}

// Two GPUs: a TorchScript module whose first layer sits on cuda:0 and second on cuda:1,
// loaded under KIND_MODEL (no remapping) and run through caller_stream and pool_stream.
TEMPLATE_TEST_CASE("CUDA: KIND_MODEL runs a model across two GPUs", "[triton][cuda][multi_gpu]",
                   torchloom::caller_stream, torchloom::pool_stream) {
  TORCHLOOM_REQUIRE_CUDA();
  if (torch::cuda::device_count() < 2) TORCHLOOM_CATCH_SKIP("fewer than two CUDA devices");
  temp_dir t;
  const c10::Device gpu0("cuda:0");
  const c10::Device gpu1("cuda:1");
  torch::jit::Module m("split");
  const auto w0 = torch::randn({16, 8});
  const auto w1 = torch::randn({4, 16});
  m.register_parameter("w0", w0.to(gpu0), false);
  m.register_parameter("w1", w1.to(gpu1), false);
  m.define(R"(
def forward(self, x):
    h = torch.relu(torch.matmul(x, self.w0.t()))
    return torch.matmul(h.to(self.w1.device), self.w1.t())
)");
  torchloom_test::write_triton_model(t / "m", m, "instance_group [ { kind: KIND_MODEL } ]");
  using two_gpu_runner =
      torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, TestType>;
  two_gpu_runner r(model_spec::from_directory(t / "m"));
  CHECK(r.device() == gpu0);
  CHECK(r.model().module.attr("w1").toTensor().device() == gpu1);  // not remapped
  const auto x = torch::randn({32, 8});
  const auto want = torch::matmul(torch::relu(torch::matmul(x, w0.t())), w1.t());
  for (int i = 0; i < 20; ++i) {
    const auto out = r.run({x})[0];
    CHECK(out.device() == gpu1);
    CHECK(torch::allclose(out.cpu(), want, 1e-4, 1e-4));
  }
  // A device that contradicts the model's placement is refused.
  CHECK_TORCHLOOM_ERROR(two_gpu_runner(model_spec::from_directory(t / "m"), gpu1),
                        errc::invalid_option, "cuda:1", "KIND_MODEL", "cuda:0");
  // Dict[str, Tensor] inputs: CPU tensors are moved to the runner's device.
  torch::jit::Module dict("dict");
  dict.define(R"(
def forward(self, d: Dict[str, Tensor]):
    return d["a"] + 1
)");
  torchloom_test::write_triton_model(t / "d", dict);
  two_gpu_runner rd(model_spec::from_directory(t / "d"), gpu0);
  c10::Dict<std::string, at::Tensor> in;
  in.insert("a", torch::ones({2}));
  const auto out = rd.run({in})[0];
  CHECK(out.device() == gpu0);
  CHECK(torch::equal(out.cpu(), torch::full({2}, 2.0)));
}

// ---------------------------------------------------------------------------------------
// Forward-based names (Triton 26.05's, for AOTInductor packages) through the runner: a
// TorchScript stand-in with the inputs and outputs of Triton's README example, and a loader
// that names them from that model's real call spec, so run_named and the config's names are
// checked without a GPU or a compiled package.

namespace {

// The call spec torch 2.11 wrote for a model (tests/data/aoti/call_specs.json).
torchloom::io_names call_spec_names(const std::string& model) {
  static const auto models = [] {
    const std::string text = read_text(fs::path(TORCHLOOM_TEST_DATA_DIR) / "aoti" /
                                       "call_specs.json");
    return *torchloom::detail::parse_json(text).find("models");
  }();
  const auto* m = models.find(model);
  REQUIRE(m != nullptr);
  std::vector<std::string> inputs;
  for (const auto& n : m->find("package_inputs")->items) inputs.push_back(n.text);
  return torchloom::detail::name_call_spec({m->find("in_spec")->text, m->find("out_spec")->text},
                                           inputs, std::stoul(m->find("package_outputs")->text));
}

// Triton's README model: six tensor inputs (hdata, vdata, options' keyA and key2, kwarg1,
// kw_arg2) and eight outputs in its dict's order (AAA, ZZZ, BBB[0], BBB[1], CCC[keyA],
// CCC[key2], DDD[KA], DDD[KB]).
torch::jit::Module readme_stand_in() {
  torch::jit::Module m("readme");
  m.define(R"(
def forward(self, hdata, vdata, options_keya, options_key2, kwarg1, kw_arg2):
    return (hdata + vdata, hdata - vdata, hdata * 2, vdata * 3, options_keya + 1,
            options_key2 * 2, kwarg1 + hdata, kw_arg2 - vdata)
)");
  return m;
}

struct readme_loader : torchloom::torchscript_loader {
  torchloom::io_names names(const model_type&) const { return call_spec_names("triton_example"); }
};
struct gpt2_loader : torchloom::torchscript_loader {
  torchloom::io_names names(const model_type&) const { return call_spec_names("gpt2_kwargs"); }
};

// What each output must be, in the call spec's order, for inputs 1..6.
std::vector<at::Tensor> readme_expected(const std::vector<at::Tensor>& in) {
  return {in[0] + in[1], in[0] - in[1], in[0] * 2, in[1] * 3,
          in[2] + 1,     in[3] * 2,     in[4] + in[0], in[5] - in[1]};
}

const std::vector<std::string> readme_inputs = {"ARGS[0]",        "ARGS[1]",
                                                "ARGS[2][keyA]",  "ARGS[2][key2]",
                                                "KWARGS[kwarg1]", "KWARGS[kw_arg2]"};
const std::vector<std::string> readme_outputs = {
    "RESULT[AAA]",       "RESULT[ZZZ]",       "RESULT[BBB][0]",  "RESULT[BBB][1]",
    "RESULT[CCC][keyA]", "RESULT[CCC][key2]", "RESULT[DDD][KA]", "RESULT[DDD][KB]"};

// A torch_aoti config with the stand-in: the spec says torch_aoti (so the names are strict)
// but the platform the runner checks is left open, as the stand-in is TorchScript.
model_spec strict_spec(const fs::path& dir) {
  model_spec spec = model_spec::from_directory(dir);
  spec.config->platform = "torch_aoti";
  spec.platform = {};
  return spec;
}

}  // namespace

TEST_CASE("forward-based names: run_named by ARGS/KWARGS/INPUT__i, outputs by the config's names",
          "[triton][runner][names]") {
  using readme_runner = torchloom::model_runner<readme_loader>;
  temp_dir t;
  auto m = readme_stand_in();
  // Triton's README config (the corpus's): outputs listed alphabetically, not in the
  // package's order; here in float32 and on the CPU, without the platform line (set below).
  std::string config = read_text(fs::path(TORCHLOOM_TEST_DATA_DIR) / "configs" /
                                 "36_torch_aoti_forward_names.pbtxt");
  const std::string platform_line = "\nplatform: \"torch_aoti\"\n";
  config.erase(config.find(platform_line), platform_line.size() - 1);
  config.erase(config.find("instance_group"));
  for (auto at = config.find("TYPE_FP16"); at != std::string::npos; at = config.find("TYPE_FP16")) {
    config.replace(at, 9, "TYPE_FP32");
  }
  torchloom_test::write_triton_model(t / "m", m, config);
  std::vector<at::Tensor> in;
  for (int i = 0; i < 6; ++i) in.push_back(torch::rand({1, 16}));
  const auto want = readme_expected(in);
  readme_runner r(strict_spec(t / "m"));
  CHECK(r.names().inputs == readme_inputs);
  CHECK(r.names().outputs == readme_outputs);
  // The config's dtype and dims reached each input through its forward-based name.
  for (const auto& s : r.inputs()) {
    CHECK(s.dtype == c10::ScalarType::Float);
    CHECK(s.shape == std::vector<std::int64_t>{1, 16});
  }
  std::map<std::string, c10::IValue> by_name;
  std::map<std::string, c10::IValue> by_ordinal;
  for (std::size_t i = 0; i < 6; ++i) {
    by_name[readme_inputs[i]] = in[i];
    by_ordinal["INPUT__" + std::to_string(i)] = in[i];
  }
  for (const auto& named : {r.run_named(by_name), r.run_named(by_ordinal)}) {
    REQUIRE(named.size() == 8);
    for (std::size_t i = 0; i < 8; ++i) {
      INFO(readme_outputs[i]);
      CHECK(torch::equal(named.at(readme_outputs[i]).toTensor(), want[i]));
    }
  }
  // run() takes and returns them flat, in the call spec's order.
  std::vector<c10::IValue> flat(in.begin(), in.end());
  const auto out = r.run(flat);
  REQUIRE(out.size() == 8);
  for (std::size_t i = 0; i < 8; ++i) CHECK(torch::equal(out[i], want[i]));
  // The positions a server maps a request's names to.
  CHECK(r.input_index("ARGS[2][key2]") == 3u);
  CHECK(r.input_index("KWARGS[kw_arg2]") == 5u);
  CHECK(r.input_index("INPUT__4") == 4u);
  CHECK(r.input_index("hdata") == 0u);  // the graph input's own name
  CHECK_FALSE(r.input_index("ARGS[2]"));
  CHECK(r.output_index("RESULT[ZZZ]") == 1u);
  CHECK(r.output_index("OUTPUT__1") == 1u);
  CHECK(r.output_index("RESULT[DDD][KB]") == 7u);
  CHECK_FALSE(r.output_index("OUTPUT__8"));
  CHECK_FALSE(r.output_index("RESULT[BBB]"));
  // Bad names: what the package has instead.
  auto missing = by_name;
  missing.erase("ARGS[1]");
  CHECK_TORCHLOOM_ERROR(r.run_named(missing), errc::bad_input,
                        "no value for input 1 ('vdata'), ARGS[1]");
  auto typo = by_name;
  typo["ARGS[2][keya]"] = typo.at("ARGS[2][keyA]");
  typo.erase("ARGS[2][keyA]");
  CHECK_TORCHLOOM_ERROR(r.run_named(typo), errc::bad_input, "no input is called 'ARGS[2][keya]'",
                        "did you mean 'ARGS[2][keyA]'");
}

TEST_CASE("forward-based names: a torch_aoti config naming what the package lacks fails the load",
          "[triton][runner][names]") {
  using readme_runner = torchloom::model_runner<readme_loader>;
  temp_dir t;
  auto m = readme_stand_in();
  const auto write = [&](const std::string& name, const std::string& io) {
    torchloom_test::write_triton_model(t / name, m, "name: \"" + name + "\"\n" + io);
    return strict_spec(t / name);
  };
  CHECK_TORCHLOOM_ERROR(
      readme_runner(write("out", R"(output [ { name: "RESULT[AAB]" data_type: TYPE_FP16 } ])")),
      errc::invalid_option, "model 'out'", "declares output 'RESULT[AAB]'",
      "its outputs are 'RESULT[AAA]', 'RESULT[ZZZ]'", "(or OUTPUT__0 to OUTPUT__7)",
      "did you mean 'RESULT[AAA]'");
  CHECK_TORCHLOOM_ERROR(
      readme_runner(write("ord", R"(output [ { name: "OUTPUT__8" data_type: TYPE_FP16 } ])")),
      errc::invalid_option, "declares output 'OUTPUT__8'");
  // Triton's names only: a position or a NAME__i suffix is not enough under torch_aoti.
  CHECK_TORCHLOOM_ERROR(
      readme_runner(write("pos", R"(output [ { name: "sum__0" data_type: TYPE_FP16 } ])")),
      errc::invalid_option, "declares output 'sum__0'");
  CHECK_TORCHLOOM_ERROR(
      readme_runner(write("in", R"(input [ { name: "ARGS[3]" data_type: TYPE_FP16 } ])")),
      errc::invalid_option, "declares input 'ARGS[3]'", "its inputs are 'ARGS[0]'",
      "(or INPUT__0 to INPUT__5)");
  CHECK_TORCHLOOM_ERROR(
      readme_runner(write("in6", R"(input [ { name: "INPUT__6" data_type: TYPE_FP16 } ])")),
      errc::invalid_option, "declares input 'INPUT__6'");
  // A subset of the outputs, in any order, ordinal and forward-based mixed: fine.
  readme_runner subset(write("subset", R"(output [
  { name: "RESULT[DDD][KB]" data_type: TYPE_FP16 },
  { name: "OUTPUT__0" data_type: TYPE_FP16 } ])"));
  std::vector<c10::IValue> in;
  for (int i = 0; i < 6; ++i) in.emplace_back(torch::full({2}, i + 1.0));
  std::map<std::string, c10::IValue> named;
  for (std::size_t i = 0; i < 6; ++i) named["INPUT__" + std::to_string(i)] = in[i];
  const auto out = subset.run_named(named);
  CHECK(torch::equal(out.at("OUTPUT__0").toTensor(), torch::full({2}, 3.0)));
  CHECK(torch::equal(out.at("RESULT[DDD][KB]").toTensor(), torch::full({2}, 4.0)));
  CHECK(out.count("RESULT[ZZZ]") == 1);  // the others under their forward-based names
  CHECK(out.count("RESULT[AAA]") == 0);
}

TEST_CASE("forward-based names: torchloom's own configs may still go by position",
          "[triton][runner][names]") {
  using readme_runner = torchloom::model_runner<readme_loader>;
  temp_dir t;
  auto m = readme_stand_in();
  // No platform line (torchloom_export.py's configs): output0.. by position, as before.
  std::string outputs = "output [\n";
  for (int i = 0; i < 8; ++i) {
    outputs += std::string(i ? ",\n" : "") + "  { name: \"output" + std::to_string(i) +
               "\" data_type: TYPE_FP32 }";
  }
  torchloom_test::write_triton_model(t / "own", m, "backend: \"torchloom\"\n" + outputs + "\n]\n");
  readme_runner own(model_spec::from_directory(t / "own"));
  std::map<std::string, c10::IValue> named;
  for (int i = 0; i < 6; ++i) named[readme_inputs[i]] = torch::full({1}, i + 1.0);
  const auto out = own.run_named(named);
  CHECK(torch::equal(out.at("output1").toTensor(), torch::full({1}, -1.0)));  // ZZZ: 1 - 2
  CHECK(own.output_index("RESULT[ZZZ]") == 1u);
  CHECK(own.output_index("output1") == 1u);
  // But a forward-based name the package lacks never falls back to a position.
  torchloom_test::write_triton_model(
      t / "bad", m, "backend: \"torchloom\"\noutput [ { name: \"RESULT[nope]\" } ]\n");
  CHECK_TORCHLOOM_ERROR(readme_runner(model_spec::from_directory(t / "bad")),
                        errc::invalid_option, "declares output 'RESULT[nope]'");
  // Without a config: each output under its forward-based name.
  torchloom_test::write_triton_model(t / "bare", m);
  readme_runner bare(model_spec::from_directory(t / "bare"));
  const auto plain = bare.run_named(named);
  REQUIRE(plain.size() == 8);
  for (const auto& n : readme_outputs) CHECK(plain.count(n) == 1);
}

TEST_CASE("forward-based names: a value torch fixed at export is not an input", "[triton][names]") {
  using gpt2_runner = torchloom::model_runner<gpt2_loader>;
  temp_dir t;
  auto m = torchloom_test::make_linear();
  torchloom_test::write_triton_model(t / "m", m);
  gpt2_runner r(model_spec::from_directory(t / "m"));
  CHECK(r.names().inputs == std::vector<std::string>{"KWARGS[input_ids]"});
  const auto x = torch::rand({2, 8});
  CHECK(r.run_named({{"KWARGS[input_ids]", x}}).count("RESULT[logits]") == 1);
  CHECK_TORCHLOOM_ERROR(r.run_named({{"KWARGS[input_ids]", x}, {"KWARGS[use_cache]", x}}),
                        errc::bad_input, "no input is called 'KWARGS[use_cache]'",
                        "fixed when the model was exported");
  torchloom_test::write_triton_model(t / "c", m, R"(
input [ { name: "KWARGS[use_cache]" data_type: TYPE_BOOL dims: [ 1 ] } ]
)");
  CHECK_TORCHLOOM_ERROR(gpt2_runner(model_spec::from_directory(t / "c")), errc::invalid_option,
                        "declares input 'KWARGS[use_cache]'", "fixed when the model was exported");
}

TEST_CASE("config corpus: Triton's torch_aoti configs keep their names", "[triton][spec]") {
  const fs::path corpus = fs::path(TORCHLOOM_TEST_DATA_DIR) / "configs";
  const auto c =
      torchloom::parse_triton_config(read_text(corpus / "36_torch_aoti_forward_names.pbtxt"));
  CHECK(c.platform == "torch_aoti");
  CHECK(c.backend == "pytorch");
  CHECK(c.platform_line == 11);
  REQUIRE(c.inputs.size() == 6);
  CHECK(c.inputs[2].name == "ARGS[2][keyA]");
  CHECK(c.inputs[5].name == "KWARGS[kw_arg2]");
  REQUIRE(c.outputs.size() == 8);
  CHECK(c.outputs[1].name == "RESULT[BBB][0]");
  CHECK(c.outputs[7].name == "RESULT[ZZZ]");
  const auto o =
      torchloom::parse_triton_config(read_text(corpus / "37_torch_aoti_ordinal_names.pbtxt"));
  CHECK(o.inputs[0].name == "INPUT__0");
  CHECK(o.outputs[0].name == "OUTPUT__0");
  CHECK(o.max_batch_size == 8);
}
