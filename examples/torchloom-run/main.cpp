// torchloom-run: loads a model with the policies named on the command line, runs it on random
// inputs from one or more threads and prints its outputs, latency and weight memory (as text
// or JSON). A small, complete program to copy from; see README.md next to it.
#include "cli.hpp"
#include "text.hpp"

#include <torchloom/dtype.hpp>
#include <torchloom/error.hpp>
#include <torchloom/policy_choice.hpp>
#include <torchloom/version.hpp>

#include <torch/csrc/api/include/torch/version.h>

#if TORCHLOOM_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

#include <boost/mp11/algorithm.hpp>

#include <charconv>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace torchloom_run {

namespace tl = torchloom;

std::string dtype_names() {
  std::string out;
  for (const auto& [name, type] : tl::dtype_names) {
    out.append(out.empty() ? "" : ", ").append(name);
  }
  return out;
}

std::string torch_version() { return TORCH_VERSION; }

std::string cuda_version() {
#if TORCHLOOM_HAS_CUDA
  int runtime = 0;
  int driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  return cat("runtime ", runtime / 1000, '.', runtime % 1000 / 10, ", driver ",
                            driver / 1000, '.', driver % 1000 / 10);
#else
  return "none (this build has no torchloom::cuda)";
#endif
}

namespace {

template <class E>
std::string names_of() {
  return quoted_list(tl::policy_names<E>(), " or ");
}

void print_usage(std::ostream& out) {
  const std::string_view indent = "\n                        ";
  out << "usage: torchloom-run [MODEL] [--loader NAME] [--hook NAME] [--stream NAME]\n"
      << "                     [--residency NAME] [--device cpu|cuda:N] [--input SHAPE:DTYPE ...]\n"
      << "                     [--iterations N] [--warmup N] [--threads N] [--set KEY=VALUE ...]\n"
      << "                     [--json] [--version] [--help]\n\n"
      << "Loads MODEL with torchloom, runs it on random inputs, prints its outputs, latency and\n"
      << "weight memory. Every option also takes the form --name=value.\n\n"
      << "  MODEL                 a model file (.pt TorchScript, .pt2 AOTInductor package) or a"
      << indent << "Triton-layout model directory; default: the bundled model" << indent
      << TORCHLOOM_BUNDLED_MODEL_DIR << '\n'
      << "  --loader NAME         " << names_of<tl::loader_kind>()
      << " (default: the model's platform:" << indent
      << "torch_aoti or a .pt2 package: aoti; pytorch_libtorch: torchscript)\n"
      << "  --hook NAME           " << names_of<tl::hook_kind>()
      << " (default: none; dlopen loads MODEL_INIT_LIBRARY)\n"
      << "  --stream NAME         " << names_of<tl::stream_kind>() << " (default: caller)\n"
      << "  --residency NAME      " << names_of<tl::residency_kind>() << " (default: resident;"
      << indent << "streamed needs --set WEIGHT_OFFLOAD_BUDGET_MB=N)\n"
      << "  --device DEVICE       cpu or cuda:N (default: cpu)\n"
      << "  --input SHAPE:DTYPE   one per model input, in order, e.g. 8x64:float32; DTYPE is"
      << indent << dtype_names() << '.' << indent
      << "Default: made from the model's declared inputs (batch 8)\n"
      << "  --iterations N        timed runs per thread (default: 100)\n"
      << "  --warmup N            untimed runs before them (default: 1)\n"
      << "  --threads N           concurrent callers of the one runner (default: 1)\n"
      << "  --set KEY=VALUE       a runner option, e.g. INTRA_OP_THREAD_COUNT=4; repeatable\n"
      << "  --json                print the report as JSON on stdout\n"
      << "  --version             torchloom's, torch's and CUDA's versions\n"
      << "  --help                this text\n\n"
      << "Policy combinations in this build (loader/hook/stream/residency):";
  std::size_t n = 0;
  boost::mp11::mp_for_each<tl::available_choices>([&](auto c) {
    const tl::policy_choice p = tl::policy_choice_of<decltype(c)>();
    const std::string name =
        cat(tl::to_string(p.loader), '/', tl::to_string(p.hook), '/',
                           tl::to_string(p.stream), '/', tl::to_string(p.residency));
    if (n++ % 2 == 0) {
      out << "\n  " << std::left << std::setw(38) << name;
    } else {
      out << name;
    }
  });
  out << '\n';
  if (TORCHLOOM_TORCH_VERSION < 20600) out << "  (no aoti: it needs LibTorch >= 2.6)\n";
  if (!TORCHLOOM_HAS_CUDA) out << "  (no green: it needs CUDA, torchloom::cuda)\n";
}

template <class Int>
Int parse_int(std::string_view text, Int min, std::string_view what) {
  Int v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || v < min) {
    throw usage_error(
        cat(what, " must be an integer >= ", min, ", not '", text, "'"));
  }
  return v;
}

