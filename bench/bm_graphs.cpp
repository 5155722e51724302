// T12 (PERF.md): a graphed<caller_stream> runner against the raw LibTorch call, on the
// bundled MLP and a torchvision ResNet-18 with random weights (224x224), at batch 1, 8 and
// 64, TorchScript and AOTInductor. Paired as in bm_overhead and bm_aoti (time_paired), each
// call followed by a device synchronisation, so both sides pay for their GPU time.
//
// Models: the bundled tiny_mlp (TorchScript), scripts/make_aoti_fixtures.py's mlp_cuda
// (AOTInductor; TORCHLOOM_AOTI_FIXTURES), and scripts/make_graph_fixtures.py's resnet18_ts and
// resnet18_cuda (TORCHLOOM_GRAPH_FIXTURES). Before timing, the runner's outputs are checked
// against the raw call's: the counter `bitwise` is 1 when they are equal bit for bit, and a
// row whose outputs differ beyond rounding is skipped with an error.
#include "bench/support/models.hpp"

#if TORCHLOOM_HAS_CUDA
#include <ATen/cuda/CUDAGraph.h>

#include "bench/support/cuda.hpp"
#endif

namespace torchloom_bench {
namespace {

constexpr int warmup_calls = 5;  // more than graphed's eager runs before its capture

enum class model_kind { mlp, resnet18 };
enum class loader_kind { torchscript, aoti };

// The model's Triton-layout directory.
fs::path model_dir(model_kind m, loader_kind l) {
  const bool ts = l == loader_kind::torchscript;
  if (m == model_kind::resnet18) {
    return fixtures{"TORCHLOOM_GRAPH_FIXTURES", TORCHLOOM_GRAPH_FIXTURE_DIR}.dir(
        ts ? "resnet18_ts" : "resnet18_cuda");
  }
  return ts ? fs::path(TORCHLOOM_BUNDLED_MODEL_DIR)
            : fixtures{"TORCHLOOM_AOTI_FIXTURES", TORCHLOOM_AOTI_FIXTURE_DIR}.dir("mlp_cuda");
}

fs::path model_file(model_kind m, loader_kind l) {
  return model_dir(m, l) / "1" / (l == loader_kind::torchscript ? "model.pt" : "model.pt2");
}

std::string missing(model_kind m, loader_kind l) {
  if (!torch::cuda::is_available()) return "no CUDA device";
#if TORCHLOOM_TORCH_VERSION < 20600
  if (l == loader_kind::aoti) return "AOTInductor needs LibTorch >= 2.6";
#endif
  return no_model(model_file(m, l),
                  m == model_kind::resnet18
                      ? "scripts/make_graph_fixtures.py DIR and set TORCHLOOM_GRAPH_FIXTURES"
                      : "scripts/make_aoti_fixtures.py DIR and set TORCHLOOM_AOTI_FIXTURES");
}

at::Tensor make_input(model_kind m, std::int64_t batch) {
  if (m == model_kind::mlp) return bundled_input(gpu, batch);
  torch::manual_seed(42);
  return torch::randn({batch, 3, 224, 224}, torch::TensorOptions().device(gpu));
}

// Paired calls per row: enough for a stable median at each row's cost.
benchmark::IterationCount calls_for(model_kind m, std::int64_t batch) {
  if (m == model_kind::mlp) return 3000;
  return batch == 1 ? 300 : batch == 8 ? 150 : 40;
}

void sync() { torchloom_bench::sync(gpu); }

using graphed_stream = torchloom::graphed<torchloom::caller_stream>;
using ts_runner =
    torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, graphed_stream>;

// One row's two sides, each returning the call's output tensor, and the runner's graph
// statistics; the functions own what they call into.
struct sides {
  std::function<at::Tensor()> raw;
  std::function<at::Tensor()> runner;
  std::function<torchloom::graph_stats()> stats;
};

sides torchscript_sides(model_kind m, const at::Tensor& x) {
  const auto raw = std::make_shared<torch::jit::Module>(
      load_module(model_file(m, loader_kind::torchscript), gpu));
  const auto runner = std::make_shared<ts_runner>(
      torchloom::model_spec::from_directory(model_dir(m, loader_kind::torchscript)), gpu);
  const auto inputs = std::make_shared<const std::vector<c10::IValue>>(1, x);
  return {[raw, inputs] { return raw_call(*raw, *inputs).toTensor(); },
          [runner, inputs] { return runner->run(*inputs).front(); },
          [runner] { return runner->stream().stats(); }};
}

#if TORCHLOOM_TORCH_VERSION >= 20600
using aoti_runner =
    torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook, graphed_stream>;

// The raw side loads the package as a user does (torch's threaded runner; the graphed runner
// loads it single-threaded for capture) and calls it on the current stream.
sides aoti_sides(model_kind m, const at::Tensor& x) {
  const std::shared_ptr<package_loader> raw =
      load_package(model_file(m, loader_kind::aoti), gpu, "bm_graphs");
  const auto runner = std::make_shared<aoti_runner>(
      torchloom::model_spec::from_directory(model_dir(m, loader_kind::aoti)), gpu);
  const auto inputs = std::make_shared<const std::vector<at::Tensor>>(1, x);
  return {[raw, inputs] { return raw_call(*raw, *inputs, gpu).front(); },
          [runner, inputs] { return runner->run_tensors(*inputs).front(); },
          [runner] { return runner->stream().stats(); }};
}
#endif

void bm_paired_graphs(benchmark::State& state, model_kind m, loader_kind l, std::int64_t batch) {
  if (skip_if(state, missing(m, l))) return;
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
  const paired_medians medians = time_paired(
      state,
      [&] {
        benchmark::DoNotOptimize(s.raw());
        sync();
      },
      [&] {
        benchmark::DoNotOptimize(s.runner());
        sync();
      });
  const torchloom::graph_stats stats = s.stats();
  set_counters(state,
               {{"speedup", medians.runner_us > 0.0 ? medians.raw_us / medians.runner_us : 0.0},
                {"bitwise", bitwise ? 1.0 : 0.0},
                // 1 when the timed runner calls were replays (captured, not refused).
                {"replayed", stats.captures >= 1 && stats.uncapturable == 0 ? 1.0 : 0.0}});
}

#if TORCHLOOM_HAS_CUDA
// For reference, not a target: the least a replay of the bundled MLP costs here, written with
// torch's CUDAGraph by hand as torch's own Python replay does it (copy the input in, replay,
// clone the output, synchronise); the graphed runner adds its checks and bookkeeping. An input
// of `batch` rows and its static copy, three eager runs, one capture on a side stream, a static
// output. InferenceMode holds from after the load while it lives.
struct hand_captured_mlp {
  torch::jit::Module m;
  c10::InferenceMode inference;
  at::Tensor x;
  at::Tensor static_x;
  at::Tensor static_out;
#if TORCHLOOM_TORCH_VERSION >= 20800
  at::cuda::CUDAGraph graph{/*keep_graph=*/true};  // kept for bm_graphs_floor_fused
#else
  at::cuda::CUDAGraph graph;
#endif

