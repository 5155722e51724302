// Hostile and broken inputs to the runner: a model.pt whose tensor records are short,
// declared shapes too large to synthesise, a None where the model takes an int, the
// process-wide settings a failed construction claimed, symlinks out of the model directory,
// files nobody may read, and bytes in a message that are not UTF-8.
#include <ATen/Parallel.h>
#include <grp.h>
#include <iconv.h>
#include <sys/wait.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>
#include <torchloom/torchloom.hpp>

#include "../../support/fixtures.hpp"
#include "../../support/model_archive.hpp"
#include "../../support/zip_writer.hpp"

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::temp_dir;
namespace fs = std::filesystem;

namespace {

using runner = torchloom::model_runner<torchloom::torchscript_loader>;

// A model with a parameter, a buffer and a tensor attribute that is neither.
torch::jit::Module make_three_tensor_model() {
  torch::jit::Module m("three");
  m.register_parameter("w", torch::randn({4, 8}), false);
  m.register_buffer("shift", torch::randn({4}));
  m.register_attribute("scale", c10::TensorType::get(), torch::full({4}, 2.0F));
  m.define(R"(
def forward(self, x):
    return (torch.linear(x, self.w) + self.shift) * self.scale
)");
  return m;
}

// Whether glibc's iconv decodes all of `text` as UTF-8: a judge of well-formed UTF-8 that is
// not torchloom's own.
bool iconv_reads_as_utf8(const std::string& text) {
  const iconv_t cd = ::iconv_open("UTF-32LE", "UTF-8");
  REQUIRE(cd != reinterpret_cast<iconv_t>(-1));
  std::string in = text;
  std::string out(4 * in.size() + 4, '\0');
  char* in_ptr = in.data();
  char* out_ptr = out.data();
  std::size_t in_left = in.size();
  std::size_t out_left = out.size();
  const std::size_t rc = ::iconv(cd, &in_ptr, &in_left, &out_ptr, &out_left);
  ::iconv_close(cd);
  return rc != static_cast<std::size_t>(-1) && in_left == 0;
}

struct failing_init_hook {
  static int init(const torchloom::model_context&) { throw std::runtime_error("init refused"); }
  static void fini(int) noexcept {}
};

}  // namespace

TEST_CASE("A model.pt whose tensor record is shorter than its tensor fails at load",
          "[hostile][runner]") {
  temp_dir t;
  auto m = make_three_tensor_model();
  torchloom_test::write_triton_model(t / "three", m);
  const auto file = t / "three" / "1" / "model.pt";
  const auto good = t / "good.pt";
  std::filesystem::rename(file, good);

  std::vector<std::string> data_records;
  for (const auto& [name, bytes] : torchloom_test::read_archive(good)) {
    if (name.rfind("data/", 0) == 0) data_records.push_back(name);
  }
  REQUIRE(data_records.size() == 3);  // w, shift, scale
  for (const auto& victim : data_records) {
    for (const std::size_t cut : {4, 0}) {
      DYNAMIC_SECTION("record " << victim << " cut to " << cut << " bytes") {
        torchloom_test::rewrite_archive(good, file, [&](const std::string& name, std::string& b) {
          if (name == victim) b.resize(cut);
          return true;
        });
        // Before torch reads it: the storage data.pkl declares against its record.
        auto err = torchloom_test::capture_error(
            [&] { runner r(model_spec::from_directory(t / "three")); });
        INFO(err.what());
        CHECK(err.code() == errc::load_failed);
        CHECK(torchloom_test::contains(err.what(), "model 'three'"));
        CHECK(torchloom_test::contains(err.what(), file.string()));
        CHECK(torchloom_test::contains(err.what(), "' holds " + std::to_string(cut) + " bytes"));
        const bool names_its_tensor = torchloom_test::contains(err.what(), "(tensor 'w')") ||
                                      torchloom_test::contains(err.what(), "(tensor 'shift')") ||
                                      torchloom_test::contains(err.what(), "(tensor 'scale')");
        CHECK(names_its_tensor);
        // After torch read it, where the check before could not see (a pickle opcode a later
        // torch reads): each tensor against the bytes its record delivered.
        const auto reader = std::make_shared<torchloom::detail::recording_reader>(file.string());
        const auto loaded = torch::jit::load(reader);
        err = torchloom_test::capture_error([&] {
          torchloom::detail::check_module_storages("three", file.string(), loaded, *reader);
        });
        INFO(err.what());
        CHECK(err.code() == errc::load_failed);
        CHECK(torchloom_test::contains(err.what(), "model 'three'"));
        CHECK(
            torchloom_test::contains(err.what(), "its record holds " + std::to_string(cut) + ";"));
        const bool names_tensor = torchloom_test::contains(err.what(), "w (") ||
                                  torchloom_test::contains(err.what(), "shift (") ||
                                  torchloom_test::contains(err.what(), "scale (");
        CHECK(names_tensor);
      }
    }
  }
  SECTION("the untouched copy loads and runs") {
    torchloom_test::rewrite_archive(good, file,
                                    [](const std::string&, std::string&) { return true; });
    runner r(model_spec::from_directory(t / "three"));
    const auto x = torch::randn({2, 8});
    const auto w = m.attr("w").toTensor();
    const auto expected =
        (torch::linear(x, w) + m.attr("shift").toTensor()) * m.attr("scale").toTensor();
    CHECK(torch::allclose(r.run({x})[0], expected));
  }
}

