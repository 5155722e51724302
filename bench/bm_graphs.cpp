// T12 (PERF.md): a graphed<caller_stream> runner against the raw LibTorch call, on the
// bundled MLP and a torchvision ResNet-18 with random weights (224x224), at batch 1, 8 and
// 64, TorchScript and AOTInductor. Paired as in bm_overhead and bm_aoti: raw and runner calls
// alternate in one loop (which goes first swaps every iteration), each timed on its own and
// each followed by a device synchronisation, so both sides pay for their GPU time.
//
// Models: the bundled tiny_mlp (TorchScript), scripts/make_aoti_fixtures.py's mlp_cuda
// (AOTInductor; TORCHLOOM_AOTI_FIXTURES), and scripts/make_graph_fixtures.py's resnet18_ts and
// resnet18_cuda (TORCHLOOM_GRAPH_FIXTURES). A missing model or device is a skip that says
// so. Before timing, the runner's outputs are checked against the raw call's: the counter
// `bitwise` is 1 when they are equal bit for bit, and a row whose outputs differ beyond
// rounding is skipped with an error.
#include <torchloom/torchloom.hpp>

#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/script.h>

#if TORCHLOOM_HAS_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

const c10::Device gpu(c10::kCUDA, 0);
constexpr int warmup_calls = 5;  // more than graphed's eager runs before its capture

enum class model_kind { mlp, resnet18 };
enum class loader_kind { torchscript, aoti };

fs::path env_or(const char* name, const fs::path& fallback) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != 0 ? fs::path(env) : fallback;
}

// The model's Triton-layout directory.
fs::path model_dir(model_kind m, loader_kind l) {
  const fs::path aoti = env_or("TORCHLOOM_AOTI_FIXTURES", TORCHLOOM_AOTI_FIXTURE_DIR);
  const fs::path graphs = env_or("TORCHLOOM_GRAPH_FIXTURES", TORCHLOOM_GRAPH_FIXTURE_DIR);
  if (m == model_kind::mlp) {
    return l == loader_kind::torchscript ? fs::path(TORCHLOOM_BUNDLED_MODEL_DIR)
                                         : aoti / "mlp_cuda";
  }
  return graphs / (l == loader_kind::torchscript ? "resnet18_ts" : "resnet18_cuda");
}

fs::path model_file(model_kind m, loader_kind l) {
  return model_dir(m, l) / "1" / (l == loader_kind::torchscript ? "model.pt" : "model.pt2");
}

at::Tensor make_input(model_kind m, std::int64_t batch) {
  torch::manual_seed(42);
  const auto opts = torch::TensorOptions().device(gpu);
  return m == model_kind::mlp ? torch::rand({batch, 64}, opts)
                              : torch::randn({batch, 3, 224, 224}, opts);
}

// Paired calls per row: enough for a stable median at each row's cost.
benchmark::IterationCount calls_for(model_kind m, std::int64_t batch) {
  if (m == model_kind::mlp) return 3000;
  return batch == 1 ? 300 : batch == 8 ? 150 : 40;
}

void sync() { torch::cuda::synchronize(0); }

double median_of_sorted(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  const std::size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2.0;
}

double nearest_rank(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[rank == 0 ? 0 : rank - 1];
}

template <class Fn>
double time_call_us(Fn&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(stop - start).count();
}

using graphed_stream = torchloom::graphed<torchloom::caller_stream>;
using ts_runner =
    torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, graphed_stream>;

// One row's two sides: each returns the call's output tensor.
struct sides {
  std::function<at::Tensor()> raw;
  std::function<at::Tensor()> runner;
  std::function<torchloom::graph_stats()> stats;
  std::shared_ptr<void> keep;  // what the two sides call into
};

sides torchscript_sides(model_kind m, const at::Tensor& x) {
  struct state {
    torch::jit::Module raw;
    std::unique_ptr<ts_runner> runner;
    std::vector<c10::IValue> inputs;
  };
  auto s = std::make_shared<state>();
  // What a user writes by hand: load on the device, eval mode, InferenceMode per call.
  s->raw = torch::jit::load(model_file(m, loader_kind::torchscript).string(), gpu);
  s->raw.eval();
  s->runner = std::make_unique<ts_runner>(
      torchloom::model_spec::from_directory(model_dir(m, loader_kind::torchscript)), gpu);
  s->inputs = {x};
  sides out;
  out.raw = [s] {
    c10::InferenceMode inference;
    return s->raw.forward(s->inputs).toTensor();
  };
  out.runner = [s] { return s->runner->run(s->inputs).front(); };
  out.stats = [s] { return s->runner->stream().stats(); };
  out.keep = s;
  return out;
}