  explicit hand_captured_mlp(std::int64_t batch)
      : m(load_module(bundled_file(), gpu)), x(make_input(model_kind::mlp, batch)) {
    static_x = x.clone();
    for (int i = 0; i < 3; ++i) benchmark::DoNotOptimize(m.forward({static_x}));
    sync();
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
    const c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin();
    static_out = m.forward({static_x}).toTensor();
    graph.capture_end();
#if TORCHLOOM_TORCH_VERSION >= 20800
    graph.instantiate();  // a kept graph is instantiated on demand
#endif
  }
};

// A node of `graph` that copies `src` into `dst` (device to device), after `dep` if given.
bool add_copy(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t* dep,
              const at::Tensor& dst, const at::Tensor& src) {
  return cudaGraphAddMemcpyNode1D(node, graph, dep, dep != nullptr ? 1 : 0, dst.data_ptr(),
                                  src.data_ptr(), src.nbytes(),
                                  cudaMemcpyDeviceToDevice) == cudaSuccess;
}

void bm_graphs_floor(benchmark::State& state, std::int64_t batch) {
  if (skip_if(state, missing(model_kind::mlp, loader_kind::torchscript))) return;
  hand_captured_mlp h(batch);
  sync();
  for (auto _ : state) {
    h.static_x.copy_(h.x, true);
    h.graph.replay();
    at::Tensor out = h.static_out.clone();
    sync();
    benchmark::DoNotOptimize(out);
  }
}

#if TORCHLOOM_TORCH_VERSION >= 20800
// For reference, not a target: the least a replay that copies its input in and its output out
// can cost here, paired with the raw TorchScript call. The hand-captured MLP as the child of a
// graph with a memcpy node for the input before it and one for the output after it, launched
// once per call, on fixed tensors (no node is re-pointed, nothing is allocated, no checks):
// the graphed runner's replay without the runner. The counter `ceiling` is raw / this, the
// most any such replay can gain over the raw call in this run.
void bm_graphs_floor_fused(benchmark::State& state, std::int64_t batch) {
  if (skip_if(state, missing(model_kind::mlp, loader_kind::torchscript))) return;
  hand_captured_mlp h(batch);
  torch::jit::Module raw = load_module(bundled_file(), gpu);
  const std::vector<c10::IValue> raw_inputs{h.x};
  const at::Tensor out = h.static_out.clone();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t in_node = nullptr;
  cudaGraphNode_t body = nullptr;
  cudaGraphNode_t out_node = nullptr;
  const bool ok = cudaGraphCreate(&graph, 0) == cudaSuccess &&
                  add_copy(&in_node, graph, nullptr, h.static_x, h.x) &&
                  cudaGraphAddChildGraphNode(&body, graph, &in_node, 1, h.graph.raw_cuda_graph()) ==
                      cudaSuccess &&
                  add_copy(&out_node, graph, &body, out, h.static_out) &&
                  cudaGraphInstantiateWithFlags(&exec, graph, 0) == cudaSuccess;
  if (!ok) {
    state.SkipWithError("CUDA refused the hand-made graph");
  } else {
    const cudaStream_t stream = current_stream();
    bool launched = true;
    const auto raw_once = [&] {
      benchmark::DoNotOptimize(raw.forward(raw_inputs).toTensor());
      sync();
    };
    const auto floor_once = [&] {
      launched = launched && cudaGraphLaunch(exec, stream) == cudaSuccess;
      sync();
    };
    for (int i = 0; i < warmup_calls; ++i) {
      raw_once();
      floor_once();
    }
    const paired_medians medians = time_paired(state, raw_once, floor_once);
    state.counters["ceiling"] = medians.runner_us > 0.0 ? medians.raw_us / medians.runner_us : 0.0;
    if (!launched) state.SkipWithError("cudaGraphLaunch failed");
  }
  if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
}
#endif

// For reference, not a target: where a replay's host time goes, the bundled MLP at batch 1:
// the pieces a replay is made of (allocating an output, a 1D device copy, an event record and
// wait, launching the captured graph, pointing a memcpy node of an instantiated graph at other
// tensors), and whole calls (the graphed runner's run, the raw TorchScript call), which leave
// their GPU work queued.
void bm_graphs_host_parts(benchmark::State& state) {
  if (skip_if(state, missing(model_kind::mlp, loader_kind::torchscript))) return;
  const at::Tensor x = make_input(model_kind::mlp, 1);
  sides s = torchscript_sides(model_kind::mlp, x);
  for (int i = 0; i < warmup_calls; ++i) benchmark::DoNotOptimize(s.runner());
  hand_captured_mlp h(1);
  at::cuda::CUDAGraph& graph = h.graph;
  const at::Tensor& static_out = h.static_out;
  graph.replay();
  sync();
  const cudaStream_t stream = current_stream();
  const at::Tensor other = static_out.clone();
  cudaEvent_t event = nullptr;
  cudaGraph_t copy_graph = nullptr;
  cudaGraphExec_t copy_exec = nullptr;
  cudaGraphNode_t copy_node = nullptr;
  bool ok = cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess &&
            cudaGraphCreate(&copy_graph, 0) == cudaSuccess &&
            add_copy(&copy_node, copy_graph, nullptr, other, static_out) &&
            cudaGraphInstantiateWithFlags(&copy_exec, copy_graph, 0) == cudaSuccess;
  const auto options = static_out.options();
  const std::vector<std::int64_t> shape(static_out.sizes().begin(), static_out.sizes().end());
  const std::vector<host_part> parts = {
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
         ok = ok && cudaGraphExecMemcpyNodeSetParams1D(copy_exec, copy_node, other.data_ptr(),
                                                       static_out.data_ptr(), static_out.nbytes(),
                                                       cudaMemcpyDeviceToDevice) == cudaSuccess;
       }},
      {"runner_run_us", [&] { benchmark::DoNotOptimize(s.runner()); }},
      {"raw_call_us", [&] { benchmark::DoNotOptimize(s.raw()); }},
  };
  time_host_parts(state, parts, [] { sync(); });
  sync();
  if (!ok) state.SkipWithError("a CUDA call failed");
  if (copy_exec != nullptr) (void)cudaGraphExecDestroy(copy_exec);
  if (copy_graph != nullptr) (void)cudaGraphDestroy(copy_graph);
  if (event != nullptr) (void)cudaEventDestroy(event);
}
#endif

void register_benchmarks() {
#if TORCHLOOM_HAS_CUDA
  register_once("BM_graphs_host_parts/model:mlp/batch:1", 20, bm_graphs_host_parts);
  for (const std::int64_t batch : {1, 8}) {
    register_once("BM_graphs_floor/model:mlp/batch:" + std::to_string(batch), 3000, bm_graphs_floor,
                  batch);
  }
#if TORCHLOOM_TORCH_VERSION >= 20800
  register_once("BM_graphs_floor_fused/model:mlp/batch:1", 3000, bm_graphs_floor_fused,
                std::int64_t{1});
#endif
#endif
  for (const auto& [mname, m] :
       {std::pair{"mlp", model_kind::mlp}, std::pair{"resnet18", model_kind::resnet18}}) {
    for (const auto& [lname, l] : {std::pair{"torchscript", loader_kind::torchscript},
                                   std::pair{"aoti", loader_kind::aoti}}) {
      for (const std::int64_t batch : {1, 8, 64}) {
        const std::string name = std::string("BM_graphs/model:") + mname + "/loader:" + lname +
                                 "/batch:" + std::to_string(batch);
        register_once(name, calls_for(m, batch), bm_paired_graphs, m, l, batch);
      }
    }
  }
}

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_benchmarks)
