// Corrupted-model test: writes truncated and mutated model.pt files through torch's own
// archive writer (so the zip container and its checksums stay valid and the mutations reach
// torch's unpickler and torchloom's checks), and loads and runs each in a child process with
// a timeout. A file may load or be refused with a torchloom::error; a signal, a hang, any
// other exception or a peak resident memory over the limit in the child is a failure, and
// its file is kept as a reproducer.
//
// torchloom_corrupt_models [FIRST_SEED] [COUNT] [--keep DIR] [--timeout SECONDS] [--jobs N]
//                          [--max-rss MIB] [--bases DIR | --save-bases DIR] [--device DEV]
//                          [--list]
//   Each seed picks one base model and one mutation; the same seed always gives the same
//   file. --jobs: children at once (1); --max-rss: the memory limit (1024 MiB); --bases: read
//   the two base archives from DIR (tests/data/corrupt holds them), so that another torch
//   mutates the same archives; --save-bases: write the ones made here to DIR; --device: load
//   and run there (cpu); --list: every seed's outcome (and on stderr each refusal's message).
//   Exit status 0: no crash, hang, escaped exception or memory over the limit.
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
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

enum class outcome { ran, refused, escaped, crashed, hung, bloated };
constexpr const char* outcome_names[] = {"ran", "refused", "escaped", "crashed", "hung", "bloated"};

// One mutant loading in a child process.
struct child {
  pid_t pid = -1;
  std::uint64_t seed = 0;
  std::string what;  // the mutation
  fs::path file;     // the mutant, kept until the child is reaped
  std::chrono::steady_clock::time_point deadline;
};

// Loads and runs the model directory `dir` in a child process. The child exits 0 when it
// ran, 10 + the errc value when torchloom refused it, 2 when anything else escaped.
pid_t start_child(const fs::path& dir, const c10::Device device, bool verbose) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(0);
    try {
      torchloom::model_runner<torchloom::torchscript_loader> r(
          torchloom::model_spec::from_directory(dir), device);
      (void)r.run({torch::randn({2, 8}, torch::TensorOptions().device(device))});
      ::_exit(0);
    } catch (const torchloom::error& e) {
      if (verbose) std::fprintf(stderr, "%s\n", e.what());
      ::_exit(10 + static_cast<int>(e.code()));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "escaped: %s\n", e.what());
      ::_exit(2);
    } catch (...) {
      ::_exit(2);
    }
  }
  return pid;
}

