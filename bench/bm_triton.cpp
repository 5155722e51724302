// PERF.md T13: the torchloom Triton backend in the in-process Triton core. 8 client threads
// send requests of batch 1 to the bundled model; each benchmark reports requests/s and the
// p50/p99 request latency:
//   BM_runner_direct        the same runner called directly by the 8 threads (no Triton)
//   BM_triton_torchloom     served by libtriton_torchloom.so, each request executed alone
//   BM_triton_torchloom_dynamic_batching   the same with Triton's dynamic batcher on
//   BM_triton_minimal[...]  Triton's stock "minimal" example backend (OUT0 = IN0) on a request
//                           of the same input size: what Triton itself costs per request
#include <torchloom/torchloom.hpp>

#include "in_process_triton.hpp"

#include "bench/support/stats.hpp"
#include "tests/support/temp_dir.hpp"

#include <benchmark/benchmark.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace tt = torchloom_triton;
using torchloom_test::write_file;

constexpr int client_threads = 8;
constexpr int requests_per_thread = 250;

// The inputs and outputs of a test model's config.pbtxt: one input of 64 floats as the
// bundled model's, one output, one CPU instance.
std::string io_config(const std::string& input, const std::string& output,
                      const std::string& output_type, int output_dims) {
  return "max_batch_size: 64\ninput [ { name: \"" + input +
         "\" data_type: TYPE_FP32 dims: [ 64 ] } ]\noutput [ { name: \"" + output +
         "\" data_type: " + output_type + " dims: [ " + std::to_string(output_dims) +
         " ] } ]\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n";
}
const std::string mlp_io = io_config("x", "y", "TYPE_FP32", 16);
// The minimal backend reads IN0 and answers OUT0 from the same bytes: a 64-float input as for
// the bundled model, the first 4 values back.
const std::string echo_io = io_config("IN0", "OUT0", "TYPE_INT32", 4);
const char* batching = "dynamic_batching { max_queue_delay_microseconds: 100 }\n";

// The benchmark's model repository in a temporary directory, and the server on it.
struct fixture {
  torchloom_test::temp_dir dir{"bm-triton"};
  std::unique_ptr<tt::server> server;  // stopped before `dir` is removed

  fixture() {
    for (const std::string name : {"mlp", "mlp_batched"}) {
      fs::create_directories(dir / name / "1");
      fs::copy_file(fs::path(TORCHLOOM_BUNDLED_MODEL_DIR) / "1" / "model.pt",
                    dir / name / "1" / "model.pt");
      write_file(dir / name / "config.pbtxt",
                 "name: \"" + name + "\"\nbackend: \"torchloom\"\n" + mlp_io +
                     (name == "mlp" ? "" : batching));
    }
    std::vector<std::string> models = {"mlp", "mlp_batched"};
#if TORCHLOOM_TRITON_HAS_MINIMAL
    for (const std::string name : {"echo", "echo_batched"}) {
      fs::create_directories(dir / name / "1");
      write_file(dir / name / "config.pbtxt", "name: \"" + name + "\"\nbackend: \"minimal\"\n" +
                                                  echo_io + (name == "echo" ? "" : batching));
      models.push_back(name);
    }
#endif
    server = std::make_unique<tt::server>(tt::server_options{
        {dir.path().string()}, TORCHLOOM_TRITON_BACKEND_DIR, true, models, false});
  }
};

fixture& triton() {
  static fixture f;
  return f;
}

// Runs `request` from client_threads threads, requests_per_thread times each, and reports
// requests/s and the p50/p99 latency of one request.
void run_clients(benchmark::State& state, const std::function<void()>& request) {
  for (int i = 0; i < 20; ++i) request();  // warm up
  std::vector<double> latencies;
  double seconds = 0;
  std::int64_t requests = 0;
  for (auto _ : state) {
    std::mutex mutex;
    std::vector<std::thread> clients;
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < client_threads; ++t) {
      clients.emplace_back([&] {
        std::vector<double> mine;
        mine.reserve(requests_per_thread);
        for (int i = 0; i < requests_per_thread; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          request();
          mine.push_back(
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
        std::lock_guard lock(mutex);
        latencies.insert(latencies.end(), mine.begin(), mine.end());
      });
    }
    for (auto& c : clients) c.join();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(s);
    seconds += s;
    requests += client_threads * requests_per_thread;
  }
  std::sort(latencies.begin(), latencies.end());
  state.counters["requests_per_s"] = static_cast<double>(requests) / seconds;
  state.counters["p50_us"] = torchloom_bench::nearest_rank(latencies, 0.50);
  state.counters["p99_us"] = torchloom_bench::nearest_rank(latencies, 0.99);
  state.SetItemsProcessed(requests);
}

void BM_runner_direct(benchmark::State& state) {
  using runner = torchloom::model_runner<torchloom::torchscript_loader>;
  static runner r(torchloom::model_spec::from_directory(TORCHLOOM_BUNDLED_MODEL_DIR));
  const at::Tensor x = torch::randn({1, 64});
  run_clients(state, [&] { benchmark::DoNotOptimize(r.run({x})); });
}

void serve(benchmark::State& state, const std::string& model, const std::string& input) {
  auto& server = *triton().server;
  const at::Tensor x = torch::randn({1, 64});
  const tt::tensor_in in{input, TRITONSERVER_TYPE_FP32, {1, 64}, x.data_ptr(), x.nbytes()};
  const auto first = server.infer(model, {in});
  if (first.error) {
    state.SkipWithError(first.error->message.c_str());
    return;
  }
  run_clients(state, [&] {
    const auto r = server.infer(model, {in});
    if (r.error) throw std::runtime_error(r.error->message);
  });
}

void BM_triton_torchloom(benchmark::State& state) { serve(state, "mlp", "x"); }
void BM_triton_torchloom_dynamic_batching(benchmark::State& state) {
  serve(state, "mlp_batched", "x");
}

}  // namespace

BENCHMARK(BM_runner_direct)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_triton_torchloom)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_triton_torchloom_dynamic_batching)
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

#if TORCHLOOM_TRITON_HAS_MINIMAL
namespace {
void BM_triton_minimal(benchmark::State& state) { serve(state, "echo", "IN0"); }
void BM_triton_minimal_dynamic_batching(benchmark::State& state) {
  serve(state, "echo_batched", "IN0");
}
}  // namespace
BENCHMARK(BM_triton_minimal)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_triton_minimal_dynamic_batching)
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
#endif

BENCHMARK_MAIN();