TEST_CASE("The recording reader's error is a torchloom::error", "[hostile][runner]") {
  temp_dir t;
  CHECK_TORCHLOOM_ERROR(torchloom::detail::recording_reader((t / "missing.pt").string()),
                        errc::load_failed, "cannot open it: No such file or directory");
}

TEST_CASE("WARMUP_ITERATIONS with declared dims too large to make is invalid_option",
          "[hostile][runner]") {
  temp_dir t;
  auto m = torchloom_test::make_linear(8, 4);
  torchloom_test::write_triton_model(t / "huge", m, R"(
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2147483648, 2147483648 ] } ]
parameters: { key: "WARMUP_ITERATIONS" value: { string_value: "1" } }
)");
  CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "huge")), errc::invalid_option,
                        "model 'huge'", "WARMUP_ITERATIONS=1", "input 'x'",
                        "[2147483648, 2147483648]");
}

TEST_CASE("None for an int argument is bad_input naming it", "[hostile][runner]") {
  temp_dir t;
  torch::jit::Module m("scaled");
  m.define(R"(
def forward(self, x, n: int, k: Optional[int] = None):
    return x * n
)");
  torchloom_test::write_triton_model(t / "scaled", m);
  runner r(model_spec::from_directory(t / "scaled"));
  CHECK_TORCHLOOM_ERROR(r.run({torch::ones({2}), c10::IValue()}), errc::bad_input, "model 'scaled'",
                        "'n'", "int");
  // Where the schema says Optional, None is fine; and the runner is still usable.
  CHECK(r.run({torch::ones({2}), c10::IValue(3), c10::IValue()})[0].equal(torch::full({2}, 3.0F)));
}

TEST_CASE("A failed construction leaves the process-wide settings as it found them",
          "[hostile][runner]") {
  temp_dir t;
  const int threads_before = at::get_num_threads();
  const int threads_other = threads_before == 1 ? 2 : 1;
  const bool profiling_before = torch::jit::getProfilingMode();
  const bool executor_before = torch::jit::getExecutorMode();
  const std::string params =
      "parameters: { key: \"INTRA_OP_THREAD_COUNT\" value: { string_value: \"" +
      std::to_string(threads_other) + "\" } }\n" +
      "parameters: { key: \"ENABLE_JIT_PROFILING\" value: { string_value: \"" +
      (profiling_before ? "false" : "true") + "\" } }\n" +
      "parameters: { key: \"ENABLE_JIT_EXECUTOR\" value: { string_value: \"" +
      (executor_before ? "false" : "true") + "\" } }\n";
  auto m = torchloom_test::make_linear(8, 4);

  SECTION("the model fails to load") {
    torchloom_test::write_triton_model(t / "broken", m, params);
    torchloom_test::write_file(t / "broken" / "1" / "model.pt", "not a TorchScript archive");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "broken")), errc::load_failed,
                          "model 'broken'");
  }
  SECTION("the hook fails") {
    torchloom_test::write_triton_model(t / "hooked", m, params);
    using hooked = torchloom::model_runner<torchloom::torchscript_loader,
                                           torchloom::static_hook<failing_init_hook>>;
    CHECK_TORCHLOOM_ERROR(hooked(model_spec::from_directory(t / "hooked")), errc::hook_failed,
                          "init refused");
  }
  SECTION("warm-up fails") {
    torchloom_test::write_triton_model(
        t / "warm", m,
        params +
            "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
            "parameters: { key: \"WARMUP_ITERATIONS\" value: { string_value: \"1\" } }\n");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "warm")), errc::run_failed,
                          "model 'warm'");
  }
  SECTION("a runner that loaded and is gone gives them back too") {
    torchloom_test::write_triton_model(t / "fine", m, params);
    {
      runner r(model_spec::from_directory(t / "fine"));
      CHECK(at::get_num_threads() == threads_other);
      CHECK(torch::jit::getProfilingMode() != profiling_before);
    }
  }
  CHECK(at::get_num_threads() == threads_before);
  CHECK(torch::jit::getProfilingMode() == profiling_before);
  CHECK(torch::jit::getExecutorMode() == executor_before);
  torch::jit::getProfilingMode() = profiling_before;
  torch::jit::getExecutorMode() = executor_before;
  at::set_num_threads(threads_before);
}

