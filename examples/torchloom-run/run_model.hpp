#pragma once
// The body of torchloom-run: load, make inputs, run from N threads, report. Included only by
// the run_<residency>.cpp files, which compile it for their runner types.
#include "cli.hpp"
#include "text.hpp"

#include <torchloom/torchloom.hpp>
#include <torchloom/version.hpp>

#include <torch/cuda.h>
#include <torch/script.h>

#include <boost/mp11/algorithm.hpp>

#include <unistd.h>  // isatty: the progress bar is for people, not for logs

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace torchloom_run {

namespace tl = torchloom;

// Random, never zeros: a model that ignores or mishandles its input should not look fine.
inline at::Tensor random_tensor(const std::vector<std::int64_t>& shape, c10::ScalarType dtype,
                                c10::Device device) {
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  if (c10::isFloatingType(dtype)) {
    // CPU LibTorch 1.13 has no uniform_ for Half: draw float32 and convert.
    return torch::rand(shape, opts.dtype(c10::kFloat)).to(dtype);
  }
  return torch::randint(0, dtype == c10::kBool ? 2 : 10, shape, opts);
}

// "8x64:float32" -> a random tensor of that shape and dtype.
inline at::Tensor parse_input(std::string_view text, c10::Device device) {
  const auto colon = text.rfind(':');
  const auto dtype = tl::parse_dtype(text.substr(colon == text.npos ? 0 : colon + 1));
  if (colon == text.npos || !dtype) {
    throw usage_error(cat("--input '", text, "': expected SHAPE:DTYPE such as ",
                                         "8x64:float32, with DTYPE one of ", dtype_names()));
  }
  std::vector<std::int64_t> shape;
  for (std::string_view dims = text.substr(0, colon);;) {
    const auto x = dims.find('x');
    const std::string_view d = dims.substr(0, x);
    std::int64_t v = -1;
    const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
    if (d.empty() || ec != std::errc{} || end != d.data() + d.size() || v < 0) {
      throw usage_error(cat("--input '", text, "': '", d,
                                           "' is not a size (an integer >= 0)"));
    }
    shape.push_back(v);
    if (x == dims.npos) break;
    dims.remove_prefix(x + 1);
  }
  return random_tensor(shape, *dtype, device);
}

// Inputs from what the model declares: a leading free dimension is the batch (8, or less when
// config.pbtxt's max_batch_size is smaller), any other free dimension is 1.
inline std::vector<c10::IValue> declared_inputs(const tl::input_signature& sig,
                                                const tl::model_spec& spec, c10::Device device) {
  const std::int64_t max_batch = spec.config ? spec.config->max_batch_size : 0;
  const std::int64_t batch = max_batch > 0 ? std::min<std::int64_t>(8, max_batch) : 8;
  std::vector<c10::IValue> inputs;
  for (const auto& s : sig) {
    if (s.has_default) break;
    if (!s.is_tensor || !s.dtype || !s.shape) {
      throw model_error(spec.name, cat("it does not declare the dtype and shape of input '",
                                       s.name, "'; pass --input SHAPE:DTYPE"));
    }
    std::vector<std::int64_t> shape = *s.shape;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] < 0) shape[d] = d == 0 ? batch : 1;
    }
    inputs.emplace_back(random_tensor(shape, *s.dtype, device));
  }
  return inputs;
}

inline void draw_progress(std::int64_t done, std::int64_t total) {
  constexpr std::int64_t width = 40;
  const auto filled = static_cast<std::size_t>(done * width / total);
  std::cerr << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "]  "
            << std::setw(static_cast<int>(std::to_string(total).size())) << done << '/' << total
            << std::flush;
}

//! Latency statistics over every timed run of every thread, in microseconds.
struct latency_stats {
  std::size_t runs = 0;
  double min = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
  double throughput = 0;           //!< runs per second over the timed wall time
  std::vector<std::string> notes;  //!< percentiles that too few runs cannot tell from the max
};

inline latency_stats summarise(std::vector<double> micros, double wall_seconds) {
  latency_stats s;
  std::sort(micros.begin(), micros.end());
  s.runs = micros.size();
  // Nearest rank: a latency that was observed, not one interpolated between two runs.
  const auto rank = [&](std::size_t per_mille) {
    return micros[(s.runs * per_mille + 999) / 1000 - 1];
  };
  s.min = micros.front();
  s.max = micros.back();
  s.p50 = rank(500);
  s.p90 = rank(900);
  s.p99 = rank(990);
  s.p999 = rank(999);
  s.mean = std::accumulate(micros.begin(), micros.end(), 0.0) / static_cast<double>(s.runs);
  s.throughput = wall_seconds > 0 ? static_cast<double>(s.runs) / wall_seconds : 0;
  // Below 1000 / (1000 - p) runs, the p-th per-mille rank is the largest run.
  for (const auto& [name, per_mille] :
       {std::pair<const char*, std::size_t>{"p90", 900}, {"p99", 990}, {"p99.9", 999}}) {
    const std::size_t needed = 1000 / (1000 - per_mille);
    if (s.runs < needed) {
      s.notes.push_back(cat(name, " needs at least ", needed, " runs to differ ",
                                           "from the maximum; with ", s.runs, " it is the maximum"));
    }
  }
  return s;
}

