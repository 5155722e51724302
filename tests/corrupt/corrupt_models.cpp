// Corrupted-model test: writes truncated and mutated model.pt files through torch's own
// archive writer (so the zip container and its checksums stay valid and the mutations reach
// torch's unpickler and torchloom's checks), and loads and runs each in a child process with
// a timeout. A file may load or be refused with a torchloom::error; a signal, a hang or any
// other exception in the child is a failure, and its file is kept as a reproducer.
//
// torchloom_corrupt_models [FIRST_SEED] [COUNT] [--keep DIR] [--timeout SECONDS]
//   Each seed picks one base model and one mutation; the same seed always gives the same
//   file. Exit status 0: no crash, hang or escaped exception.
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <torchloom/torchloom.hpp>
#include <vector>

#include "../support/model_archive.hpp"

namespace {

namespace fs = std::filesystem;
using records = std::vector<std::pair<std::string, std::string>>;

// The base models: a linear layer; and a module with a submodule, a buffer, a tensor
// attribute, a list of tensors and an int attribute, which gives data.pkl more structure.
torch::jit::Module make_linear() {
  torch::jit::Module m("linear");
  m.register_parameter("w", torch::randn({4, 8}), false);
  m.register_parameter("b", torch::randn({4}), false);
  m.define(R"(
def forward(self, x):
    return torch.linear(x, self.w, self.b)
)");
  return m;
}

torch::jit::Module make_nested() {
  torch::jit::Module inner("inner");
  inner.register_parameter("w", torch::randn({8, 8}), false);
  inner.register_buffer("shift", torch::randn({8}));
  inner.define(R"(
def forward(self, x):
    return torch.relu(torch.matmul(x, self.w) + self.shift)
)");
  torch::jit::Module m("nested");
  m.register_module("inner", inner);
  m.register_attribute("scale", c10::TensorType::get(), torch::full({8}, 0.5F));
  m.register_attribute("extra", c10::ListType::ofTensors(),
                       c10::List<at::Tensor>({torch::ones({8}), torch::zeros({8})}));
  m.register_attribute("repeat", c10::IntType::get(), 2);
  m.define(R"(
def forward(self, x):
    y = x
    for _ in range(self.repeat):
        y = self.inner.forward(y) * self.scale
    return y + self.extra[0] - self.extra[1]
)");
  return m;
}

std::string describe(const std::string& name, const std::string& what) {
  return name + ": " + what;
}

// One mutation of one record, chosen by the seed.
std::string mutate(records& recs, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::size_t> pick(0, recs.size() - 1);
  // Prefer the records torch interprets: data.pkl, constants.pkl, the tensor data, code.
  std::size_t i = pick(rng);
  for (int tries = 0; tries < 4 && recs[i].first.find("data") == std::string::npos &&
                      recs[i].first.find("constants") == std::string::npos;
       ++tries) {
    i = pick(rng);
  }
  auto& [name, bytes] = recs[i];
  const auto size = bytes.size();
  const auto any_byte = [&] { return static_cast<char>(rng() & 0xff); };
  const auto at = [&] {
    return size == 0 ? std::size_t{0}
                     : std::uniform_int_distribution<std::size_t>(0, size - 1)(rng);
  };
  switch (rng() % 8) {
    case 0: {
      const auto n = size == 0 ? 0 : rng() % size;
      bytes.resize(n);
      return describe(name, "truncated to " + std::to_string(n) + " bytes");
    }
    case 1:
    case 2: {
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < flips && size > 0; ++k) bytes[at()] = any_byte();
      return describe(name, std::to_string(flips) + " bytes replaced");
    }
    case 3: {
      if (size > 0) bytes[at()] ^= static_cast<char>(1u << (rng() % 8));
      return describe(name, "one bit flipped");
    }
    case 4: {
      const auto n = 1 + rng() % 64;
      for (std::uint64_t k = 0; k < n; ++k)
        bytes.insert(bytes.begin() + static_cast<long>(at()), any_byte());
      return describe(name, std::to_string(n) + " bytes inserted");
    }
    case 5: {
      const auto from = at();
      const auto n = std::min<std::size_t>(size - std::min(size, from), 1 + rng() % 32);
      bytes.erase(from, n);
      return describe(name, std::to_string(n) + " bytes removed");
    }
    case 6: {
      const std::string removed = name;
      recs.erase(recs.begin() + static_cast<long>(i));
      return describe(removed, "record removed");
    }
    default: {
      // Small integers in the pickle (sizes, strides, offsets) are the most interesting.
      for (std::size_t k = 0; k + 1 < size; ++k) {
        // BININT1 (K) and BININT (J) opcodes
        if ((bytes[k] == 'K' || bytes[k] == 'J') && rng() % 4 == 0) {
          bytes[k + 1] = any_byte();
          return describe(name, "an integer operand at " + std::to_string(k) + " replaced");
        }
      }
      if (size > 0) bytes[at()] = any_byte();
      return describe(name, "one byte replaced");
    }
  }
}