TEST_CASE("Nothing is read from outside the model directory through a symlink",
          "[hostile][spec]") {
  temp_dir t;
  auto m = torchloom_test::make_linear(8, 4);
  torchloom_test::write_triton_model(t / "elsewhere", m, "name: \"elsewhere\"");
  torchloom_test::write_triton_model(t / "m", m);
  const auto outside = t / "elsewhere";

  SECTION("config.pbtxt") {
    fs::create_symlink(outside / "config.pbtxt", t / "m" / "config.pbtxt");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                          "model 'm'", (t / "m" / "config.pbtxt").string(),
                          "resolves outside the model directory");
  }
  SECTION("the model file") {
    fs::remove(t / "m" / "1" / "model.pt");
    fs::create_symlink(outside / "1" / "model.pt", t / "m" / "1" / "model.pt");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "model 'm'", (t / "m" / "1" / "model.pt").string(),
                          "resolves outside the model directory");
  }
  SECTION("default_model_filename through a symlinked directory") {
    fs::create_symlink(outside / "1", t / "m" / "1" / "sub");
    torchloom_test::write_file(t / "m" / "config.pbtxt", "default_model_filename: \"sub/model.pt\"");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "model 'm'", "sub/model.pt", "resolves outside the model directory");
  }
  SECTION("a version directory") {
    fs::create_directory_symlink(outside / "1", t / "m" / "2");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m"), errc::invalid_option,
                          "model 'm'", "version 2 directory", (t / "m" / "2").string(),
                          "resolves outside the model directory");
    CHECK_TORCHLOOM_ERROR(model_spec::from_directory(t / "m", 2), errc::invalid_option,
                          "resolves outside the model directory");
    CHECK(model_spec::from_directory(t / "m", 1).version == 1);
  }
  SECTION("warm-up data") {
    torchloom_test::write_file(outside / "x.bin", std::string(2 * 8 * sizeof(float), '\0'));
    fs::create_directories(t / "m" / "warmup");
    fs::create_symlink(outside / "x.bin", t / "m" / "warmup" / "x.bin");
    torchloom_test::write_file(t / "m" / "config.pbtxt", R"(
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 8 ] } ]
model_warmup [ { name: "w" batch_size: 0 inputs { key: "x" value: {
  data_type: TYPE_FP32 dims: [ 2, 8 ] input_data_file: "x.bin" } } } ]
)");
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::invalid_option,
                          "model 'm'", "input_data_file", "resolves outside the model directory");
  }
  SECTION("symlinks that stay inside, and a model directory reached through one, load") {
    fs::create_directories(t / "m" / "store");
    fs::rename(t / "m" / "1" / "model.pt", t / "m" / "store" / "model.pt");
    fs::create_symlink(fs::path("..") / "store" / "model.pt", t / "m" / "1" / "model.pt");
    torchloom_test::write_file(t / "m" / "store" / "config.pbtxt", "name: \"linked\"");
    fs::create_symlink("store/config.pbtxt", t / "m" / "config.pbtxt");
    fs::create_directory_symlink(t / "m", t / "mount");
    for (const auto& dir : {t / "m", t / "mount"}) {
      runner r(model_spec::from_directory(dir));
      CHECK(r.name() == "linked");
      CHECK(r.run({torch::ones({2, 8})})[0].sizes() == torch::IntArrayRef{2, 4});
    }
  }
  SECTION("a model file given on its own may be a symlink: the caller chose it") {
    fs::create_symlink(outside / "1" / "model.pt", t / "single.pt");
    runner r(model_spec::from_file(t / "single.pt"));
    CHECK(r.run({torch::ones({1, 8})})[0].sizes() == torch::IntArrayRef{1, 4});
  }
}