#if TORCHLOOM_TORCH_VERSION >= 20600
using aoti_runner =
    torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook, graphed_stream>;

sides aoti_sides(model_kind m, const at::Tensor& x) {
  struct state {
    std::unique_ptr<torch::inductor::AOTIModelPackageLoader> raw;
    std::unique_ptr<aoti_runner> runner;
    std::vector<at::Tensor> inputs;
  };
  auto s = std::make_shared<state>();
  // What a user writes by hand: the package loaded as usual (torch's threaded runner; the
  // graphed runner loads it single-threaded for capture), called on the current stream.
  s->raw = torchloom::detail::make_package_loader<torch::inductor::AOTIModelPackageLoader>(
      "bm_graphs", model_file(m, loader_kind::aoti).string(), "model", 1, gpu);
  s->runner = std::make_unique<aoti_runner>(
      torchloom::model_spec::from_directory(model_dir(m, loader_kind::aoti)), gpu);
  s->inputs = {x};
  sides out;
  out.raw = [s] {
    c10::InferenceMode inference;
    void* stream = nullptr;
#if TORCHLOOM_HAS_CUDA
    stream = c10::cuda::getCurrentCUDAStream(0).stream();
#endif
    return s->raw->run(s->inputs, stream).front();
  };
  out.runner = [s] { return s->runner->run_tensors(s->inputs).front(); };
  out.stats = [s] { return s->runner->stream().stats(); };
  out.keep = s;
  return out;
}
#endif

std::string missing(model_kind m, loader_kind l) {
  if (!torch::cuda::is_available()) return "no CUDA device";
#if TORCHLOOM_TORCH_VERSION < 20600
  if (l == loader_kind::aoti) return "AOTInductor needs LibTorch >= 2.6";
#endif
  std::error_code ec;
  if (!fs::is_regular_file(model_file(m, l), ec)) {
    return "no model " + model_file(m, l).string() +
           (m == model_kind::resnet18 ? "; run scripts/make_graph_fixtures.py DIR and set "
                                        "TORCHLOOM_GRAPH_FIXTURES"
                                      : "; run scripts/make_aoti_fixtures.py DIR and set "
                                        "TORCHLOOM_AOTI_FIXTURES");
  }
  return {};
}

