// Model spec: model files and Triton-layout directories, and the errors for bad ones.
#include "../../support/fixtures.hpp"

#include <torchloom/loader/torchscript.hpp>
#include <torchloom/model_runner.hpp>
#include <torchloom/model_spec.hpp>

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::temp_dir;

namespace {
using runner = torchloom::model_runner<torchloom::torchscript_loader>;
}

TEST_CASE("a missing model file names the path", "[spec]") {
  temp_dir t;
  CHECK_TORCHLOOM_ERROR(model_spec::from_file(t / "nope.pt"), errc::model_not_found,
                        (t / "nope.pt").string(), "does not exist");
  CHECK_TORCHLOOM_ERROR(model_spec::from_path(t / "nope.pt"), errc::model_not_found, "nope.pt");
}

TEST_CASE("a model file: its name and directory", "[spec]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  m.save((t / "ranker.pt").string());
  const auto s = model_spec::from_file(t / "ranker.pt");
  CHECK(s.name == "ranker");
  CHECK(s.directory == t.path());
  CHECK(s.model_file("model.pt") == t / "ranker.pt");
  CHECK_FALSE(s.config.has_value());
}

TEST_CASE("missing and empty model directories name the path", "[spec]") {
  temp_dir t;
  CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "absent"), errc::model_not_found,
                        (t / "absent").string(), "does not exist");
  std::filesystem::create_directories(t / "empty");
  CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "empty"), errc::model_not_found,
                        "model 'empty'", "no version directory", (t / "empty").string());
  // Non-numeric directories are not versions.
  std::filesystem::create_directories(t / "empty" / "weights");
  CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "empty"), errc::model_not_found,
                        "no version directory");
}

TEST_CASE("the highest version is picked numerically, or the one asked for", "[spec]") {
  temp_dir t;
  for (const char* v : {"1", "2", "10", "9"}) std::filesystem::create_directories(t / "m" / v);
  const auto s = model_spec::from_directory(t / "m");
  REQUIRE(s.version.has_value());
  CHECK(*s.version == 10);
  CHECK(s.model_file("model.pt") == t / "m" / "10" / "model.pt");
  CHECK(*model_spec::from_directory(t / "m", 2).version == 2);
  CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m", 3), errc::model_not_found,
                        "version 3 not found");
}

TEST_CASE("a version directory without the model file names the file", "[spec]") {
  temp_dir t;
  std::filesystem::create_directories(t / "m" / "1");
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::model_not_found,
                        (t / "m" / "1" / "model.pt").string());
}

TEST_CASE("a corrupt model file fails to load and names the path", "[spec]") {
  temp_dir t;
  torchloom_test::write_file(t / "m" / "1" / "model.pt", "this is not a zip archive");
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                        "model 'm'", (t / "m" / "1" / "model.pt").string());
}

TEST_CASE("config.pbtxt: name, parameters as options, default_model_filename", "[spec]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  std::filesystem::create_directories(t / "dir" / "3");
  m.save((t / "dir" / "3" / "weights.pt").string());
  torchloom_test::write_file(t / "dir" / "config.pbtxt", R"(
name: "ranker"
default_model_filename: "weights.pt"
parameters: { key: "INFERENCE_MODE" value: { string_value: "off" } }
parameters: { key: "WARMUP_ITERATIONS" value: { string_value: "2" } }
)");
  const auto s = model_spec::from_directory(t / "dir");
  CHECK(s.name == "ranker");
  CHECK_FALSE(s.options.inference_mode);
  CHECK(s.options.warmup_iterations == 2);
  CHECK(s.model_file("model.pt") == t / "dir" / "3" / "weights.pt");
}

TEST_CASE("a bad parameter in config.pbtxt names the file, the key and the value", "[spec]") {
  temp_dir t;
  std::filesystem::create_directories(t / "m" / "1");
  torchloom_test::write_file(t / "m" / "config.pbtxt", R"(
parameters: { key: "ENABLE_JIT_PROFILNG" value: { string_value: "true" } }
)");
  CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option, "model 'm'",
                        "config.pbtxt", "ENABLE_JIT_PROFILNG", "did you mean 'ENABLE_JIT_PROFILING'");
  torchloom_test::write_file(t / "m" / "config.pbtxt", R"(
parameters: { key: "WARMUP_ITERATIONS" value: { string_value: "many" } }
)");
  CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                        "WARMUP_ITERATIONS", "'many'", "an integer");
  torchloom_test::write_file(t / "m" / "config.pbtxt", "name: \"m\"\nmax_batch_size: {\n");
  CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                        (t / "m" / "config.pbtxt").string() + ":");
}

TEST_CASE("parameters the application reserves are kept as text, not parsed as options",
          "[spec]") {
  temp_dir t;
  std::filesystem::create_directories(t / "m" / "1");
  torchloom_test::write_file(t / "m" / "config.pbtxt", R"(
parameters: { key: "SERVING_POLICY" value: { string_value: "pool" } }
parameters: { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "2" } }
)");
  // Without reserving it, the key is unknown.
  CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                        "SERVING_POLICY");
  const auto s = model_spec::from_directory(t / "m", std::nullopt, {"SERVING_POLICY"});
  REQUIRE(s.host_parameters.count("SERVING_POLICY") == 1);
  CHECK(s.host_parameters.at("SERVING_POLICY") == "pool");
  CHECK(s.host_parameters.count("INTRA_OP_THREAD_COUNT") == 0);
  CHECK(s.options.intra_op_thread_count == 2);
}

TEST_CASE("set() overrides the config's options and checks keys", "[spec]") {
  temp_dir t;
  std::filesystem::create_directories(t / "m" / "1");
  auto s = model_spec::from_directory(t / "m");
  s.set("INFERENCE_MODE", "false").set({{"INTRA_OP_THREAD_COUNT", "2"}});
  CHECK_FALSE(s.options.inference_mode);
  CHECK(*s.options.intra_op_thread_count == 2);
  CHECK_TORCHLOOM_ERROR(s.set("BOGUS", "1"), errc::invalid_option, "model 'm'", "BOGUS");
}