namespace {

// The checks of "permission denied": a config.pbtxt and a model file nobody may read are
// refused with the system's reason, and the same files readable load (so that a refusal is
// not for another reason). Returns what went wrong, or an empty string.
std::string permission_denied_failures(const std::filesystem::path& root) {
  std::string failures;
  const auto expect = [&](const std::string& what, auto&& f, errc code,
                          const std::string& text) {
    try {
      f();
      failures += what + ": nothing thrown; ";
    } catch (const torchloom::error& e) {
      if (e.code() != code || !torchloom_test::contains(e.what(), text)) {
        failures += what + ": " + e.what() + "; ";
      }
    } catch (const std::exception& e) {
      failures += what + ": not a torchloom::error: " + e.what() + "; ";
    }
  };
  try {
    runner r(model_spec::from_directory(root / "readable"));
  } catch (const std::exception& e) {
    failures += std::string("the readable model does not load: ") + e.what() + "; ";
  }
  expect("config.pbtxt of mode 000", [&] { (void)model_spec::from_directory(root / "config"); },
         errc::invalid_option, "config.pbtxt': Permission denied");
  expect("model.pt of mode 000", [&] { runner r(model_spec::from_directory(root / "model")); },
         errc::load_failed, "model.pt' cannot be read: Permission denied");
  return failures;
}

}  // namespace

TEST_CASE("Permission denied is reported as such, also when the tests run as root",
          "[hostile][triton]") {
  temp_dir t;
  auto m = torchloom_test::make_linear();
  for (const char* name : {"readable", "config", "model"}) {
    torchloom_test::write_triton_model(t / name, m, "max_batch_size: 0");
  }
  // Readable for everyone but the two files under test: as root the checks run as nobody.
  fs::permissions(t.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  for (const auto& e : fs::recursive_directory_iterator(t.path())) {
    fs::permissions(e.path(), e.is_directory() ? fs::perms(0755) : fs::perms(0644));
  }
  fs::permissions(t / "config" / "config.pbtxt", fs::perms::none);
  fs::permissions(t / "model" / "1" / "model.pt", fs::perms::none);

  std::string failures;
  if (::geteuid() != 0) {
    failures = permission_denied_failures(t.path());
  } else {
    // Root reads everything: the checks run in a child that gives up root for nobody
    // (65534) and reports back through a pipe.
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::close(fds[0]);
      ::alarm(120);  // a hang in the child fails the test instead of stalling it
      std::string out;
      if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0 ||
          ::geteuid() == 0) {
        out = std::string("cannot drop root: ") + std::strerror(errno);
      } else {
        out = permission_denied_failures(t.path());
      }
      const ssize_t written = ::write(fds[1], out.data(), out.size());
      ::_exit(written == static_cast<ssize_t>(out.size()) ? 0 : 2);
    }
    ::close(fds[1]);
    char buffer[4096];
    for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) failures.append(buffer, n);
    ::close(fds[0]);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    INFO("child status " << status);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("An error message is one line of valid UTF-8: bytes that are not UTF-8 are escaped "
          "like control characters",
          "[hostile]") {
  // The judge itself: it refuses what the escaping must catch.
  for (const char* bad : {"\xff", "\xc3(", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80",
                          "\xe2\x82"}) {
    CHECK_FALSE(iconv_reads_as_utf8(bad));
  }
  const torchloom::error e(errc::load_failed, "m\xff",
                           "lone \xc3( euro \xe2\x82\xac surrogate \xed\xa0\x80 overlong "
                           "\xc0\xaf above \xf4\x90\x80\x80 line\xe2\x80\xa8sep nel\xc2\x85 "
                           "tab\t cut \xe2\x82");
  CHECK(std::string(e.what()) ==
        "torchloom: model 'm\\xff': lone \\xc3( euro \xe2\x82\xac surrogate \\xed\\xa0\\x80 "
        "overlong \\xc0\\xaf above \\xf4\\x90\\x80\\x80 line\\u2028sep nel\\u0085 tab\\t cut "
        "\\xe2\\x82 [load_failed]");
  CHECK(e.model() == "m\\xff");
  CHECK(iconv_reads_as_utf8(e.what()));
  // Escaped text escapes to itself: a message built from another's is not escaped twice.
  CHECK(torchloom::detail::escape_controls(e.message()) == e.message());

  // printable() cuts before a UTF-8 sequence, never inside one.
  const std::string long_value = std::string(199, 'a') + "\xc3\xa9\xc3\xa9";
  const std::string cut = torchloom::detail::printable(long_value, 200);
  CHECK(cut == std::string(199, 'a') + "... (203 characters)");
  CHECK(iconv_reads_as_utf8(cut));

  // From a real path: a Latin-1 directory name in a model_not_found error.
  temp_dir t;
  const auto err = torchloom_test::capture_error(
      [&] { (void)model_spec::from_directory(t / "caf\xe9"); });
  INFO(err.what());
  CHECK(err.code() == errc::model_not_found);
  CHECK(torchloom_test::contains(err.what(), "caf\\xe9"));
  CHECK(iconv_reads_as_utf8(err.what()));
}

