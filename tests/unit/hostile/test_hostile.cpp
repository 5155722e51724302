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

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <torchloom/torchloom.hpp>

#include "../../support/fixtures.hpp"
#include "../../support/model_archive.hpp"

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
        const auto err = torchloom_test::capture_error(
            [&] { runner r(model_spec::from_directory(t / "three")); });
        INFO(err.what());
        CHECK(err.code() == errc::load_failed);
        CHECK(torchloom_test::contains(err.what(), "model 'three'"));
        CHECK(torchloom_test::contains(err.what(), file.string()));
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
