// torchloom-run: loads a model with the policies named on the command line, runs it on random
// inputs from one or more threads and prints its outputs, latency and weight memory (as text
// or JSON). A small, complete program to copy from; see README.md next to it.
#include "cli.hpp"
#include "text.hpp"

#include <torchloom/detail/strings.hpp>
#include <torchloom/dtype.hpp>
#include <torchloom/error.hpp>
#include <torchloom/options.hpp>
#include <torchloom/policy_choice.hpp>
#include <torchloom/version.hpp>

#include <torch/csrc/api/include/torch/version.h>

#if TORCHLOOM_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

#include <boost/describe/enumerators.hpp>
#include <boost/mp11/algorithm.hpp>

#include <charconv>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

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
      << "Exit status: 0 the model ran; 1 torchloom, torch or this program refused the model,\n"
      << "its options or its inputs (one line on stderr); 2 the command line is wrong (one line\n"
      << "on stderr, then a pointer to --help). With --json an error is also a JSON object on\n"
      << "stdout: {\"error\": {\"code\", \"model\", \"message\", \"exit_status\"}}.\n\n"
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
    throw usage_error(cat(what, " must be an integer >= ", min, ", not '",
                          tl::detail::printable(text, 64), "'"));
  }
  return v;
}

// A policy's name; a wrong one is a usage error with the library's "did you mean".
template <tl::policy_kind E>
E parse_kind(std::string_view flag, std::string_view text) {
  try {
    return tl::parse_policy<E>(text);
  } catch (const tl::error& e) {
    throw usage_error(cat(flag, ": ", e.message()));
  }
}

// Every flag, for "did you mean" on an unknown one.
const std::vector<std::string>& flag_names() {
  static const std::vector<std::string> names{
      "--loader", "--hook",    "--stream", "--residency", "--device",  "--input", "--iterations",
      "--warmup", "--threads", "--set",    "--json",      "--version", "--help"};
  return names;
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
      a.loader = parse_kind<tl::loader_kind>(arg, value());
    } else if (arg == "--hook") {
      a.policies.hook = parse_kind<tl::hook_kind>(arg, value());
    } else if (arg == "--stream") {
      a.policies.stream = parse_kind<tl::stream_kind>(arg, value());
    } else if (arg == "--residency") {
      a.policies.residency = parse_kind<tl::residency_kind>(arg, value());
    } else if (arg == "--device") {
      const std::string_view name = value();
      try {
        a.device = c10::Device(std::string(name));
      } catch (const std::exception&) {
        throw usage_error(
            cat("unknown device '", tl::detail::printable(name, 64), "'; use cpu or cuda:N"));
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
        throw usage_error(cat("--set needs KEY=VALUE, not '", tl::detail::printable(kv, 64), "'"));
      }
      a.options.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    } else if (arg.starts_with("-")) {
      throw usage_error(cat("unknown option '", tl::detail::printable(arg, 64), "'",
                            tl::detail::did_you_mean(arg, flag_names())));
    } else if (have_model) {
      throw usage_error(cat("unexpected argument '", tl::detail::printable(argv[i], 64),
                            "': the model is '", tl::detail::printable(a.model, 64),
                            "' already"));
    } else {
      a.model = arg;
      have_model = true;
    }
  }
  return a;
}

// The policy type a policy kind names: loader_type_of, hook_type_of, ... by the kind's enum.
template <auto K>
struct policy_type_of;
template <tl::loader_kind K>
struct policy_type_of<K> : tl::loader_type_of<K> {};
template <tl::hook_kind K>
struct policy_type_of<K> : tl::hook_type_of<K> {};
template <tl::stream_kind K>
struct policy_type_of<K> : tl::stream_type_of<K> {};
template <tl::residency_kind K>
struct policy_type_of<K> : tl::residency_type_of<K> {};

// The default choice with `K` in its role: whether this build has that policy at all.
template <auto K>
constexpr tl::policy_choice choice_with() {
  tl::policy_choice c;
  using E = decltype(K);
  if constexpr (std::is_same_v<E, tl::loader_kind>) c.loader = K;
  if constexpr (std::is_same_v<E, tl::hook_kind>) c.hook = K;
  if constexpr (std::is_same_v<E, tl::stream_kind>) c.stream = K;
  if constexpr (std::is_same_v<E, tl::residency_kind>) c.residency = K;
  return c;
}

// For each policy of role E that this build has and that reads option `key`: f(kind).
template <tl::policy_kind E, class F>
void for_each_reader(std::string_view key, F&& f) {
  boost::mp11::mp_for_each<boost::describe::describe_enumerators<E>>([&](auto d) {
    constexpr E kind = decltype(d)::value;
    if constexpr (tl::is_available(choice_with<kind>())) {
      if (tl::detail::reads_option<typename policy_type_of<kind>::type>(key)) f(kind);
    }
  });
}