// ---------------------------------------------------------------------------------------
// The archive checked before torch reads it: records, pickles, storages.

namespace {

using torchloom_test::zip_record;

// A module whose data.pkl holds what torch's pickler writes: a submodule, a view at an
// offset into a storage another attribute shares, a dict, a tuple, lists, an optional, half
// and int tensors.
torch::jit::Module make_rich_model() {
  torch::jit::Module inner("inner");
  inner.register_parameter("w", torch::randn({8, 8}), false);
  inner.define("def forward(self, x):\n    return torch.matmul(x, self.w)\n");
  torch::jit::Module m("rich");
  m.register_module("inner", inner);
  const auto base = torch::randn({16});
  m.register_attribute("base", c10::TensorType::get(), base);
  m.register_buffer("view", base.narrow(0, 4, 8));
  c10::Dict<std::string, at::Tensor> table;
  table.insert("a", torch::ones({2, 2}));
  table.insert("b", torch::arange(6, torch::kLong).reshape({2, 3}).t());
  m.register_attribute(
      "table", c10::DictType::create(c10::StringType::get(), c10::TensorType::get()), table);
  m.register_attribute("sizes", c10::ListType::ofInts(), c10::List<int64_t>({1, 2, 3}));
  m.register_attribute("scales", c10::ListType::ofFloats(), c10::List<double>({0.5, 2.0}));
  m.register_attribute(
      "pair",
      c10::TupleType::create({c10::IntType::get(), c10::StringType::get(), c10::FloatType::get(),
                              c10::BoolType::get()}),
      c10::ivalue::Tuple::create({c10::IValue(7), c10::IValue(std::string("seven")),
                                  c10::IValue(7.5), c10::IValue(true)}));
  m.register_attribute("maybe", c10::OptionalType::create(c10::TensorType::get()), c10::IValue());
  m.register_attribute("half", c10::TensorType::get(), torch::ones({3}, torch::kHalf));
  m.define(R"(
def forward(self, x):
    return self.inner.forward(x) + self.view + self.table["a"].sum() + self.half.float().sum()
)");
  return m;
}

// The archive `file`'s records by name (each with its root), in the archive's order.
std::vector<std::pair<std::string, std::string>> records_with_root(const fs::path& file,
                                                                   const std::string& root) {
  auto records = torchloom_test::read_archive(file);
  for (auto& [name, bytes] : records) name = root + "/" + name;
  return records;
}

// A Triton model directory `dir` whose model.pt is the zip archive `bytes`.
void write_zip_model(const fs::path& dir, const std::string& bytes) {
  fs::create_directories(dir / "1");
  torchloom_test::write_file(dir / "1" / "model.pt", bytes);
}

// Replaces, in the pickle `pkl`, the size of the storage `key` (the integer just before the
// TUPLE and BINPERSID that end its persistent id) with the BININT `numel`.
void forge_storage_size(std::string& pkl, const std::string& key, std::int32_t numel) {
  const std::string key_op =
      std::string("X") + static_cast<char>(key.size()) + std::string(3, '\0') + key;
  const auto at = pkl.find(key_op);
  REQUIRE(at != std::string::npos);
  const auto end = pkl.find("tQ", at);
  REQUIRE(end != std::string::npos);
  std::size_t op = end;
  if (pkl[end - 2] == 'K') {
    op = end - 2;
  } else if (pkl[end - 3] == 'M') {
    op = end - 3;
  } else if (pkl[end - 5] == 'J') {
    op = end - 5;
  }
  REQUIRE(op != end);
  std::string forged = "J";
  torchloom_test::put_le(forged, static_cast<std::uint32_t>(numel), 4);
  pkl.replace(op, end - op, forged);
}

// A hand-made persistent id of storage '0' (Float, `numel_op` elements) and the tensor
// _rebuild_tensor_v2 makes of it: one dimension of `size_op` elements, stride 1, offset 0.
std::string pickled_tensor(const std::string& numel_op, const std::string& size_op) {
  using namespace std::string_literals;
  return "ctorch._utils\n_rebuild_tensor_v2\n("s +
         "(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"s + "0" +
         "X\x03\x00\x00\x00"s + "cpu" + numel_op + "tQ" + "K\x00"s + size_op +
         "\x85K\x01\x85\x89NtR";
}

// The root of the archive `file` ("model/" for model.pt).
std::string archive_root(const fs::path& file) {
  const auto entries = torchloom::detail::read_zip_directory(file);
  REQUIRE(entries);
  REQUIRE(!entries->empty());
  return entries->front().name.substr(0, entries->front().name.find('/') + 1);
}

}  // namespace

