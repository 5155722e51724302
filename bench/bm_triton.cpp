// PERF.md T13, T15 and T16: torchloom's Triton backend served by the in-process Triton core,
// beside what it is compared with, in one core and one loop (docs/serving-comparison.md, "The
// benchmark", lists each comparison's sides, counters and target):
//   BM_serving_t13/device:<cpu|cuda>  the bundled MLP: the same runner called directly, the
//       torchloom backend unbatched and with Triton's dynamic batcher, Triton's stock minimal
//       backend on a request of the same size (what Triton itself costs per request)
//   BM_serving_t15/device:<cpu|cuda>  the bundled MLP, the torchloom backend (graphed_caller on
//       the GPU) against Triton's own PyTorch backend (../shared/triton-peer), same config
//   BM_serving_t16/partition:<green|plain>  a victim model alone, then beside a co-tenant of
//       bf16 GEMMs in the same core, both in green contexts or both plain (the control);
//       measured as bm_isolation's T3 (measure_contention)
// A side that cannot run here (no minimal backend) is left out and named in the benchmark's
// label; a comparison that cannot (no GPU, no GPU-enabled Triton core, no peer) skips saying why.
#include "in_process_requests.hpp"
#include "in_process_triton.hpp"
#include "side_by_side.hpp"

#include "bench/support/clients.hpp"
#include "bench/support/contention.hpp"
#include "bench/support/models.hpp"
#include "tests/support/linear_mlp.hpp"
#include "tests/support/temp_dir.hpp"

#if TORCHLOOM_HAS_CUDA
#include "bench/support/cuda.hpp"
#endif

#include <array>
#include <condition_variable>
#include <numeric>
#include <random>

namespace torchloom_bench {
namespace {

namespace tt = torchloom_triton;

constexpr int client_threads = 8;
constexpr int requests_per_round = 100;  // per client thread
constexpr int requests_one_client = 200;
constexpr int warmup_requests = 50;  // per side, before the rounds
constexpr int iterations = 3;        // rounds per side in a repetition
constexpr int repetitions = 5;
constexpr bool kit_has_gpu = TORCHLOOM_TRITON_KIT_GPU != 0;

// T16's phases (its models have the sizes of bm_isolation's victim and co-tenant).
constexpr int cotenant_clients = 4;
constexpr contention t16_phases{.calls = 1000,
                                .alone_deadline_s = 3.0,
                                .contended_deadline_s = 10.0,
                                .alone_warmup = warmup_requests,
                                .contended_warmup = 10,
                                .saturated_after = 8,
                                .start_timeout = std::chrono::seconds(60),
                                .poll = std::chrono::milliseconds(2),
                                // a request is four GEMMs
                                .flop_per_completion = 8.0 * gemm_size * gemm_size * gemm_size};

// The process's Triton core: its backend directory holds torchloom's backend and, where they
// are, Triton's stock minimal backend and Triton's PyTorch backend; the repository is written
// on demand.
struct serving_fixture {
  torchloom_test::temp_dir dir{"bm-triton"};
  fs::path repository = dir / "models";
  tt::peer_backend peer = tt::find_peer(TORCHLOOM_TRITON_PEER_PREFIX);
  bool has_minimal = false;
  std::unique_ptr<tt::server> server;         // stopped before `dir` is removed
  std::map<std::string, std::string> loaded;  // model -> why it did not load ("" if it did)
  std::mutex mutex;

  serving_fixture() {
    fs::create_directories(repository);
    tt::backend_directory backends(dir / "backends");
    backends.add("torchloom", fs::path(TORCHLOOM_TRITON_BACKEND_DIR) / "torchloom");
    const fs::path minimal = fs::path(TORCHLOOM_TRITON_BACKEND_DIR) / "minimal";
    if (fs::exists(minimal / "libtriton_minimal.so")) {
      backends.add("minimal", minimal);
      has_minimal = true;
    }
    if (peer) backends.add("pytorch", peer.directory);
    server = std::make_unique<tt::server>(
        tt::server_options{{repository.string()}, backends.path().string(), true, {}, false});
  }

