// Model spec: model files and Triton-layout directories, and the errors for bad ones.
#include "../../support/fixtures.hpp"
#include "../../support/model_archive.hpp"
#include "../../support/zip_writer.hpp"

#include <torchloom/loader/aoti.hpp>
#include <torchloom/loader/torchscript.hpp>
#include <torchloom/model_format.hpp>
#include <torchloom/model_runner.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/policy_choice.hpp>

#include <cstdint>
#include <string>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::temp_dir;

namespace {
namespace fs = std::filesystem;
using runner = torchloom::model_runner<torchloom::torchscript_loader>;

using torchloom_test::make_zip;
using torchloom_test::zip_record;

const std::vector<zip_record> package_records = {
    {"pkg/archive_format", "pt2"}, {"pkg/data/aotinductor/model/m.wrapper.so", "\x7f" "ELF"}};
}  // namespace

TEST_CASE("model format: told from the archive's entries, not the file's name", "[spec]") {
  using torchloom::model_format;
  using torchloom::read_model_format;
  temp_dir t;
  auto m = torchloom_test::make_linear();
  m.save((t / "script.pt2").string());
  CHECK(read_model_format(t / "script.pt2") == model_format::torchscript);
  torchloom_test::write_package_layout(t / "package.pt");
  CHECK(read_model_format(t / "package.pt") == model_format::aoti);
  // Hand-made archives: ZIP64 records, a comment, a compressed archive_format.
  torchloom_test::write_file(t / "zip64.pt2", make_zip(package_records, true));
  CHECK(read_model_format(t / "zip64.pt2") == model_format::aoti);
  torchloom_test::write_file(t / "comment.pt2", make_zip(package_records, false, "a comment"));
  CHECK(read_model_format(t / "comment.pt2") == model_format::aoti);
  auto compressed = package_records;
  compressed[0].method = 8;
  compressed[0].data = "\x01\x02";
  torchloom_test::write_file(t / "compressed.pt2", make_zip(compressed, false));
  CHECK(read_model_format(t / "compressed.pt2") == model_format::aoti);
  // archive_format must read pt2; the markers must share a root.
  auto other_format = package_records;
  other_format[0].data = "pt3";
  torchloom_test::write_file(t / "pt3.pt2", make_zip(other_format, false));
  CHECK(read_model_format(t / "pt3.pt2") == model_format::unknown);
  torchloom_test::write_file(
      t / "split.pt2",
      make_zip({{"a/archive_format", "pt2"}, {"b/data/aotinductor/x", ""}}, false));
  CHECK(read_model_format(t / "split.pt2") == model_format::unknown);
  torchloom_test::write_file(
      t / "code_only.pt", make_zip({{"m/data.pkl", "x"}, {"m/constants.pkl", "x"}}, true));
  CHECK(read_model_format(t / "code_only.pt") == model_format::unknown);
  // Not archives, damaged ones, and what is not a file.
  torchloom_test::write_file(t / "text.pt", "not a zip archive");
  CHECK(read_model_format(t / "text.pt") == model_format::unknown);
  const std::string whole = make_zip(package_records, false);
  torchloom_test::write_file(t / "cut.pt2", whole.substr(0, whole.size() - 10));
  CHECK(read_model_format(t / "cut.pt2") == model_format::unknown);
  std::string bad_directory = whole;
  bad_directory[whole.size() - 6] = '\x7f';  // the directory's offset points elsewhere
  torchloom_test::write_file(t / "bad.pt2", bad_directory);
  CHECK(read_model_format(t / "bad.pt2") == model_format::unknown);
  torchloom_test::write_file(t / "empty.pt2", "");
  CHECK(read_model_format(t / "empty.pt2") == model_format::unknown);
  CHECK(read_model_format(t / "absent.pt2") == model_format::unknown);
  CHECK(read_model_format(t.path()) == model_format::unknown);
  CHECK(read_model_format("/dev/zero") == model_format::unknown);
}

TEST_CASE("a model file's platform is its content's, else what a .pt2 name says", "[spec]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  m.save((t / "script.pt2").string());
  torchloom_test::write_package_layout(t / "package.bin");
  torchloom_test::write_file(t / "garbage.pt2", "x");
  torchloom_test::write_file(t / "garbage.pt", "x");
  const auto script = model_spec::from_file(t / "script.pt2");
  CHECK(script.platform.name == "pytorch_libtorch");
  CHECK(torchloom::loader_for(script) == torchloom::loader_kind::torchscript);
  CHECK(torchloom_test::contains(script.platform.reason, "a TorchScript archive"));
  const auto package = model_spec::from_file(t / "package.bin");
  CHECK(package.platform.name == "torch_aoti");
  CHECK(torchloom::loader_for(package) == torchloom::loader_kind::aoti);
  CHECK(model_spec::from_file(t / "garbage.pt2").platform.name == "torch_aoti");
  CHECK(model_spec::from_file(t / "garbage.pt").platform.name.empty());
  CHECK(torchloom::loader_for(model_spec::from_file(t / "garbage.pt")) ==
        torchloom::loader_kind::torchscript);
  // A spec made by hand is resolved when asked.
  model_spec by_hand;
  by_hand.file = t / "package.bin";
  CHECK(torchloom::loader_for(by_hand) == torchloom::loader_kind::aoti);
  model_spec in_directory;
  std::filesystem::create_directories(t / "v");
  torchloom_test::write_package_layout(t / "v" / "model.pt2");
  in_directory.version_directory = t / "v";
  CHECK(torchloom::loader_for(in_directory) == torchloom::loader_kind::aoti);
}

TEST_CASE("a runner refuses a model of the other platform, naming both and the fix", "[spec]") {
  temp_dir t;
  fs::create_directories(t / "pkg" / "1");
  torchloom_test::write_package_layout(t / "pkg" / "1" / "model.pt2");
  torchloom_test::write_file(t / "pkg" / "config.pbtxt",
                             "name: \"pkg\"\nbackend: \"pytorch\"\nplatform: \"torch_aoti\"\n");
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "pkg")), errc::invalid_option,
                        "model 'pkg'", (t / "pkg" / "config.pbtxt").string() + ":3:",
                        "platform 'torch_aoti' calls for an AOTInductor package",
                        "this runner's loader reads a TorchScript archive (platform "
                        "'pytorch_libtorch')",
                        "use model_runner<aoti_loader, ...>", "torchloom::loader_for(spec)");
  // The file alone: its content decides.
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_file(t / "pkg" / "1" / "model.pt2")),
                        errc::invalid_option, "the file 'model.pt2', an AOTInductor package",
                        "use model_runner<aoti_loader, ...>");
#if TORCHLOOM_TORCH_VERSION >= 20600
  auto m = torchloom_test::make_linear();
  torchloom_test::write_triton_model(t / "script", m, "platform: \"libtorch\"\n");
  CHECK_TORCHLOOM_ERROR(
      torchloom::model_runner<torchloom::aoti_loader>(model_spec::from_directory(t / "script")),
      errc::invalid_option, ":1: platform 'libtorch' calls for a TorchScript archive",
      "this runner's loader reads an AOTInductor package", "use model_runner<torchscript_loader");
#endif
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