enum class outcome { ran, refused, escaped, crashed, hung };

// Loads and runs `file` in a child process. The child exits 0 when it ran, 10 + the errc
// value when torchloom refused it, 2 when anything else escaped.
outcome try_in_child(const fs::path& dir, std::chrono::seconds timeout, std::string& detail) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(0);
    try {
      torchloom::model_runner<torchloom::torchscript_loader> r(
          torchloom::model_spec::from_directory(dir));
      (void)r.run({torch::randn({2, 8})});
      ::_exit(0);
    } catch (const torchloom::error& e) {
      ::_exit(10 + static_cast<int>(e.code()));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "escaped: %s\n", e.what());
      ::_exit(2);
    } catch (...) {
      ::_exit(2);
    }
  }
  if (pid < 0) {
    detail = "fork failed";
    return outcome::escaped;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return outcome::hung;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFSIGNALED(status)) {
    detail = ::strsignal(WTERMSIG(status));
    return outcome::crashed;
  }
  const int code = WEXITSTATUS(status);
  if (code == 0) return outcome::ran;
  if (code >= 10 && code < 30) {
    detail = std::string(torchloom::to_string(static_cast<torchloom::errc>(code - 10)));
    return outcome::refused;
  }
  detail = "exit status " + std::to_string(code);
  return outcome::escaped;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t first = 0;
  std::uint64_t count = 300;
  fs::path keep = "corrupt-models-findings";
  int timeout_s = 60;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--keep" && i + 1 < argc) {
      keep = argv[++i];
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout_s = std::stoi(argv[++i]);
    } else {
      positional.push_back(a);
    }
  }
  if (!positional.empty()) first = std::stoull(positional[0]);
  if (positional.size() > 1) count = std::stoull(positional[1]);

  std::string tmpl = (fs::temp_directory_path() / "torchloom-corrupt-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path work = tmpl;
  // Fixed weights, so that a seed names the same file on every run.
  torch::manual_seed(0);
  std::vector<records> bases;
  std::uint64_t version = 0;
  for (auto m : {make_linear(), make_nested()}) {
    const auto file = work / "base.pt";
    m.save(file.string());
    bases.push_back(torchloom_test::read_archive(file));
    version = torchloom_test::archive_version(file);
  }

  std::map<std::string, int> tally;
  int failures = 0;
  const auto model_dir = work / "model";
  fs::create_directories(model_dir / "1");
  const auto file = model_dir / "1" / "model.pt";
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    std::mt19937_64 rng(seed);
    records recs = bases[seed % bases.size()];
    std::string what = mutate(recs, rng);
    if (rng() % 4 == 0) what += "; " + mutate(recs, rng);  // sometimes two at once
    try {
      torchloom_test::write_archive(file, recs, version);
    } catch (const std::exception& e) {
      ++tally["not writable"];
      continue;
    }
    std::string detail;
    const auto result = try_in_child(model_dir, std::chrono::seconds(timeout_s), detail);
    const char* names[] = {"ran", "refused", "escaped", "crashed", "hung"};
    const char* name = names[static_cast<int>(result)];
    ++tally[result == outcome::refused ? "refused (" + detail + ")" : name];
    if (result == outcome::escaped || result == outcome::crashed || result == outcome::hung) {
      ++failures;
      fs::create_directories(keep);
      const auto kept = keep / ("seed-" + std::to_string(seed) + ".pt");
      fs::copy_file(file, kept, fs::copy_options::overwrite_existing);
      std::cout << "seed " << seed << ": " << name << (detail.empty() ? "" : " (" + detail + ")")
                << " after " << what << "; reproducer: " << kept.string() << std::endl;
    }
  }
  ::nftw(
      work.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
  std::cout << "corrupt models: seeds " << first << ".." << first + count - 1 << ":";
  for (const auto& [k, v] : tally) std::cout << ' ' << k << '=' << v << ';';
  std::cout << "\ncorrupt models: " << (failures == 0 ? "ok" : "FAILED") << " (" << failures
            << " crashed, hung or escaped)" << std::endl;
  return failures == 0 ? 0 : 1;
}