template <tl::policy_kind E>
E parse_kind(std::string_view text) {
  try {
    return tl::parse_policy<E>(text);
  } catch (const tl::error& e) {
    throw usage_error(e.message());
  }
}

cli_args parse_args(int argc, char** argv) {
  cli_args a;
  a.model = TORCHLOOM_BUNDLED_MODEL_DIR;
  bool have_model = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    // --name=value is --name value.
    std::optional<std::string_view> inline_value;
    if (const auto eq = arg.find('='); arg.starts_with("--") && eq != arg.npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw usage_error(cat(arg, " needs a value"));
      return argv[++i];
    };
    const auto flag = [&] {
      if (inline_value) throw usage_error(cat(arg, " takes no value"));
    };
    if (arg == "--help" || arg == "-h") {
      flag();
      a.help = true;
    } else if (arg == "--version") {
      flag();
      a.version = true;
    } else if (arg == "--json") {
      flag();
      a.json = true;
    } else if (arg == "--loader") {
      a.loader = parse_kind<tl::loader_kind>(value());
    } else if (arg == "--hook") {
      a.policies.hook = parse_kind<tl::hook_kind>(value());
    } else if (arg == "--stream") {
      a.policies.stream = parse_kind<tl::stream_kind>(value());
    } else if (arg == "--residency") {
      a.policies.residency = parse_kind<tl::residency_kind>(value());
    } else if (arg == "--device") {
      const std::string_view name = value();
      try {
        a.device = c10::Device(std::string(name));
      } catch (const std::exception&) {
        throw usage_error(cat("unknown device '", name, "'; use cpu or cuda:N"));
      }
    } else if (arg == "--input") {
      a.inputs.emplace_back(value());
    } else if (arg == "--iterations") {
      a.iterations = parse_int(value(), 1, arg);
    } else if (arg == "--warmup") {
      a.warmup = parse_int(value(), 0, arg);
    } else if (arg == "--threads") {
      a.threads = parse_int(value(), 1, arg);
    } else if (arg == "--set") {
      const std::string_view kv = value();
      const auto eq = kv.find('=');
      if (eq == std::string_view::npos) {
        throw usage_error(cat("--set needs KEY=VALUE, not '", kv, "'"));
      }
      a.options.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    } else if (arg.starts_with("-") || have_model) {
      throw usage_error(cat("unexpected argument '", argv[i], "'"));
    } else {
      a.model = arg;
      have_model = true;
    }
  }
  return a;
}

}  // namespace
}  // namespace torchloom_run

int main(int argc, char** argv) {
  using namespace torchloom_run;
  try {
    cli_args args = parse_args(argc, argv);
    if (args.help) {
      print_usage(std::cout);
      return 0;
    }
    if (args.version) {
      std::cout << "torchloom " << tl::version_string << "\ntorch " << torch_version()
                << "\nCUDA " << cuda_version() << '\n';
      return 0;
    }
    tl::model_spec spec = tl::model_spec::from_path(args.model);
    for (const auto& [key, value] : args.options) {
      try {
        spec.set(key, value);
      } catch (const tl::error& e) {
        std::cerr << e.what() << '\n';  // the library names the key and what it accepts
        return 2;
      }
    }
    // Without --loader, the model's platform (resolved as Triton's core resolves it) picks the
    // loader; with it, a runner of the other loader refuses the model, naming both.
    args.policies.loader = args.loader ? *args.loader : tl::loader_for(spec);
    const std::string name = spec.name;
    tl::with_runner_type(
        args.policies,
        [&](auto runner) {
          run_model<typename decltype(runner)::type>(args, std::move(spec));
        },
        name);
    return 0;
  } catch (const usage_error& e) {
    std::cerr << "torchloom-run: " << e.what() << "\n\n";
    print_usage(std::cerr);
    return 2;
  } catch (const model_error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  } catch (const tl::error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  } catch (const std::exception& e) {
    // torch itself (making inputs, synchronising) reports its errors as c10::Error.
    std::cerr << "torchloom-run: " << message_of(e) << '\n';
    return 1;
  }
}