inline std::string describe(const at::Tensor& t) {
  return cat(t.sizes(), ' ', tl::dtype_name(t.scalar_type()));
}

template <class Runner>
void run_model(const cli_args& a, tl::model_spec spec) {
  using clock = std::chrono::steady_clock;
  const auto load_start = clock::now();
  Runner runner(std::move(spec), a.device);
  const double load_ms =
      std::chrono::duration<double, std::milli>(clock::now() - load_start).count();

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

  // Every thread makes `iterations` timed runs of the one runner; run() is thread-safe.
  const std::int64_t total = std::int64_t{a.iterations} * a.threads;
  std::vector<std::vector<double>> micros(static_cast<std::size_t>(a.threads));
  std::vector<std::vector<at::Tensor>> last(static_cast<std::size_t>(a.threads));
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(a.threads));
  std::atomic<std::int64_t> done{0};
  const auto wall_start = clock::now();
  {
    std::vector<std::jthread> workers;
    for (std::size_t t = 0; t < micros.size(); ++t) {
      workers.emplace_back([&, t] {
        try {
          micros[t].reserve(static_cast<std::size_t>(a.iterations));
          for (int i = 0; i < a.iterations; ++i) {
            const auto start = clock::now();
            last[t] = run_once();
            micros[t].push_back(
                std::chrono::duration<double, std::micro>(clock::now() - start).count());
            done.fetch_add(1, std::memory_order_relaxed);
          }
        } catch (...) {
          failures[t] = std::current_exception();
          done.fetch_add(a.iterations, std::memory_order_relaxed);  // let the bar finish
        }
      });
    }
    const bool progress = isatty(2) && total >= 200 && !a.json;
    if (progress) {
      for (std::int64_t d = 0; d < total; d = done.load(std::memory_order_relaxed)) {
        draw_progress(d, total);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      draw_progress(total, total);
      std::cerr << '\r' << std::string(60, ' ') << '\r' << std::flush;
    }
  }
  const double wall_s = std::chrono::duration<double>(clock::now() - wall_start).count();
  for (const auto& f : failures) {
    if (f) std::rethrow_exception(f);
  }
  if (!last.front().empty()) outputs = last.front();
  std::vector<double> all;
  for (const auto& m : micros) all.insert(all.end(), m.begin(), m.end());
  const latency_stats st = summarise(std::move(all), wall_s);
  const tl::weight_memory mem = runner.memory();
  const std::string model_file =
      runner.spec().model_file(Runner::loader_type::default_filename).string();

  if (a.json) {
    std::ostringstream j;
    j << std::setprecision(6);
    j << "{\n  \"context\": {\n"
      << "    \"torchloom\": " << json_string(tl::version_string) << ",\n"
      << "    \"torch\": " << json_string(torch_version()) << ",\n"
      << "    \"cuda\": " << json_string(cuda_version()) << ",\n"
      << "    \"device\": " << json_string(cat(runner.device())) << ",\n"
      << "    \"model\": " << json_string(runner.name()) << ",\n"
      << "    \"model_file\": " << json_string(model_file) << ",\n"
      << "    \"policies\": {\"loader\": " << json_string(tl::to_string(a.policies.loader))
      << ", \"hook\": " << json_string(tl::to_string(a.policies.hook))
      << ", \"stream\": " << json_string(tl::to_string(a.policies.stream))
      << ", \"residency\": " << json_string(tl::to_string(a.policies.residency)) << "},\n"
      << "    \"options\": {";
    // Every option, from runner_options' description; one left to torch's or the policy's
    // default is null.
    bool first = true;
    tl::for_each_option(runner.options(), [&](const std::string& key,
                                              const std::optional<std::string>& value) {
      j << (first ? "" : ", ") << json_string(key) << ": ";
      first = false;
      if (value) {
        j << json_string(*value);
      } else {
        j << "null";
      }
    });
    j << "},\n    \"threads\": " << a.threads << ",\n    \"iterations_per_thread\": "
      << a.iterations << ",\n    \"warmup\": " << a.warmup << ",\n    \"inputs\": [";
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      j << (i ? ", " : "") << json_string(describe(inputs[i].toTensor()));
    }
    j << "],\n    \"outputs\": [";
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      j << (i ? ", " : "") << json_string(describe(outputs[i]));
    }
    j << "]\n  },\n  \"load_ms\": " << load_ms << ",\n  \"statistics\": {\n"
      << "    \"unit\": \"us\",\n    \"runs\": " << st.runs << ",\n    \"min\": " << st.min
      << ",\n    \"p50\": " << st.p50 << ",\n    \"p90\": " << st.p90 << ",\n    \"p99\": "
      << st.p99 << ",\n    \"p99.9\": " << st.p999 << ",\n    \"max\": " << st.max
      << ",\n    \"mean\": " << st.mean << ",\n    \"throughput_per_s\": " << st.throughput
      << ",\n    \"notes\": [";
    for (std::size_t i = 0; i < st.notes.size(); ++i) {
      j << (i ? ", " : "") << json_string(st.notes[i]);
    }
    j << "]\n  },\n  \"memory\": {\"device_bytes\": " << mem.device_bytes
      << ", \"high_water_bytes\": " << mem.high_water_bytes
      << ", \"budget_bytes\": " << mem.budget_bytes << ", \"host_bytes\": " << mem.host_bytes
      << ", \"budget_violations\": " << mem.budget_violations
      << ", \"copied_bytes\": " << mem.copied_bytes
      << ", \"resident_bytes\": " << mem.resident_bytes
      << ", \"streamed_bytes\": " << mem.streamed_bytes << "}\n}\n";
    std::cout << j.str();
    return;
  }

  std::cout << "model:     " << runner.name() << " (" << model_file << ")\n"
            << "device:    " << runner.device() << '\n'
            << "policies:  " << tl::to_string(a.policies) << '\n';
  const std::string changed = tl::to_string(runner.options(), /*only_changed=*/true);
  std::cout << "options:" << (changed.empty() ? "   defaults" : "") << '\n';
  for (const auto& line : lines(changed)) {
    if (!line.empty()) std::cout << "  " << line << '\n';
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::cout << "input " << i << ":   " << describe(inputs[i].toTensor()) << '\n';
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    std::cout << "output " << i << ":  " << describe(outputs[i]) << '\n';
  }
  const auto bytes = [](std::int64_t b) {
    return b < 0 ? std::string("unknown") : cat(b, " B");
  };
  std::cout << "memory:    device " << bytes(mem.device_bytes) << ", high water "
            << bytes(mem.high_water_bytes) << ", budget " << bytes(mem.budget_bytes)
            << ", pinned host " << bytes(mem.host_bytes) << ", copied " << bytes(mem.copied_bytes)
            << ", resident " << bytes(mem.resident_bytes) << ", streamed per run "
            << bytes(mem.streamed_bytes) << ", budget violations " << mem.budget_violations
            << '\n';
  std::cout << std::fixed << std::setprecision(1) << "load:      " << load_ms << " ms\n"
            << "latency:   " << st.runs << " runs (" << a.threads << " thread"
            << (a.threads == 1 ? "" : "s") << " x " << a.iterations << ") after " << a.warmup
            << " warm-up: min " << st.min << ", p50 " << st.p50 << ", p90 " << st.p90
            << ", p99 " << st.p99 << ", p99.9 " << st.p999 << ", max " << st.max << ", mean "
            << st.mean << " us\n"
            << "throughput: " << st.throughput << " runs/s\n";
  for (const auto& note : st.notes) std::cout << "note:      " << note << '\n';
}

//! The runner types with residency policy `R` that this build has, and run_model compiled
//! for each: `template struct runners_with<residency_kind::X>;` in run_X.cpp emits them.
template <tl::residency_kind R>
struct runners_with {
  template <class Choice>
  using has_residency =
      std::bool_constant<boost::mp11::mp_at_c<Choice, 3>::value == R>;
  using choices = boost::mp11::mp_filter<has_residency, tl::available_choices>;

  using entry = void (*)(const cli_args&, tl::model_spec);
  template <class... C>
  static constexpr auto table(boost::mp11::mp_list<C...>) {
    return std::array<entry, sizeof...(C)>{&run_model<tl::runner_type_of<C>>...};
  }
  //! Taking their addresses makes the compiler emit run_model for these runner types here.
  static const std::array<entry, boost::mp11::mp_size<choices>::value> entries;
};

template <tl::residency_kind R>
const std::array<typename runners_with<R>::entry, boost::mp11::mp_size<
                                                      typename runners_with<R>::choices>::value>
    runners_with<R>::entries = runners_with<R>::table(typename runners_with<R>::choices{});

}  // namespace torchloom_run
