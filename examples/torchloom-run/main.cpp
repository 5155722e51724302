// torchloom-run: loads a model with torchloom, runs it on random inputs and prints its outputs
// and latency. A small, complete program to copy from; see README.md next to it.
#include <torchloom/torchloom.hpp>

#include <torch/cuda.h>
#include <torch/script.h>

#include <boost/describe/enum.hpp>
#include <boost/describe/enum_from_string.hpp>
#include <boost/describe/enumerators.hpp>
#include <boost/mp11/algorithm.hpp>

#include <unistd.h>  // isatty: the progress bar is for people, not for logs

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace tl = torchloom;

// Runtime choice -> type: --loader names an enumerator, loader_for maps it to a loader type.
// Adding a loader (aoti) is one enumerator here and one loader_for specialisation below.
enum class loader_kind { torchscript };
BOOST_DESCRIBE_ENUM(loader_kind, torchscript)
using loader_kinds = boost::describe::describe_enumerators<loader_kind>;

template <loader_kind K>
struct loader_for;
template <>
struct loader_for<loader_kind::torchscript> {
  using type = tl::torchscript_loader;
};

//! Bad command-line usage: reported with the usage text, exit status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct cli_args {
  std::string model = TORCHLOOM_BUNDLED_MODEL_DIR;
  loader_kind loader = loader_kind::torchscript;
  c10::Device device{c10::kCPU};
  std::vector<std::string> inputs;
  std::vector<std::pair<std::string, std::string>> options;
  int iterations = 100;
  int warmup = 1;
  bool help = false;
};

std::string loader_names() {
  std::vector<std::string> names;
  boost::mp11::mp_for_each<loader_kinds>([&](auto e) { names.emplace_back(e.name); });
  return tl::detail::quoted_list(names, " or ");
}

std::string dtype_names() {
  std::string out;
  for (const auto& [name, type] : tl::detail::dtype_names) {
    out.append(out.empty() ? "" : ", ").append(name);
  }
  return out;
}

void print_usage(std::ostream& out) {
  const std::string_view indent = "\n                       ";
  out << "usage: torchloom-run [MODEL] [--loader NAME] [--device cpu|cuda:N]\n"
      << "                     [--input SHAPE:DTYPE ...] [--iterations N] [--warmup N]\n"
      << "                     [--set KEY=VALUE ...] [--help]\n\n"
      << "Loads MODEL with torchloom, runs it on random inputs, prints its outputs and latency.\n\n"
      << "  MODEL                a model file or a Triton-layout model directory; default: the"
      << indent << "bundled model " << TORCHLOOM_BUNDLED_MODEL_DIR << '\n'
      << "  --loader NAME        " << loader_names() << " (default: torchscript)\n"
      << "  --device DEVICE      cpu or cuda:N (default: cpu)\n"
      << "  --input SHAPE:DTYPE  one per model input, in order, e.g. 8x64:float32; DTYPE is"
      << indent << dtype_names() << '.' << indent
      << "Default: made from the model's declared inputs (batch 8)\n"
      << "  --iterations N       timed runs (default: 100)\n"
      << "  --warmup N           untimed runs before them (default: 1)\n"
      << "  --set KEY=VALUE      a runner option, e.g. INTRA_OP_THREAD_COUNT=4; repeatable\n"
      << "  --help               this text\n";
}

template <class Int>
Int parse_int(std::string_view text, Int min, std::string_view what) {
  Int v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || v < min) {
    throw usage_error(
        tl::detail::concat(what, " must be an integer >= ", min, ", not '", text, "'"));
  }
  return v;
}

cli_args parse_args(int argc, char** argv) {
  cli_args a;
  bool have_model = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw usage_error(tl::detail::concat(arg, " needs a value"));
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      a.help = true;
    } else if (arg == "--loader") {
      const std::string_view name = value();
      if (!boost::describe::enum_from_string(std::string(name).c_str(), a.loader)) {
        throw usage_error(tl::detail::concat("unknown loader '", name, "'; use ", loader_names()));
      }
    } else if (arg == "--device") {
      const std::string_view name = value();
      try {
        a.device = c10::Device(std::string(name));
      } catch (const std::exception&) {
        throw usage_error(tl::detail::concat("unknown device '", name, "'; use cpu or cuda:N"));
      }
    } else if (arg == "--input") {
      a.inputs.emplace_back(value());
    } else if (arg == "--iterations") {
      a.iterations = parse_int(value(), 1, arg);
    } else if (arg == "--warmup") {
      a.warmup = parse_int(value(), 0, arg);
    } else if (arg == "--set") {
      const std::string_view kv = value();
      const auto eq = kv.find('=');
      if (eq == std::string_view::npos) {
        throw usage_error(tl::detail::concat("--set needs KEY=VALUE, not '", kv, "'"));
      }
      a.options.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    } else if (arg.starts_with("-") || have_model) {
      throw usage_error(tl::detail::concat("unexpected argument '", arg, "'"));
    } else {
      a.model = arg;
      have_model = true;
    }
  }
  return a;
}

// Random, never zeros: a model that ignores or mishandles its input should not look fine.
at::Tensor random_tensor(const std::vector<std::int64_t>& shape, c10::ScalarType dtype,
                         c10::Device device) {
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  if (c10::isFloatingType(dtype)) {
    // CPU LibTorch 1.13 has no uniform_ for Half: draw float32 and convert.
    return torch::rand(shape, opts.dtype(c10::kFloat)).to(dtype);
  }
  return torch::randint(0, dtype == c10::kBool ? 2 : 10, shape, opts);
}