TEST_CASE("scan_pickle: what torch writes passes and declares torch's storages", "[hostile]") {
  temp_dir t;
  auto m = make_rich_model();
  m.save((t / "rich.pt").string());
  std::vector<std::uint64_t> declared;
  int pickles = 0;
  for (const auto& [name, bytes] : torchloom_test::read_archive(t / "rich.pt")) {
    const bool is_pickle = name == "data.pkl" || name == "constants.pkl" ||
                           name.find(".debug_pkl") != std::string::npos;
    if (!is_pickle) continue;
    ++pickles;
    const auto scan = torchloom::detail::scan_pickle(bytes);
    INFO(name << ": " << scan.problem);
    CHECK(scan.problem.empty());
    CHECK(scan.complete);
    if (name == "data.pkl") {
      for (const auto& s : scan.storages) declared.push_back(s.numel * s.item_size);
    }
  }
  CHECK(pickles >= 3);
  // torch's own reading of the archive: each storage once, with its size in bytes.
  std::vector<std::uint64_t> loaded;
  std::unordered_set<const void*> seen;
  const auto loaded_module = torch::jit::load((t / "rich.pt").string());
  const auto add = [&](const at::Tensor& x) {
    if (seen.insert(x.storage().data()).second) loaded.push_back(x.storage().nbytes());
  };
  for (const auto& a : loaded_module.named_attributes(/*recurse=*/true)) {
    if (a.value.isTensor()) add(a.value.toTensor());
    if (a.value.isGenericDict()) {
      for (const auto& kv : a.value.toGenericDict()) add(kv.value().toTensor());
    }
  }
  std::sort(declared.begin(), declared.end());
  std::sort(loaded.begin(), loaded.end());
  CHECK(declared == loaded);
  CHECK(declared.size() == 5);  // inner.w, base (and the view on it), a, b, half
}

TEST_CASE("scan_pickle: each malformed shape is named with its byte", "[hostile]") {
  using namespace std::string_literals;
  using torchloom::detail::scan_pickle;
  const std::string proto = "\x80\x02";
  SECTION("well formed: a tensor within its storage") {
    const auto scan = scan_pickle(proto + pickled_tensor("K\x04", "K\x04") + ".");
    INFO(scan.problem);
    CHECK(scan.problem.empty());
    CHECK(scan.complete);
    REQUIRE(scan.storages.size() == 1);
    CHECK(scan.storages[0].key == "0");
    CHECK(scan.storages[0].type == "Float");
    CHECK(scan.storages[0].item_size == 4);
    CHECK(scan.storages[0].numel == 4);
  }
  SECTION("an opcode torch does not read stops the scan without a verdict") {
    const auto scan = scan_pickle(proto + "N\xff");
    CHECK(scan.problem.empty());
    CHECK_FALSE(scan.complete);
  }
  const std::string persid_head = "(X\x07\x00\x00\x00storage"s;
  const std::string key_location = "X\x01\x00\x00\x00"s + "0" + "X\x03\x00\x00\x00"s + "cpu";
  const std::pair<std::string, std::string> cases[] = {
      {"", "at byte 0: it does not start with PROTO"},
      {"\x80\x03.", "protocol 3; torch reads protocol 2"},
      {proto, "at byte 2: the pickle ends without its STOP opcode"},
      {proto + ")R.", "at byte 3: REDUCE needs 2 values on the stack and finds 1"},
      {proto + "\x86.", "at byte 2: TUPLE1, 2 or 3 needs 2 values on the stack and finds 0"},
      {proto + "t.", "TUPLE finds no MARK"},
      {proto + "(K\x01" + "d.", "DICT finds a key without a value"},
      {proto + "(e.", "APPENDS finds no list below its MARK"},
      {proto + "N(R.", "REDUCE needs 2 values on the stack and finds 0"},
      {proto + "X\xff\xff\xff\x7f" + "abc.",
       "BINUNICODE declares a string of 2147483647 bytes where 4 are left"},
      {proto + "Nr\x00\x00\x00\x40."s, "memo index 1073741824 after only 2 opcodes"},
      {proto + "h\x05.", "BINGET of memo index 5, which is not set"},
      {proto + "N).", "STOP leaves 2 values"},
      {proto + "\x8a\x04\x00\x00\x00\x00."s, "LONG1 of 4 bytes; torch reads 8"},
      {proto + "K\x01K\x02R.", "REDUCE or BUILD of something that no GLOBAL named"},
      {proto + ")" + std::string(1001, '\x85') + ".", "values nest more than 1000 deep"},
      {proto + persid_head + "K\x06" + key_location + "K\x04tQ.",
       "BINPERSID's storage type is not torch.<Type>Storage"},
      {proto + persid_head + "ctorch\nFloatStorage\n" + key_location + "J\xff\xff\xff\xfftQ.",
       "storage '0' declares -1 elements"},
      {proto + pickled_tensor("K\x04", "K\x08") + ".",
       "a tensor of shape [8] at offset 0 needs 8 elements of storage '0', which declares 4"},
      {proto + "cmodule\nname", "GLOBAL's name has no end of line"},
  };
  for (const auto& [bytes, expected] : cases) {
    const auto scan = scan_pickle(bytes);
    INFO("expected: " << expected);
    CHECK(torchloom_test::contains(scan.problem, expected));
    CHECK(scan.storages.empty());
  }
}