void bm_paired_graphs(benchmark::State& state, model_kind m, loader_kind l, std::int64_t batch) {
  if (const std::string why = missing(m, l); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  const at::Tensor x = make_input(m, batch);
  sides s;
#if TORCHLOOM_TORCH_VERSION >= 20600
  s = l == loader_kind::torchscript ? torchscript_sides(m, x) : aoti_sides(m, x);
#else
  s = torchscript_sides(m, x);
#endif
  for (int i = 0; i < warmup_calls; ++i) {
    benchmark::DoNotOptimize(s.raw());
    benchmark::DoNotOptimize(s.runner());
    sync();
  }
  // Only time the runner when it computes what the raw call computes.
  const at::Tensor want = s.raw();
  const at::Tensor got = s.runner();
  sync();
  const bool bitwise = got.sizes() == want.sizes() && torch::equal(got, want);
  if (!bitwise && !(got.sizes() == want.sizes() && torch::allclose(got, want, 1e-4, 1e-4))) {
    state.SkipWithError("the graphed runner's output differs from the raw call's");
    return;
  }
  const auto raw_once = [&] {
    benchmark::DoNotOptimize(s.raw());
    sync();
  };
  const auto runner_once = [&] {
    benchmark::DoNotOptimize(s.runner());
    sync();
  };
  std::vector<double> raw_us;
  std::vector<double> runner_us;
  raw_us.reserve(static_cast<std::size_t>(state.max_iterations));
  runner_us.reserve(static_cast<std::size_t>(state.max_iterations));
  bool raw_first = true;
  for (auto _ : state) {
    if (raw_first) {
      raw_us.push_back(time_call_us(raw_once));
      runner_us.push_back(time_call_us(runner_once));
    } else {
      runner_us.push_back(time_call_us(runner_once));
      raw_us.push_back(time_call_us(raw_once));
    }
    raw_first = !raw_first;
  }
  std::sort(raw_us.begin(), raw_us.end());
  std::sort(runner_us.begin(), runner_us.end());
  const double raw_median = median_of_sorted(raw_us);
  const double runner_median = median_of_sorted(runner_us);
  const torchloom::graph_stats stats = s.stats();
  using counter = benchmark::Counter;
  state.counters["raw_median_us"] = counter(raw_median);
  state.counters["runner_median_us"] = counter(runner_median);
  state.counters["ratio"] = counter(raw_median > 0.0 ? runner_median / raw_median : 0.0);
  state.counters["speedup"] = counter(runner_median > 0.0 ? raw_median / runner_median : 0.0);
  state.counters["raw_p99_us"] = counter(nearest_rank(raw_us, 0.99));
  state.counters["runner_p99_us"] = counter(nearest_rank(runner_us, 0.99));
  state.counters["calls"] = counter(static_cast<double>(raw_us.size()));
  state.counters["bitwise"] = counter(bitwise ? 1.0 : 0.0);
  // 1 when the timed runner calls were replays (the graph was captured, not refused).
  state.counters["replayed"] =
      counter(stats.captures >= 1 && stats.uncapturable == 0 ? 1.0 : 0.0);
}

#if TORCHLOOM_HAS_CUDA
// For reference, not a target: the least a replay of the bundled MLP costs here, written with
// torch's CUDAGraph by hand (copy the input in, replay, clone the output, synchronise), as
// torch's own Python replay does it. The graphed runner adds its checks and bookkeeping.
void bm_graphs_floor(benchmark::State& state, std::int64_t batch) {
  if (const std::string why = missing(model_kind::mlp, loader_kind::torchscript); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  torch::jit::Module m =
      torch::jit::load(model_file(model_kind::mlp, loader_kind::torchscript).string(), gpu);
  m.eval();
  c10::InferenceMode inference;
  const at::Tensor x = make_input(model_kind::mlp, batch);
  const at::Tensor static_x = x.clone();
  for (int i = 0; i < 3; ++i) benchmark::DoNotOptimize(m.forward({static_x}));
  sync();
  at::cuda::CUDAGraph graph;
  at::Tensor static_out;
  {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
    const c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin();
    static_out = m.forward({static_x}).toTensor();
    graph.capture_end();
  }
  sync();
  for (auto _ : state) {
    static_x.copy_(x, true);
    graph.replay();
    at::Tensor out = static_out.clone();
    sync();
    benchmark::DoNotOptimize(out);
  }
}

// For reference, not a target: where a replay's host time goes, the bundled MLP at batch 1.
// Each counter is the mean host time of one call, in microseconds, over batches of 100
// calls with the device synchronised between batches (not timed): the pieces a replay is
// made of (allocating an output, a 1D device copy, an event record and wait, launching the
// captured graph, pointing a memcpy node of an instantiated graph at other tensors), and
// whole calls (the graphed runner's run, the raw TorchScript call), which leave their GPU
// work queued.
void bm_graphs_host_parts(benchmark::State& state) {
  if (const std::string why = missing(model_kind::mlp, loader_kind::torchscript); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  const at::Tensor x = make_input(model_kind::mlp, 1);
  sides s = torchscript_sides(model_kind::mlp, x);
  for (int i = 0; i < warmup_calls; ++i) benchmark::DoNotOptimize(s.runner());
  torch::jit::Module m =
      torch::jit::load(model_file(model_kind::mlp, loader_kind::torchscript).string(), gpu);
  m.eval();
  c10::InferenceMode inference;
  const at::Tensor static_x = x.clone();
  for (int i = 0; i < 3; ++i) benchmark::DoNotOptimize(m.forward({static_x}));
  sync();
  at::cuda::CUDAGraph graph;
  at::Tensor static_out;
  {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
    const c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin();
    static_out = m.forward({static_x}).toTensor();
    graph.capture_end();
  }
  graph.replay();
  sync();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0).stream();
  const at::Tensor other = static_out.clone();
  cudaEvent_t event = nullptr;
  cudaGraph_t copy_graph = nullptr;
  cudaGraphExec_t copy_exec = nullptr;
  cudaGraphNode_t copy_node = nullptr;
  bool ok = cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess &&
            cudaGraphCreate(&copy_graph, 0) == cudaSuccess &&
            cudaGraphAddMemcpyNode1D(&copy_node, copy_graph, nullptr, 0, other.data_ptr(),
                                     static_out.data_ptr(), static_out.nbytes(),
                                     cudaMemcpyDeviceToDevice) == cudaSuccess &&
            cudaGraphInstantiateWithFlags(&copy_exec, copy_graph, 0) == cudaSuccess;
  const auto options = static_out.options();
  const std::vector<std::int64_t> shape(static_out.sizes().begin(), static_out.sizes().end());
  const std::vector<std::pair<const char*, std::function<void()>>> parts = {
      {"empty_us", [&] { benchmark::DoNotOptimize(at::empty(shape, options)); }},
      {"memcpy_us",
       [&] {
         ok = ok && cudaMemcpyAsync(other.data_ptr(), static_out.data_ptr(), static_out.nbytes(),
                                    cudaMemcpyDeviceToDevice, stream) == cudaSuccess;
       }},
      {"event_record_wait_us",
       [&] {
         ok = ok && cudaStreamWaitEvent(stream, event, 0) == cudaSuccess &&
              cudaEventRecord(event, stream) == cudaSuccess;
       }},
      {"graph_launch_us", [&] { graph.replay(); }},
      {"memcpy_node_set_us",
       [&] {
         ok = ok && cudaGraphExecMemcpyNodeSetParams1D(
                        copy_exec, copy_node, other.data_ptr(), static_out.data_ptr(),
                        static_out.nbytes(), cudaMemcpyDeviceToDevice) == cudaSuccess;
       }},
      {"runner_run_us", [&] { benchmark::DoNotOptimize(s.runner()); }},
      {"raw_call_us", [&] { benchmark::DoNotOptimize(s.raw()); }},
  };
  constexpr int batch_calls = 100;
  std::vector<double> total_us(parts.size(), 0.0);
  std::int64_t batches = 0;
  for (auto _ : state) {
    for (std::size_t p = 0; p < parts.size(); ++p) {
      sync();
      total_us[p] += time_call_us([&] {
        for (int i = 0; i < batch_calls; ++i) parts[p].second();
      });
    }
    ++batches;
  }
  sync();
  if (!ok) state.SkipWithError("a CUDA call failed");
  for (std::size_t p = 0; p < parts.size(); ++p) {
    state.counters[parts[p].first] = benchmark::Counter(
        batches > 0 ? total_us[p] / static_cast<double>(batches * batch_calls) : 0.0);
  }
  if (copy_exec != nullptr) (void)cudaGraphExecDestroy(copy_exec);
  if (copy_graph != nullptr) (void)cudaGraphDestroy(copy_graph);
  if (event != nullptr) (void)cudaEventDestroy(event);
}
#endif

void register_benchmarks() {
#if TORCHLOOM_HAS_CUDA
  benchmark::RegisterBenchmark("BM_graphs_host_parts/model:mlp/batch:1", bm_graphs_host_parts)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime()
      ->Iterations(20)
      ->Repetitions(1);
  for (const std::int64_t batch : {1, 8}) {
    const std::string name = "BM_graphs_floor/model:mlp/batch:" + std::to_string(batch);
    benchmark::RegisterBenchmark(name.c_str(), bm_graphs_floor, batch)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime()
        ->Iterations(3000)
        ->Repetitions(1);
  }
#endif
  for (const auto& [mname, m] : {std::pair{"mlp", model_kind::mlp},
                                 std::pair{"resnet18", model_kind::resnet18}}) {
    for (const auto& [lname, l] : {std::pair{"torchscript", loader_kind::torchscript},
                                   std::pair{"aoti", loader_kind::aoti}}) {
      for (const std::int64_t batch : {1, 8, 64}) {
        const std::string name = std::string("BM_graphs/model:") + mname +
                                 "/loader:" + lname + "/batch:" + std::to_string(batch);
        benchmark::RegisterBenchmark(name.c_str(), bm_paired_graphs, m, l, batch)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->Iterations(calls_for(m, batch))
            ->Repetitions(1);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