// "8x64:float32" -> a random tensor of that shape and dtype.
at::Tensor parse_input(std::string_view text, c10::Device device) {
  const auto colon = text.rfind(':');
  const auto dtype = tl::detail::parse_dtype(text.substr(colon == text.npos ? 0 : colon + 1));
  if (colon == text.npos || !dtype) {
    throw usage_error(tl::detail::concat("--input '", text, "': expected SHAPE:DTYPE such as ",
                                         "8x64:float32, with DTYPE one of ", dtype_names()));
  }
  std::vector<std::int64_t> shape;
  for (std::string_view dims = text.substr(0, colon);;) {
    const auto x = dims.find('x');
    shape.push_back(parse_int<std::int64_t>(dims.substr(0, x), 0, "--input: each size"));
    if (x == dims.npos) break;
    dims.remove_prefix(x + 1);
  }
  return random_tensor(shape, *dtype, device);
}

// Inputs from what the model declares: a leading free dimension is the batch (8, or less when
// config.pbtxt's max_batch_size is smaller), any other free dimension is 1.
std::vector<c10::IValue> declared_inputs(const tl::input_signature& sig, const tl::model_spec& spec,
                                         c10::Device device) {
  const std::int64_t max_batch = spec.config ? spec.config->max_batch_size : 0;
  const std::int64_t batch = max_batch > 0 ? std::min<std::int64_t>(8, max_batch) : 8;
  std::vector<c10::IValue> inputs;
  for (const auto& s : sig) {
    if (s.has_default) break;
    if (!s.is_tensor || !s.dtype || !s.shape) {
      throw usage_error(tl::detail::concat("the model does not declare the dtype and shape of ",
                                           "input '", s.name, "'; pass --input SHAPE:DTYPE"));
    }
    std::vector<std::int64_t> shape = *s.shape;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] < 0) shape[d] = d == 0 ? batch : 1;
    }
    inputs.emplace_back(random_tensor(shape, *s.dtype, device));
  }
  return inputs;
}

void draw_progress(int done, int total) {
  constexpr int width = 40;
  const auto filled = static_cast<std::size_t>(std::int64_t{done} * width / total);
  std::cerr << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "]  "
            << std::setw(static_cast<int>(std::to_string(total).size())) << done << '/' << total
            << std::flush;
}

template <class Loader>
void run_model(const cli_args& a, tl::model_spec spec) {
  tl::model_runner<Loader> runner(std::move(spec), a.device);
  std::vector<c10::IValue> inputs;
  for (const auto& text : a.inputs) inputs.emplace_back(parse_input(text, a.device));
  if (a.inputs.empty()) inputs = declared_inputs(runner.inputs(), runner.spec(), a.device);

  // CUDA kernels are asynchronous: a run is over only once the device is done with it.
  const auto run_once = [&] {
    auto out = runner.run(inputs);
    if (runner.device().is_cuda()) torch::cuda::synchronize(runner.device().index());
    return out;
  };
  std::vector<at::Tensor> outputs;
  for (int i = 0; i < a.warmup; ++i) outputs = run_once();

  const bool progress = isatty(2) && a.iterations >= 200;
  const int step = std::max(1, a.iterations / 200);  // a redraw costs more than a tiny model
  using clock = std::chrono::steady_clock;
  std::vector<double> micros;
  for (int i = 1; i <= a.iterations; ++i) {
    const auto start = clock::now();
    outputs = run_once();
    micros.push_back(std::chrono::duration<double, std::micro>(clock::now() - start).count());
    if (progress && (i % step == 0 || i == a.iterations)) draw_progress(i, a.iterations);
  }
  if (progress) std::cerr << '\r' << std::string(60, ' ') << '\r' << std::flush;

  const auto describe = [](const at::Tensor& t) {
    return tl::detail::concat(t.sizes(), ' ', tl::detail::dtype_name(t.scalar_type()));
  };
  std::cout << "model:    " << runner.name() << " ("
            << runner.spec().model_file(Loader::default_filename).string() << ")\n"
            << "device:   " << runner.device() << '\n';
  const std::string changed = tl::to_string(runner.options(), /*only_changed=*/true);
  std::cout << "options:" << (changed.empty() ? "  defaults" : "") << '\n';
  for (const auto& line : tl::detail::split(changed, '\n')) std::cout << "  " << line << '\n';
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::cout << "input " << i << ":  " << describe(inputs[i].toTensor()) << '\n';
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    std::cout << "output " << i << ": " << describe(outputs[i]) << '\n';
  }

  std::sort(micros.begin(), micros.end());
  // Nearest rank: a latency that was observed, not one interpolated between two runs.
  const auto percentile = [&](std::size_t p) { return micros[(micros.size() * p + 99) / 100 - 1]; };
  const double mean =
      std::accumulate(micros.begin(), micros.end(), 0.0) / static_cast<double>(micros.size());
  std::cout << std::fixed << std::setprecision(1) << "latency:  " << a.iterations << " runs after "
            << a.warmup << " warm-up: p50 " << percentile(50) << " us, p99 " << percentile(99)
            << " us, mean " << mean << " us\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const cli_args args = parse_args(argc, argv);
    if (args.help) {
      print_usage(std::cout);
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
    boost::mp11::mp_for_each<loader_kinds>([&](auto e) {
      if (e.value == args.loader) {
        run_model<typename loader_for<decltype(e)::value>::type>(args, std::move(spec));
      }
    });
    return 0;
  } catch (const usage_error& e) {
    std::cerr << "torchloom-run: " << e.what() << "\n\n";
    print_usage(std::cerr);
    return 2;
  } catch (const tl::error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  } catch (const std::exception& e) {
    // torch itself (making inputs, synchronising) reports its errors as c10::Error.
    std::cerr << "torchloom-run: " << tl::detail::torch_message(e) << '\n';
    return 1;
  }
}