// An option that only a policy the chosen runner lacks reads (MODEL_INIT_LIBRARY without
// --hook dlopen) fails as the runner would fail it, and says which flag adds that policy, or
// that none does (graphed<Stream>'s keys; aoti_loader's in a build without it).
void check_policy_options(const tl::model_spec& spec, const tl::policy_choice& chosen) {
  const tl::runner_options defaults{};
  for (const auto& [key, readers] : tl::policy_option_readers()) {
    const std::string value = tl::get_option(spec.options, key);
    if (value == tl::get_option(defaults, key)) continue;
    bool read = false;
    std::vector<std::string> flags;
    const auto consider = [&](auto kind, auto mine) {
      read = read || kind == mine;
      flags.push_back(cat("--", tl::role_name<decltype(kind)>(), ' ', tl::to_string(kind)));
    };
    for_each_reader<tl::loader_kind>(key, [&](auto k) { consider(k, chosen.loader); });
    for_each_reader<tl::hook_kind>(key, [&](auto k) { consider(k, chosen.hook); });
    for_each_reader<tl::stream_kind>(key, [&](auto k) { consider(k, chosen.stream); });
    for_each_reader<tl::residency_kind>(key, [&](auto k) { consider(k, chosen.residency); });
    if (read) continue;
    std::string add = flags.empty() ? "no flag of torchloom-run adds it in this build" : "add ";
    for (std::size_t i = 0; i < flags.size(); ++i) {
      add += (i == 0 ? "" : i + 1 == flags.size() ? " or " : ", ") + flags[i];
    }
    throw tl::error(tl::errc::invalid_option, spec.name,
                    cat("option ", key, "='", tl::detail::printable(value, 64),
                        "' is read only by ", readers, ", which the runner chosen (",
                        tl::to_string(chosen), ") does not have: ", add));
  }
}

// Whether the command line asks for JSON: then an error is also a JSON object on stdout.
bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--json") return true;
  }
  return false;
}

// Reports an error: one line on stderr and, with --json, a JSON object on stdout. Returns
// the exit status.
int report(bool json, exit_status status, std::string_view code, std::string_view model,
           std::string_view message, std::string_view line) {
  std::cerr << line << '\n';
  if (json) {
    std::cout << "{\"error\": {\"code\": " << json_string(code)
              << ", \"model\": " << (model.empty() ? std::string("null") : json_string(model))
              << ", \"message\": " << json_string(message)
              << ", \"exit_status\": " << static_cast<int>(status) << "}}\n";
  }
  return status;
}

}  // namespace
}  // namespace torchloom_run

int main(int argc, char** argv) {
  using namespace torchloom_run;
  const bool json = wants_json(argc, argv);
  try {
    cli_args args = parse_args(argc, argv);
    if (args.help) {
      print_usage(std::cout);
      return exit_ok;
    }
    if (args.version) {
      std::cout << "torchloom " << tl::version_string << "\ntorch " << torch_version()
                << "\nCUDA " << cuda_version() << '\n';
      return exit_ok;
    }
    tl::model_spec spec = tl::model_spec::from_path(args.model);
    // A key or value torchloom refuses is a torchloom::error like one from config.pbtxt.
    for (const auto& [key, value] : args.options) spec.set(key, value);
    // Without --loader, the model's platform (resolved as Triton's core resolves it) picks the
    // loader; with it, a runner of the other loader refuses the model, naming both.
    args.policies.loader = args.loader ? *args.loader : tl::loader_for(spec);
    if (tl::is_available(args.policies)) check_policy_options(spec, args.policies);
    const std::string name = spec.name;
    tl::with_runner_type(
        args.policies,
        [&](auto runner) {
          run_model<typename decltype(runner)::type>(args, std::move(spec));
        },
        name);
    return exit_ok;
  } catch (const usage_error& e) {
    const std::string message = tl::detail::escape_controls(e.what());
    return report(json, exit_usage, "usage", {}, message,
                  cat("torchloom-run: ", message, "\nsee 'torchloom-run --help'"));
  } catch (const model_error& e) {
    const std::string model = tl::detail::escape_controls(e.model);
    const std::string message = tl::detail::escape_controls(e.what());
    return report(json, exit_model, "model_error", model, message,
                  cat("torchloom-run: model '", model, "': ", message));
  } catch (const tl::error& e) {
    return report(json, exit_model, tl::to_string(e.code()), e.model(), e.message(), e.what());
  } catch (const std::exception& e) {
    // torch itself (making inputs, synchronising) reports its errors as c10::Error.
    const std::string message = tl::detail::escape_controls(message_of(e));
    return report(json, exit_model, "error", {}, message, cat("torchloom-run: ", message));
  }
}