TEST_CASE(
    "A storage that data.pkl declares larger than its record is refused before torch "
    "reads it",
    "[hostile][runner]") {
  temp_dir t;
  auto m = make_three_tensor_model();
  torchloom_test::write_triton_model(t / "three", m);
  const auto file = t / "three" / "1" / "model.pt";
  const auto good = t / "good.pt";
  fs::rename(file, good);
  std::uint64_t record_size = 0;
  for (const auto& [name, bytes] : torchloom_test::read_archive(good)) {
    if (name == "data/0") record_size = bytes.size();
  }
  REQUIRE(record_size > 0);
  // 2^30 floats: 4 GiB that torch would take the record for, in a file of a few KiB.
  for (const std::int32_t numel :
       {std::int32_t{1} << 30, static_cast<std::int32_t>(record_size / 4 + 1)}) {
    DYNAMIC_SECTION("storage '0' declares " << numel << " elements") {
      torchloom_test::rewrite_archive(good, file, [&](const std::string& name, std::string& b) {
        if (name == "data.pkl") forge_storage_size(b, "0", numel);
        return true;
      });
      const std::uint64_t bytes = static_cast<std::uint64_t>(numel) * 4;
      const std::string root = archive_root(file);
      CHECK_TORCHLOOM_ERROR(
          runner(model_spec::from_directory(t / "three")), errc::load_failed, "model 'three'",
          file.string(), "storage '0' of '" + root + "data.pkl' (tensor 'w')",
          "declares " + std::to_string(numel) + " Float elements (" + std::to_string(bytes) +
              " bytes",
          "but its record '" + root + "data/0' holds " + std::to_string(record_size) + " bytes");
      const auto err =
          torchloom_test::capture_error([&] { runner r(model_spec::from_directory(t / "three")); });
      CHECK(torchloom_test::contains(err.what(), "more than the whole file's") ==
            (bytes > fs::file_size(file)));
    }
  }
}

TEST_CASE("A malformed pickle is refused before torch's unpickler reads it", "[hostile][runner]") {
  temp_dir t;
  auto m = make_three_tensor_model();
  torchloom_test::write_triton_model(t / "three", m);
  const auto file = t / "three" / "1" / "model.pt";
  const auto good = t / "good.pt";
  fs::rename(file, good);
  struct edit {
    std::string record;
    std::function<void(std::string&)> change;
    std::string expected;
  };
  const edit edits[] = {
      // what crashed torch 1.13: a REDUCE and a TUPLE2 on a too short stack
      {"constants.pkl", [](std::string& b) { b = "\x80\x02)R"; },
       "constants.pkl' is malformed at byte 3: REDUCE needs 2 values"},
      {"constants.pkl", [](std::string& b) { b = "\x80\x02\x86."; },
       "constants.pkl' is malformed at byte 2: TUPLE1, 2 or 3 needs 2 values"},
      // what made torch 1.13 allocate gigabytes: a string's length forged
      {"data.pkl",
       [](std::string& b) {
         const auto at = b.find('X');
         REQUIRE(at != std::string::npos);
         b.replace(at + 1, 4, std::string("\x00\x00\x00\xf0", 4));
       },
       "data.pkl' is malformed at byte "},
      // the code's debug information, which torch reads when a run fails
      {"code/__torch__.py.debug_pkl", [](std::string& b) { b.resize(b.size() / 2); },
       "code/__torch__.py.debug_pkl' is malformed at byte "},
  };
  for (const auto& e : edits) {
    DYNAMIC_SECTION(e.record << ": " << e.expected) {
      bool found = false;
      torchloom_test::rewrite_archive(good, file, [&](const std::string& name, std::string& b) {
        if (name == e.record) {
          e.change(b);
          found = true;
        }
        return true;
      });
      REQUIRE(found);
      CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "three")), errc::load_failed,
                            "model 'three'", file.string(), "'" + archive_root(file) + e.expected,
                            "the file is corrupt or was altered");
    }
  }
}