// What the exit `status` of a child says; `peak_mib` is its peak resident memory.
outcome judge(int status, long peak_mib, long max_rss_mib, std::string& detail) {
  if (WIFSIGNALED(status)) {
    detail = ::strsignal(WTERMSIG(status));
    return outcome::crashed;
  }
  if (peak_mib > max_rss_mib) {
    detail = std::to_string(peak_mib) + " MiB resident";
    return outcome::bloated;
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
  fs::path bases_dir;
  fs::path save_bases;
  int timeout_s = 60;
  int jobs = 1;
  long max_rss_mib = 1024;
  bool list = false;
  c10::Device device(c10::kCPU);
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--keep" && i + 1 < argc) {
      keep = argv[++i];
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout_s = std::stoi(argv[++i]);
    } else if (a == "--jobs" && i + 1 < argc) {
      jobs = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--max-rss" && i + 1 < argc) {
      max_rss_mib = std::stol(argv[++i]);
    } else if (a == "--bases" && i + 1 < argc) {
      bases_dir = argv[++i];
    } else if (a == "--save-bases" && i + 1 < argc) {
      save_bases = argv[++i];
    } else if (a == "--device" && i + 1 < argc) {
      device = c10::Device(argv[++i]);
    } else if (a == "--list") {
      list = true;
    } else if (a.rfind("--", 0) == 0) {
      std::cerr << "unknown option " << a << "; usage: torchloom_corrupt_models [FIRST_SEED] "
                << "[COUNT] [--keep DIR] [--timeout S] [--jobs N] [--max-rss MIB] "
                << "[--bases DIR | --save-bases DIR] [--device DEV] [--list]\n";
      return 2;
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
  // The base archives: made here with fixed weights (so that a seed names the same file on
  // every run), or read from --bases DIR (linear.pt, nested.pt, as --save-bases DIR wrote
  // them), so that another torch mutates the same archives.
  std::vector<records> bases;
  std::uint64_t version = 0;
  torch::manual_seed(0);
  const std::pair<const char*, torch::jit::Module> models[] = {{"linear.pt", make_linear()},
                                                               {"nested.pt", make_nested()}};
  for (const auto& [name, m] : models) {
    auto file = work / "base.pt";
    if (!bases_dir.empty()) {
      file = bases_dir / name;
      if (!fs::exists(file)) {
        std::cerr << "no base archive " << file.string() << " (--save-bases DIR writes them)\n";
        return 2;
      }
    } else {
      m.save(file.string());
      if (!save_bases.empty()) {
        fs::create_directories(save_bases);
        fs::copy_file(file, save_bases / name, fs::copy_options::overwrite_existing);
      }
    }
    bases.push_back(torchloom_test::read_archive(file));
    version = torchloom_test::archive_version(file);
  }

  std::map<std::string, int> tally;
  int failures = 0;
  long peak_mib = 0;
  std::uint64_t peak_seed = first;
  std::vector<child> running;
  std::vector<fs::path> free_dirs;
  for (int j = 0; j < jobs; ++j) {
    const auto dir = work / ("model" + std::to_string(j));
    fs::create_directories(dir / "1");
    free_dirs.push_back(dir);
  }
  // Reaps the children that ended (all of them with `all`), killing those past their time.
  const auto reap = [&](bool all) {
    while (!running.empty()) {
      bool reaped = false;
      for (auto it = running.begin(); it != running.end();) {
        int status = 0;
        struct rusage usage {};
        pid_t w = ::wait4(it->pid, &status, WNOHANG, &usage);
        const bool late = w == 0 && std::chrono::steady_clock::now() > it->deadline;
        if (late) {
          ::kill(it->pid, SIGKILL);
          w = ::wait4(it->pid, &status, 0, &usage);
        }
        if (w != it->pid) {
          ++it;
          continue;
        }
        const long mib = usage.ru_maxrss / 1024;
        if (mib > peak_mib) {
          peak_mib = mib;
          peak_seed = it->seed;
        }
        std::string detail;
        const auto result = late ? outcome::hung : judge(status, mib, max_rss_mib, detail);
        const char* name = outcome_names[static_cast<int>(result)];
        ++tally[result == outcome::refused ? "refused (" + detail + ")" : name];
        const bool failed = result != outcome::ran && result != outcome::refused;
        std::string line = "seed " + std::to_string(it->seed) + ": " + name +
                           (detail.empty() ? "" : " (" + detail + ")") + " after " + it->what;
        if (failed) {
          ++failures;
          fs::create_directories(keep);
          const auto kept = keep / ("seed-" + std::to_string(it->seed) + ".pt");
          fs::copy_file(it->file, kept, fs::copy_options::overwrite_existing);
          line += "; reproducer: " + kept.string();
        }
        if (failed || list) std::cout << line << std::endl;
        free_dirs.push_back(it->file.parent_path().parent_path());
        it = running.erase(it);
        reaped = true;
      }
      if (!all && reaped) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    std::mt19937_64 rng(seed);
    records recs = bases[seed % bases.size()];
    std::string what = mutate(recs, rng);
    if (rng() % 4 == 0) what += "; " + mutate(recs, rng);  // sometimes two at once
    if (free_dirs.empty()) reap(false);
    const auto dir = free_dirs.back();
    const auto file = dir / "1" / "model.pt";
    try {
      torchloom_test::write_archive(file, recs, version);
    } catch (const std::exception& e) {
      ++tally["not writable"];
      continue;
    }
    free_dirs.pop_back();
    child c{start_child(dir, device, list), seed, what, file,
            std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s)};
    if (c.pid < 0) {
      std::perror("fork");
      return 1;
    }
    running.push_back(std::move(c));
  }
  reap(true);
  ::nftw(
      work.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
  std::cout << "corrupt models: seeds " << first << ".." << first + count - 1 << ":";
  for (const auto& [k, v] : tally) std::cout << ' ' << k << '=' << v << ';';
  std::cout << " largest peak resident memory " << peak_mib << " MiB (seed " << peak_seed
            << ")\ncorrupt models: " << (failures == 0 ? "ok" : "FAILED") << " (" << failures
            << " crashed, hung, escaped or over " << max_rss_mib << " MiB)" << std::endl;
  return failures == 0 ? 0 : 1;
}