  // Writes model `name` (once) and loads it; returns why it did not load, or "".
  std::string ensure(const std::string& name, const std::string& backend, const std::string& body,
                     const fs::path& file) {
    std::lock_guard lock(mutex);
    if (auto it = loaded.find(name); it != loaded.end()) return it->second;
    tt::write_model(repository, name, backend, body, file);
    const auto err = server->load(name);
    return loaded[name] = err ? name + ": " + err->message : std::string();
  }
};

serving_fixture& fixture() {
  return kept<serving_fixture>([] { return std::make_unique<serving_fixture>(); });
}

// Sends one request; throws the response's error.
tt::infer_result send(const std::string& model, const std::vector<tt::tensor_in>& inputs) {
  auto r = fixture().server->infer(model, inputs);
  if (r.error) throw std::runtime_error(model + ": " + r.error->message);
  return r;
}

tt::tensor_in float_input(const std::string& name, const at::Tensor& t) {
  return {name, TRITONSERVER_TYPE_FP32, t.sizes().vec(), t.data_ptr(), t.nbytes()};
}

// Config bodies: one FP32 input and one output, instance groups, batching, parameters.
std::string io(int max_batch, const char* in, const char* in_dims, const char* out,
               const char* out_type, const char* out_dims) {
  return "max_batch_size: " + std::to_string(max_batch) + "\ninput [ { name: \"" + in +
         "\" data_type: TYPE_FP32 dims: [ " + in_dims + " ] } ]\noutput [ { name: \"" + out +
         "\" data_type: " + out_type + " dims: [ " + out_dims + " ] } ]\n";
}

std::string instance(bool on_gpu, int count = 1) {
  return std::string("instance_group [ { kind: ") + (on_gpu ? "KIND_GPU gpus: [ 0 ]" : "KIND_CPU") +
         " count: " + std::to_string(count) + " } ]\n";
}

const char* batching = "dynamic_batching { }\n";

std::string parameter(const std::string& key, const std::string& value) {
  return "parameters { key: \"" + key + "\" value { string_value: \"" + value + "\" } }\n";
}

// The bundled MLP's config body: x FP32 [64] -> y FP32 [16], max_batch_size 64.
std::string mlp_body(bool on_gpu, bool batched, const std::string& parameters = {}) {
  return io(64, "x", "64", "y", "TYPE_FP32", "16") + instance(on_gpu) + (batched ? batching : "") +
         parameters;
}

// Why `device` cannot be served here, or "".
std::string device_unavailable(c10::Device device) {
  if (!device.is_cuda()) return {};
  if (!torch::cuda::is_available()) return "no CUDA device";
  if (!kit_has_gpu) return "the Triton kit is a CPU-only build (TRITON_KIT_GPU=1 builds a GPU one)";
  return {};
}

// One side of a comparison: its counter label, one request (client thread, index), and
// whether it is also measured with one client (latency without queueing; not for a batched
// side, whose lone requests would only wait out the batcher's delay).
struct side {
  std::string label;
  std::function<void(int, int)> request;
  bool one_client = true;
  std::string model = {};  // the served model, for Triton's statistics; "" when not served
};

// Where a served side's requests spent their time, from Triton's own statistics over the
// timed rounds: queue, compute_input (the backend gathering inputs), compute_infer (the run)
// and compute_output (the backend answering), as the core counts them for any backend (a
// batched request is charged its whole batch's time).
struct triton_split {
  static constexpr std::array<const char*, 4> parts = {"queue", "compute_input", "compute_infer",
                                                       "compute_output"};
  std::array<std::uint64_t, 4> ns{};
  std::uint64_t requests = 0;

  static triton_split of(const std::string& model) {
    triton_split t;
    if (model.empty()) return t;
    const auto& server = *fixture().server;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      t.ns[i] = server.duration(model, parts[i], "ns");
    }
    t.requests = server.duration(model, "success", "count");
    return t;
  }
  // Each part's microseconds per request between `before` and this one, as counters
  // <label>_queue_us, <label>_compute_input_us, ...
  void set_counters(benchmark::State& state, const std::string& label,
                    const triton_split& before) const {
    const std::uint64_t n = requests - before.requests;
    if (n == 0) return;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const double us = static_cast<double>(ns[i] - before.ns[i]) / 1e3;
      state.counters[label + "_" + parts[i] + "_us"] = us / static_cast<double>(n);
    }
  }
};