TEST_CASE(
    "An archive re-packed stored or deflated loads and runs; a record past the "
    "inflation cap or ratio, or whose sizes disagree, is refused before torch reads it",
    "[hostile][runner]") {
  temp_dir t;
  auto m = make_three_tensor_model();
  // Zeros compress about 160 times (torchloom_test::deflate_runs): 512 KiB is within the
  // allowance, 2 MiB is past the ratio.
  m.register_buffer("small_zeros", torch::zeros({128 * 1024}));
  m.save((t / "saved.pt").string());
  const auto records = records_with_root(t / "saved.pt", "model");
  const auto x = torch::randn({2, 8});
  const auto expected = m.forward({x}).toTensor();
  const auto file = t / "m" / "1" / "model.pt";
  const auto repack = [&](auto&& make) {
    std::vector<zip_record> out;
    for (const auto& [name, bytes] : records) out.push_back(make(name, bytes));
    return out;
  };

  SECTION("stored, as a zip tool with -0 writes it") {
    write_zip_model(t / "m", torchloom_test::make_zip(repack(torchloom_test::stored)));
    runner r(model_spec::from_directory(t / "m"));
    CHECK(torch::allclose(r.run({x})[0], expected));
  }
  SECTION("stored, with a record outside the archive's root, which torch does not read") {
    auto zip = repack(torchloom_test::stored);
    zip.push_back(torchloom_test::stored("z", "elsewhere"));
    write_zip_model(t / "m", torchloom_test::make_zip(zip));
    runner r(model_spec::from_directory(t / "m"));
    CHECK(torch::allclose(r.run({x})[0], expected));
  }
  SECTION("deflated, the pickles too") {
    write_zip_model(t / "m", torchloom_test::make_zip(repack(torchloom_test::deflated)));
    runner r(model_spec::from_directory(t / "m"));
    CHECK(torch::allclose(r.run({x})[0], expected));
  }
  SECTION("a record that inflates more than 100 times its size past the allowance") {
    auto big = records;
    big.emplace_back("model/extra/zeros", std::string(2 << 20, '\0'));
    std::vector<zip_record> zip;
    for (const auto& [name, bytes] : big) zip.push_back(torchloom_test::deflated(name, bytes));
    REQUIRE(zip.back().data.size() * 100 < (2u << 20));
    write_zip_model(t / "m", torchloom_test::make_zip(zip));
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "model 'm'", file.string(), "record 'model/extra/zeros' inflates ",
                          "to 2097152, more than 100 times its compressed size",
                          "store the archive uncompressed");
  }
  SECTION("a record that declares more than the cap") {
    auto zip = repack(torchloom_test::deflated);
    zip.front().size = torchloom::max_inflated_record_bytes + 1;
    write_zip_model(t / "m", torchloom_test::make_zip(zip));
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "model 'm'", file.string(), "record '" + zip.front().name + "'",
                          "declares 1073741825 bytes inflated, over the cap of 1073741824");
  }
  SECTION("a stored record that declares more than it holds") {
    auto zip = repack(torchloom_test::stored);
    zip[1].size = zip[1].data.size() + 4;
    write_zip_model(t / "m", torchloom_test::make_zip(zip));
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "model 'm'", file.string(), "record '" + zip[1].name + "'",
                          "is stored uncompressed but declares " +
                              std::to_string(zip[1].data.size() + 4) + " bytes and holds " +
                              std::to_string(zip[1].data.size()));
  }
  SECTION("a local header that disagrees with the directory") {
    auto zip = repack(torchloom_test::deflated);
    zip[1].local_size = *zip[1].size + 1;
    write_zip_model(t / "m", torchloom_test::make_zip(zip));
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "model 'm'", file.string(), "record '" + zip[1].name + "'",
                          "in its local header but " + std::to_string(*zip[1].size));
  }
  SECTION("a record twice") {
    auto zip = repack(torchloom_test::stored);
    zip.push_back(zip[1]);
    write_zip_model(t / "m", torchloom_test::make_zip(zip));
    CHECK_TORCHLOOM_ERROR(runner(model_spec::from_directory(t / "m")), errc::load_failed,
                          "record '" + zip[1].name + "' appears twice");
  }
}