// Warms every side up, then runs `iterations` times a round of every side with 8 clients
// (`requests_per_round` each) and, for the sides that have one, a round with one client
// (`requests_one_client`), the sides in a shuffled order. Sets each side's counters:
// <side>_p50_us, <side>_p99_us and <side>_rps with 8 clients, <side>_one_... with one, and
// for a served side Triton's split (<side>_queue_us, ...). Skips with the first failure.
void compare(benchmark::State& state, std::vector<side>& sides, unsigned seed) {
  for (auto& s : sides) {
    for (int i = 0; i < warmup_requests; ++i) s.request(0, i);
  }
  std::vector<client_samples> samples(sides.size());
  std::vector<client_samples> alone(sides.size());
  std::vector<std::size_t> order(sides.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 rng(seed);
  std::vector<triton_split> split_before;
  for (const auto& s : sides) split_before.push_back(triton_split::of(s.model));
  for (auto _ : state) {
    std::shuffle(order.begin(), order.end(), rng);
    double seconds = 0.0;
    for (const std::size_t k : order) {
      const double before = samples[k].seconds;
      client_round(client_threads, requests_per_round, sides[k].request, samples[k]);
      seconds += samples[k].seconds - before;
      if (sides[k].one_client) {
        client_round(1, requests_one_client, sides[k].request, alone[k]);
      }
    }
    state.SetIterationTime(seconds);
  }
  for (std::size_t k = 0; k < sides.size(); ++k) {
    for (const auto* s : {&samples[k], &alone[k]}) {
      if (!s->error.empty()) {
        state.SkipWithError((sides[k].label + ": " + s->error).c_str());
        return;
      }
    }
    set_client_counters(state, sides[k].label, samples[k]);
    if (sides[k].one_client) set_client_counters(state, sides[k].label + "_one", alone[k]);
    triton_split::of(sides[k].model).set_counters(state, sides[k].label, split_before[k]);
  }
}

// A lock that lets its waiters in in the order they came, as a model instance takes the
// requests queued for it (std::mutex lets a thread that just unlocked take it again).
class fifo_lock {
 public:
  void lock() {
    std::unique_lock guard(mutex_);
    const std::uint64_t mine = next_++;
    turn_.wait(guard, [&] { return serving_ == mine; });
  }
  void unlock() {
    {
      std::lock_guard guard(mutex_);
      ++serving_;
    }
    turn_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable turn_;
  std::uint64_t next_ = 0;
  std::uint64_t serving_ = 0;
};

// Random batch-1 inputs of the bundled MLP, one per client thread (never zeros: PERF.md).
struct mlp_inputs {
  std::vector<at::Tensor> x;
  mlp_inputs() {
    torch::manual_seed(42);
    for (int t = 0; t < client_threads; ++t) x.push_back(torch::rand({1, 64}) + 0.1);
  }
};

// A side that sends the thread's input to `model` as `input_name`.
side served(const std::string& label, const std::string& model, const std::string& input_name,
            const mlp_inputs& in, bool batched = false) {
  return {label,
          [model, input_name, &in](int t, int) {
            send(model, {float_input(input_name, in.x[static_cast<std::size_t>(t)])});
          },
          !batched, model};
}

using direct_runner = torchloom::model_runner<torchloom::torchscript_loader>;
per_device<direct_runner> direct_runners([](c10::Device d) {
  return std::make_unique<direct_runner>(bundled_spec(), d);
});

void bm_t13(benchmark::State& state, c10::Device device) {
  if (skip_if(state, device_unavailable(device))) return;
  auto& f = fixture();
  const bool on_gpu = device.is_cuda();
  const std::string tl = std::string("mlp_torchloom") + (on_gpu ? "_cuda" : "_cpu");
  const std::string tl_batched = tl + "_batched";
  for (const auto& [name, batched] : {std::pair{tl, false}, std::pair{tl_batched, true}}) {
    if (skip_if(state, f.ensure(name, "torchloom", mlp_body(on_gpu, batched), bundled_file()))) {
      return;
    }
  }
  static const mlp_inputs in;
  direct_runner& runner = direct_runners(device);
  static fifo_lock one_at_a_time;
  std::vector<side> sides = {
      {"runner",
       [&runner, device](int t, int) {
         std::lock_guard lock(one_at_a_time);
         const at::Tensor x = in.x[static_cast<std::size_t>(t)].to(device);
         benchmark::DoNotOptimize(runner.run({x}).at(0).to(c10::kCPU));
       }},
      served("torchloom", tl, "x", in),
      served("torchloom_batched", tl_batched, "x", in, true),
  };
  if (f.has_minimal) {
    // Triton's own cost per request: the minimal backend on the CPU, for both devices.
    const std::string echo_io = io(64, "IN0", "64", "OUT0", "TYPE_INT32", "4") + instance(false);
    if (skip_if(state, f.ensure("echo", "minimal", echo_io, {})) ||
        skip_if(state, f.ensure("echo_batched", "minimal", echo_io + batching, {}))) {
      return;
    }
    sides.push_back(served("minimal", "echo", "IN0", in));
    sides.push_back(served("minimal_batched", "echo_batched", "IN0", in, true));
  }
  state.SetLabel(f.has_minimal ? "" : "no minimal backend");
  compare(state, sides, 13);
}

void bm_t15(benchmark::State& state, c10::Device device) {
  if (skip_if(state, device_unavailable(device))) return;
  auto& f = fixture();
  if (skip_if(state, f.peer ? "" : f.peer.why_missing)) return;
  const bool on_gpu = device.is_cuda();
  // On the GPU, torchloom replays CUDA graphs on its run stream; both backends otherwise get
  // the same config.
  const std::string stream = on_gpu ? parameter("TORCHLOOM_STREAM", "graphed_caller") : "";
  const std::string suffix = on_gpu ? "_cuda" : "_cpu";
  struct model {
    std::string label;
    std::string backend;
    bool batched;
  };
  const std::vector<model> models = {{"torchloom", "torchloom", false},
                                     {"torchloom_batched", "torchloom", true},
                                     {"pytorch", "pytorch", false},
                                     {"pytorch_batched", "pytorch", true}};
  for (const auto& m : models) {
    const std::string body = mlp_body(on_gpu, m.batched, m.backend == "torchloom" ? stream : "");
    if (skip_if(state, f.ensure("t15_" + m.label + suffix, m.backend, body, bundled_file()))) {
      return;
    }
  }
  static const mlp_inputs in;
  std::vector<side> sides;
  for (const auto& m : models) {
    sides.push_back(served(m.label, "t15_" + m.label + suffix, "x", in, m.batched));
  }
  compare(state, sides, 15);
  // After the rounds (graphs captured and replaying): the same request, the same bytes?
  guarded(state, [&] {
    const auto ours = send("t15_torchloom" + suffix, {float_input("x", in.x[0])});
    const auto peer = send("t15_pytorch" + suffix, {float_input("x", in.x[0])});
    const bool same = ours.outputs.size() == 1 && peer.outputs.size() == 1 &&
                      ours.outputs[0].data == peer.outputs[0].data;
    state.counters["identical"] = same ? 1.0 : 0.0;
  });
}

// T16's model files, written on first use: the victim (fp32, 64 MiB of weights) and the
// co-tenant (bf16, 256 MiB).
struct t16_files {
  fs::path victim;
  fs::path gemm;
};

const t16_files& t16_models() {
  static const t16_files files = [] {
    const fs::path dir = fixture().dir / "files";
    fs::create_directories(dir / "victim");
    fs::create_directories(dir / "gemm");
    torch::manual_seed(0);
    torch::jit::Module victim =
        torchloom_test::linear_mlp("serving_victim", victim_width, "y[:, 0:16]");
    t16_files out{dir / "victim" / "model.pt", dir / "gemm" / "model.pt"};
    victim.save(out.victim.string());
    // b scaled by 1/sqrt(n) keeps every product's entries near 1: no overflow, never zeros.
    torch::jit::Module gemm("serving_gemm");
    gemm.register_parameter("a", torch::randn({gemm_size, gemm_size}).to(torch::kBFloat16), false);
    gemm.register_parameter(
        "b",
        (torch::randn({gemm_size, gemm_size}) / std::sqrt(static_cast<double>(gemm_size)))
            .to(torch::kBFloat16),
        false);
    gemm.define(R"(
def forward(self, x):
    c = torch.matmul(self.a, self.b)
    c = torch.matmul(c, self.b)
    c = torch.matmul(c, self.b)
    c = torch.matmul(c, self.b)
    return x + c[0, 0:4].float()
)");
    gemm.save(out.gemm.string());
    return out;
  }();
  return files;
}

void bm_t16(benchmark::State& state, bool green) {
  if (skip_if(state, device_unavailable(gpu))) return;
  auto& f = fixture();
  const t16_files& files = t16_models();
  const std::string tag = green ? "green" : "plain";
  const std::string victim = "t16_victim_" + tag;
  const std::string gemm = "t16_gemm_" + tag;
  const std::string sms = parameter("GREEN_CONTEXT_SM_COUNT", green_sms);
  const auto stream = [&](const char* policy) {
    return green ? parameter("TORCHLOOM_STREAM", policy) + sms : "";
  };
  const std::string victim_body =
      io(0, "x", "64, 2048", "y", "TYPE_FP32", "64, 16") + instance(true) + stream("green");
  const std::string gemm_body =
      io(0, "x", "4", "y", "TYPE_FP32", "4") + instance(true, 2) + stream("green_complement");
  if (skip_if(state, f.ensure(victim, "torchloom", victim_body, files.victim)) ||
      skip_if(state, f.ensure(gemm, "torchloom", gemm_body, files.gemm))) {
    return;
  }
  contention c = t16_phases;
#if TORCHLOOM_HAS_CUDA
  const int all_sms = device_sm_count();
#else
  const int all_sms = 0;
#endif
  c.victim_sms = green ? std::atoi(green_sms) : all_sms;
  c.cotenant_sms = green ? all_sms - c.victim_sms : all_sms;
  torch::manual_seed(42);
  const at::Tensor x = torch::rand({64, victim_width}) + 0.1;
  const auto victim_request = [&] { send(victim, {float_input("x", x)}); };
  guarded(state, [&] {
    measure_contention(
        state, c, victim_request,
        [&](int requests) {
          for (int i = 0; i < requests; ++i) victim_request();
        },
        // Client threads that keep the co-tenant model busy.
        [&] {
          return std::make_unique<cotenant_threads>(
              cotenant_clients,
              [gemm](const std::atomic<bool>& stop, std::atomic<std::int64_t>& completed) {
                const at::Tensor in = torch::rand({4}) + 0.5;
                while (!stop.load()) {
                  send(gemm, {float_input("x", in)});
                  completed.fetch_add(1);
                }
              });
        });
  });
}

void register_benchmarks() {
  for (const auto& [label, device] :
       {std::pair{"cpu", c10::Device(c10::kCPU)}, std::pair{"cuda", gpu}}) {
    for (const auto& [name, fn] : {std::pair{"BM_serving_t13/device:", &bm_t13},
                                   std::pair{"BM_serving_t15/device:", &bm_t15}}) {
      // One repetition where the device is missing: the skip is reported once.
      const int reps = device_unavailable(device).empty() ? repetitions : 1;
      with_spread(benchmark::RegisterBenchmark((name + std::string(label)).c_str(), fn, device),
                  reps)
          ->UseManualTime()
          ->Iterations(iterations)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const bool green : {true, false}) {
    register_manual(green ? "BM_serving_t16/partition:green" : "BM_serving_t16/partition:plain",
                    benchmark::kMicrosecond, bm_t16, green);
  }
}

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_benchmarks)
