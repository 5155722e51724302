// graphed<Stream>: CUDA graph replay as a stream-policy adaptor. On CPU it is the wrapped
// policy; on CUDA its outputs are bitwise those of the eager run for every wrapped policy,
// both loaders and the residency policies it accepts, a new input signature is captured
// anew, CUDA_GRAPH_MAX_SHAPES bounds the graphs kept, batch buckets pad and slice, the
// caller's stream sees the outputs, a model that cannot be captured runs eagerly, and
// concurrent callers get their own results.
#include "../../support/aoti_fixtures.hpp"
#include "../../support/fixtures.hpp"
#include "../../support/streams.hpp"

#include <torchloom/torchloom.hpp>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#if TORCHLOOM_HAS_CUDA
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using torchloom::graphed;
using torchloom::model_spec;
using torchloom_test::pool_cuda_stream;
using torchloom_test::temp_dir;

namespace {

template <class Stream, class Residency = torchloom::resident_weights>
using ts_runner =
    torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, Stream, Residency>;

const c10::Device gpu(c10::kCUDA, 0);

// Two layers, [batch, 64] -> [batch, 16], random weights: kernels enough to capture.
torch::jit::Module make_mlp() {
  torch::jit::Module m("mlp");
  m.register_parameter("w1", torch::randn({128, 64}) * 0.1, false);
  m.register_parameter("b1", torch::randn({128}), false);
  m.register_parameter("w2", torch::randn({16, 128}) * 0.1, false);
  m.register_parameter("b2", torch::randn({16}), false);
  m.define(R"(
def forward(self, x):
    return torch.linear(torch.relu(torch.linear(x, self.w1, self.b1)), self.w2, self.b2)
)");
  return m;
}

// The MLP with two outputs: a tuple output is rebuilt from the graph's tensors.
torch::jit::Module make_two_outputs() {
  torch::jit::Module m("two");
  m.register_parameter("w1", torch::randn({32, 64}) * 0.1, false);
  m.define(R"(
def forward(self, x):
    h = torch.linear(x, self.w1)
    return (torch.relu(h), h.sum(1))
)");
  return m;
}

// Reads a value back on the host (bool(...) of a CUDA tensor): it cannot be captured.
torch::jit::Module make_host_sync() {
  torch::jit::Module m("sync");
  m.register_parameter("w1", torch::randn({16, 64}), false);
  m.define(R"(
def forward(self, x):
    y = torch.linear(x, self.w1)
    if bool(y.sum() > 0.0):
        return y * 2.0
    return y - 1.0
)");
  return m;
}

struct model_dir {
  temp_dir dir;
  explicit model_dir(torch::jit::Module m) { torchloom_test::write_triton_model(dir / "m", m); }
  model_spec spec() const { return model_spec::from_directory(dir / "m"); }
};

at::Tensor input(std::int64_t batch, int seed, c10::Device device = gpu) {
  torch::manual_seed(seed);
  return torch::randn({batch, 64}).to(device);
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && torch::equal(a.cpu(), b.cpu());
}

#if TORCHLOOM_HAS_CUDA
// Bytes of torch's caching allocator on cuda:0 in blocks that are not free: handed out, or
// given back but waiting (for events on the streams that used them) to be reused.
std::int64_t active_bytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.active_bytes[0].current;
}
#endif

}  // namespace

TEMPLATE_TEST_CASE("graphed on CPU is the wrapped policy", "[stream][graphs]",
                   torchloom::caller_stream, torchloom::pool_stream) {
  model_dir m(make_mlp());
  ts_runner<TestType> plain(m.spec());
  ts_runner<graphed<TestType>> g(m.spec());
  for (int i = 0; i < 4; ++i) {
    const auto x = input(3, i, c10::Device(c10::kCPU));
    CHECK(bitwise_equal(g.run({x})[0], plain.run({x})[0]));
    CHECK(bitwise_equal(g.run_tensors({x})[0], plain.run({x})[0]));
  }
  const torchloom::graph_stats s = g.stream().stats();
  CHECK(s.captures == 0);
  CHECK(s.replays == 0);
  CHECK(s.cached_graphs == 0);
}

TEST_CASE("graphed: the wrapped policy is reachable and the adaptor is a stream policy",
          "[stream][graphs]") {
  STATIC_REQUIRE(torchloom::stream_policy<graphed<torchloom::caller_stream>>);
  STATIC_REQUIRE(torchloom::stream_policy<graphed<torchloom::pool_stream>>);
  STATIC_REQUIRE(torchloom::stream_policy<graphed<torchloom::adaptive_stream>>);
  STATIC_REQUIRE(
      std::is_same_v<graphed<torchloom::pool_stream>::stream_type, torchloom::pool_stream>);
  STATIC_REQUIRE(torchloom::detail::graph_capturable<torchloom::mapped_weights>);
  STATIC_REQUIRE(torchloom::detail::graph_capturable<torchloom::shared_weights>);
  STATIC_REQUIRE(!torchloom::detail::graph_capturable<torchloom::streamed_weights>);
}

TEMPLATE_TEST_CASE("CUDA: graphed replays are bitwise the eager run, TorchScript",
                   "[stream][graphs][cuda]", torchloom::caller_stream, torchloom::pool_stream,
                   torchloom::adaptive_stream) {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<TestType> plain(m.spec(), gpu);
  ts_runner<graphed<TestType>> g(m.spec(), gpu);
  std::vector<at::Tensor> kept;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 8; ++i) {
    const auto x = input(4, i);
    kept.push_back(g.run({x})[0]);
    expected.push_back(plain.run({x})[0]);
  }
  // Every output is the caller's own: later replays did not overwrite earlier outputs.
  for (std::size_t i = 0; i < kept.size(); ++i) {
    INFO("run " << i);
    CHECK(bitwise_equal(kept[i], expected[i]));
  }
  const auto s = g.stream().stats();
  CHECK(s.eager_runs == torchloom::graph_eager_runs_before_capture);
  CHECK(s.captures == 1);
  CHECK(s.replays == 8 - s.eager_runs);
  CHECK(s.cached_graphs == 1);
  // run_tensors and a tuple output go through the same graphs.
  CHECK(bitwise_equal(g.run_tensors({input(4, 99)})[0], plain.run({input(4, 99)})[0]));
}

TEST_CASE("CUDA: graphed replays read an input tensor refilled in place, and keep earlier "
          "outputs",
          "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  // One input tensor for every run (the same address each time), new values in it each time.
  at::Tensor x = input(4, 0);
  std::vector<at::Tensor> kept;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 8; ++i) {
    x.copy_(input(4, i));
    kept.push_back(g.run({x})[0]);
    expected.push_back(plain.run({x})[0]);
  }
  for (std::size_t i = 0; i < kept.size(); ++i) {
    INFO("run " << i);
    CHECK(bitwise_equal(kept[i], expected[i]));
  }
  // Outputs dropped at once: the allocator hands the same block out again.
  for (int i = 0; i < 4; ++i) {
    x.copy_(input(4, 20 + i));
    const at::Tensor want = plain.run({x})[0];
    CHECK(bitwise_equal(g.run({x})[0], want));
  }
  CHECK(g.stream().stats().replays == 12 - torchloom::graph_eager_runs_before_capture);
}

TEST_CASE("CUDA: graphed rebuilds a tuple output from fresh tensors", "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_two_outputs());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  for (int i = 0; i < 5; ++i) {
    const auto got = g.run({input(2, i)});
    const auto want = plain.run({input(2, i)});
    REQUIRE(got.size() == 2);
    CHECK(bitwise_equal(got[0], want[0]));
    CHECK(bitwise_equal(got[1], want[1]));
  }
  CHECK(g.stream().stats().replays == 3);
}

TEMPLATE_TEST_CASE("CUDA: graphed works with shared_weights and mapped_weights",
                   "[stream][graphs][cuda]", torchloom::shared_weights, torchloom::mapped_weights) {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>, TestType> g(m.spec(), gpu);
  for (int i = 0; i < 6; ++i) {
    CHECK(bitwise_equal(g.run({input(8, i)})[0], plain.run({input(8, i)})[0]));
  }
  CHECK(g.stream().stats().replays == 4);
}

TEST_CASE("CUDA: graphed captures each new input shape and keeps both", "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  for (int round = 0; round < 3; ++round) {
    for (const std::int64_t batch : {4, 8}) {
      for (int i = 0; i < 3; ++i) {
        const auto x = input(batch, round * 10 + i);
        CHECK(bitwise_equal(g.run({x})[0], plain.run({x})[0]));
      }
    }
  }
  const auto s = g.stream().stats();
  CHECK(s.captures == 2);  // one per shape, never again
  CHECK(s.cached_graphs == 2);
  CHECK(s.evictions == 0);
  CHECK(s.replays == 18 - 2 * torchloom::graph_eager_runs_before_capture);
}

TEST_CASE("CUDA: CUDA_GRAPH_MAX_SHAPES drops the least recently used graph",
          "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec().set("CUDA_GRAPH_MAX_SHAPES", "2"), gpu);
  const auto run_thrice = [&](std::int64_t batch) {
    for (int i = 0; i < 3; ++i) {
      const auto x = input(batch, static_cast<int>(batch) * 100 + i);
      CHECK(bitwise_equal(g.run({x})[0], plain.run({x})[0]));
    }
  };
  run_thrice(1);
  run_thrice(2);
  run_thrice(1);  // 1 is now the most recently used
  CHECK(g.stream().stats().captures == 2);
  run_thrice(3);  // pushes 2 out
  auto s = g.stream().stats();
  CHECK(s.evictions == 1);
  CHECK(s.cached_graphs == 2);
  run_thrice(1);  // still cached: replayed, not captured
  CHECK(g.stream().stats().captures == 3);
  run_thrice(2);  // was dropped: eager twice, captured again
  s = g.stream().stats();
  CHECK(s.captures == 4);
  CHECK(s.evictions == 2);
}

TEST_CASE("CUDA: CUDA_GRAPH_BATCH_SIZES pads to the next bucket and slices the outputs back",
          "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(
      m.spec().set("CUDA_GRAPH_BATCH_SIZES", "4,8"), gpu);
  for (int round = 0; round < 3; ++round) {
    for (std::int64_t batch = 1; batch <= 8; ++batch) {
      const auto x = input(batch, round * 100 + static_cast<int>(batch));
      const auto got = g.run({x})[0];
      REQUIRE(got.size(0) == batch);
      // Rows are independent: the real rows of the bucket's run. The eager run at the real
      // batch may pick other GEMM kernels, so it is compared with a tolerance; the bucket's
      // own eager run on the padded input bitwise.
      const std::int64_t bucket = batch <= 4 ? 4 : 8;
      const auto padded = torch::cat({x, torch::zeros({bucket - batch, 64}, x.options())});
      CHECK(torch::allclose(got, plain.run({x})[0], 1e-5, 1e-5));
      if (round > 0) {
        CHECK(bitwise_equal(got, plain.run({padded})[0].narrow(0, 0, batch)));
      }
    }
  }
  const auto s = g.stream().stats();
  CHECK(s.captures == 2);  // buckets 4 and 8, for eight batch sizes
  CHECK(s.cached_graphs == 2);
  // A batch above the largest bucket is a signature of its own, not padded.
  for (int i = 0; i < 3; ++i) CHECK(g.run({input(9, i)})[0].size(0) == 9);
  CHECK(g.stream().stats().captures == 3);
}

TEMPLATE_TEST_CASE("CUDA: graphed outputs read on the caller's stream right after run() are "
                   "correct",
                   "[stream][graphs][cuda]", torchloom::caller_stream, torchloom::pool_stream,
                   torchloom::adaptive_stream) {
  TORCHLOOM_REQUIRE_CUDA();
  const torchloom_test::busy_caller check;
  ts_runner<graphed<TestType>> r(check.spec(), gpu);
  // A replay that did not wait for the caller would copy the input in early, and a caller
  // that did not wait for the replay would read the outputs early.
  CHECK(check.wrong_outputs(r, 300) == 0);
  CHECK(r.stream().stats().replays >= 290);
}

TEST_CASE("CUDA: graphed replays on two caller streams in turn wait for each other",
          "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  const c10::Stream a = pool_cuda_stream();
  const c10::Stream b = pool_cuda_stream();  // the pool hands out its streams in turn
  REQUIRE(a != b);
  // Contiguous inputs are copied in by the replay's one launch; transposed ones by a copy
  // before the graph's launch, on the run's stream: a replay on b that did not wait for the
  // last one on a would overwrite the graph's input buffer before a's replay read it.
  const bool contiguous = GENERATE(true, false);
  INFO((contiguous ? "contiguous inputs" : "transposed inputs"));
  constexpr int runs = 40;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < runs; ++i) {
    inputs.push_back(contiguous ? input(8, 500 + i) : input(64, 500 + i).narrow(1, 0, 8).t());
    expected.push_back(plain.run({inputs.back()})[0]);
  }
  const auto slow = torch::rand({2048, 2048}, torch::kCUDA);
  torch::cuda::synchronize();
  std::vector<at::Tensor> got;
  for (int i = 0; i < runs; ++i) {
    c10::StreamGuard on(i % 2 == 0 ? a : b);
    if (i % 2 == 0) (void)at::matmul(slow, slow);  // a is busy before each of its runs
    got.push_back(g.run({inputs[static_cast<std::size_t>(i)]})[0]);
  }
  torch::cuda::synchronize();
  for (int i = 0; i < runs; ++i) {
    INFO("run " << i << " on stream " << (i % 2 == 0 ? "a" : "b"));
    CHECK(bitwise_equal(got[static_cast<std::size_t>(i)], expected[static_cast<std::size_t>(i)]));
  }
  CHECK(g.stream().stats().replays == runs - torchloom::graph_eager_runs_before_capture);
}

// [capture-fails]: its failed capture is two CUDA API errors by design (scripts/gpu.sh runs it
// under memcheck apart, without API error reports).
TEST_CASE("CUDA: a model that cannot be captured runs eagerly, with correct outputs",
          "[stream][graphs][cuda][capture-fails]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_host_sync());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  for (int i = 0; i < 6; ++i) {
    CHECK(bitwise_equal(g.run({input(4, i)})[0], plain.run({input(4, i)})[0]));
  }
  const auto s = g.stream().stats();
  CHECK(s.captures == 1);  // tried once, never again for this signature
  CHECK(s.uncapturable == 1);
  CHECK(s.replays == 0);
  CHECK(s.eager_runs == 6);
  CHECK(s.cached_graphs == 0);
  // The runner, and CUDA, are fine afterwards.
  CHECK(bitwise_equal(g.run({input(2, 7)})[0], plain.run({input(2, 7)})[0]));
}

TEST_CASE("CUDA: under torch's uncached allocator graphed runs eagerly, with correct outputs",
          "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  // Read when the runner is made (torch itself read it at its start and keeps caching).
  ::setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", 1);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  ::unsetenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
  for (int i = 0; i < 5; ++i) {
    CHECK(bitwise_equal(g.run({input(4, i)})[0], plain.run({input(4, i)})[0]));
  }
  const auto s = g.stream().stats();
  CHECK(s.uncapturable == 1);
  CHECK(s.replays == 0);
  CHECK(s.eager_runs == 5);
}

TEMPLATE_TEST_CASE("CUDA: concurrent callers of one graphed runner get their own results",
                   "[stream][graphs][cuda][concurrency]", torchloom::caller_stream,
                   torchloom::pool_stream) {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<TestType>> g(m.spec(), gpu);
  constexpr int threads = 4;
  constexpr int runs = 200;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> expected;
  for (int t = 0; t < threads; ++t) {
    inputs.push_back(input(8, 1000 + t));
    expected.push_back(plain.run({inputs.back()})[0]);
  }
  torch::cuda::synchronize();
  std::atomic<int> wrong{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // Each caller on a stream of its own, as a server's threads are.
      c10::StreamGuard guard(pool_cuda_stream());
      for (int i = 0; i < runs; ++i) {
        const auto out = g.run({inputs[static_cast<std::size_t>(t)]})[0];
        if (!torch::equal(out, expected[static_cast<std::size_t>(t)])) ++wrong;
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(wrong == 0);
  const auto s = g.stream().stats();
  CHECK(s.captures == 1);
  CHECK(s.replays + s.eager_runs == threads * runs);
}

TEST_CASE("CUDA: graphed replays are bitwise the eager run, AOTInductor",
          "[stream][graphs][cuda][aoti]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "mlp_cuda");
#if TORCHLOOM_TORCH_VERSION >= 20600
  using plain_t = torchloom::model_runner<torchloom::aoti_loader>;
  using graphed_t = torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook,
                                            graphed<torchloom::caller_stream>>;
  plain_t plain(model_spec::from_directory(dir), gpu);
  graphed_t g(model_spec::from_directory(dir), gpu);
  for (const std::int64_t batch : {4, 8, 4}) {
    for (int i = 0; i < 4; ++i) {
      const auto x = input(batch, i);
      CHECK(bitwise_equal(g.run_tensors({x})[0], plain.run_tensors({x})[0]));
      CHECK(bitwise_equal(g.run({x})[0], plain.run({x})[0]));
    }
  }
  const auto s = g.stream().stats();
  CHECK(s.captures == 2);
  CHECK(s.uncapturable == 0);
  CHECK(s.replays > 0);
#endif
}

// A replay whose launch went out and which then failed (an output that cannot be allocated,
// a copy that fails; here the test switch torchloom::detail::fail_next_replay_after_launch)
// must still be the one the next replay waits for: otherwise the next replay, on another
// stream, writes the graph's buffers while the failed one still runs in them.
TEST_CASE("CUDA: a replay that fails after its launch still orders the next replay after it",
          "[stream][graphs][cuda][hazards]") {
  TORCHLOOM_REQUIRE_CUDA();
#if TORCHLOOM_CUDA_GRAPHS
  model_dir m(torchloom_test::make_slow_chain());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  const c10::Stream a = pool_cuda_stream();
  const c10::Stream b = pool_cuda_stream();
  REQUIRE(a != b);
  const auto transposed = [](int seed) {
    torch::manual_seed(seed);
    return torch::rand({2048, 2048}, torch::kCUDA).t();
  };
  const auto x1 = transposed(1);
  const auto x2 = transposed(2);
  const auto expected = plain.run({x2})[0];
  {
    c10::StreamGuard on(a);
    for (int i = 0; i < 3; ++i) (void)g.run({x1});
  }
  torch::cuda::synchronize();
  REQUIRE(g.stream().stats().replays == 1);
  {
    c10::StreamGuard on(a);
    torchloom::detail::fail_next_replay_after_launch = true;
    CHECK_THROWS_AS(g.run({x1}), torchloom::error);
    CHECK_FALSE(torchloom::detail::fail_next_replay_after_launch);
  }
  at::Tensor got;
  {
    c10::StreamGuard on(b);
    got = g.run({x2})[0];
  }
  torch::cuda::synchronize();
  CHECK(bitwise_equal(got, expected));
  CHECK(bitwise_equal(g.run({x2})[0], expected));
#endif
}

// The same, seen from the streams: the failed replay (batch 8) is queued on stream a behind a
// kernel that spins for about 0.1 s. The next replay, of another graph (batch 4: CUDA orders a
// relaunch of the same graph after the last launch by itself, but not a launch of another one)
// that shares the runner's memory pool, runs on stream b: it must not finish before stream a
// has. Without the failed replay marking its end, it would wait for the replay before that
// one, long done, and finish while stream a still spins.
TEST_CASE("CUDA: the replay after one that failed after its launch waits for it on the GPU",
          "[stream][graphs][cuda][hazards][async]") {
  TORCHLOOM_REQUIRE_CUDA();
#if TORCHLOOM_CUDA_GRAPHS
  model_dir m(make_mlp());
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  const c10::Stream a = pool_cuda_stream();
  const c10::Stream b = pool_cuda_stream();
  REQUIRE(a != b);
  const auto cuda_stream = [](c10::Stream s) {
    return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s).stream();
  };
  const auto x8 = input(8, 1);
  const auto x4 = input(4, 2);
  {
    c10::StreamGuard on(a);
    for (int i = 0; i < 3; ++i) (void)g.run({x8});
    for (int i = 0; i < 3; ++i) (void)g.run({x4});
  }
  torch::cuda::synchronize();
  REQUIRE(g.stream().stats().replays == 2);
  {
    c10::StreamGuard on(a);
    at::cuda::sleep(std::int64_t{200'000'000});  // some 0.1 s at 2 GHz
    torchloom::detail::fail_next_replay_after_launch = true;
    CHECK_THROWS_AS(g.run({x8}), torchloom::error);
  }
  cudaEvent_t b_done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&b_done, cudaEventDisableTiming) == cudaSuccess);
  {
    c10::StreamGuard on(b);
    (void)g.run({x4});
    REQUIRE(cudaEventRecord(b_done, cuda_stream(b)) == cudaSuccess);
  }
  REQUIRE(cudaEventSynchronize(b_done) == cudaSuccess);
  CHECK(cudaStreamQuery(cuda_stream(a)) == cudaSuccess);
  (void)cudaEventDestroy(b_done);
  torch::cuda::synchronize();
#endif
}

// A replay waits for the one before it whatever stream it is on: the previous replay's stream
// handle and thread may be those of another stream. Each thread's default stream has the one
// handle cudaStreamPerThread, and a thread that exits hands its id on to the next one made. A
// thread replays batch 8 on its default stream behind about 0.1 s of spinning and exits; the
// next thread, mostly given its id, replays another graph of the same pool (batch 4) on its
// own default stream: that must not finish before the first thread's replay has.
TEST_CASE("CUDA: a replay on a new thread's default stream waits for the previous replay",
          "[stream][graphs][cuda][hazards][async]") {
  TORCHLOOM_REQUIRE_CUDA();
#if TORCHLOOM_CUDA_GRAPHS
  model_dir m(make_mlp());
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  const auto x8 = input(8, 1);
  const auto x4 = input(4, 2);
  for (int i = 0; i < 3; ++i) (void)g.run({x8});
  for (int i = 0; i < 3; ++i) (void)g.run({x4});
  torch::cuda::synchronize();
  REQUIRE(g.stream().stats().replays == 2);
  cudaEvent_t first_done = nullptr;
  cudaEvent_t second_done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&first_done, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&second_done, cudaEventDisableTiming) == cudaSuccess);
  const auto on_own_default_stream = [] {
    return c10::cuda::CUDAStreamGuard(c10::cuda::getStreamFromExternal(cudaStreamPerThread, 0));
  };
  std::thread::id first_id;
  std::thread::id second_id;
  cudaError_t first_state = cudaErrorUnknown;
  std::thread([&] {
    first_id = std::this_thread::get_id();
    const auto guard = on_own_default_stream();
    at::cuda::sleep(std::int64_t{200'000'000});  // some 0.1 s at 2 GHz
    (void)g.run({x8});
    (void)cudaEventRecord(first_done, cudaStreamPerThread);
  }).join();
  std::thread([&] {
    second_id = std::this_thread::get_id();
    const auto guard = on_own_default_stream();
    (void)g.run({x4});
    (void)cudaEventRecord(second_done, cudaStreamPerThread);
    (void)cudaEventSynchronize(second_done);
    first_state = cudaEventQuery(first_done);
  }).join();
  torch::cuda::synchronize();
  (void)cudaEventDestroy(first_done);
  (void)cudaEventDestroy(second_done);
  if (first_id != second_id) TORCHLOOM_CATCH_SKIP("the second thread got another id");
  CHECK(first_state == cudaSuccess);
#endif
}

// An expanded input has stride 0: a graph's input buffer must be dense, or copying into it
// fails. Another non-contiguous layout of the same shape is a signature of its own.
TEST_CASE("CUDA: graphed takes broadcast (expanded) inputs and replays each layout correctly",
          "[stream][graphs][cuda][hazards]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(m.spec(), gpu);
  const auto expanded = input(1, 3).expand({8, 64});
  const auto dense = expanded.contiguous();
  for (int i = 0; i < 6; ++i) {
    INFO("run " << i);
    CHECK(bitwise_equal(g.run({expanded})[0], plain.run({dense})[0]));
    CHECK(bitwise_equal(g.run_tensors({expanded})[0], plain.run({dense})[0]));
  }
  auto s = g.stream().stats();
  CHECK(s.uncapturable == 0);
  CHECK(s.captures == 1);
  CHECK(s.replays == 12 - torchloom::graph_eager_runs_before_capture);
  torch::manual_seed(4);
  const auto transposed = torch::randn({64, 8}, torch::kCUDA).t();
  for (int i = 0; i < 4; ++i) {
    INFO("transposed run " << i);
    CHECK(bitwise_equal(g.run({transposed})[0], plain.run({transposed})[0]));
  }
  s = g.stream().stats();
  CHECK(s.captures == 2);
  CHECK(s.uncapturable == 0);
}

// torch (up to 2.11) leaves its caching allocator routing to the graph's pool when a capture
// fails at its end: from then on every block used on a second stream (each pool_stream output
// is recorded on the caller's) waits for a capture that never ends, and is never freed.
TEST_CASE("CUDA: after a failed capture blocks used on two streams are freed again",
          "[stream][graphs][cuda][capture-fails][hazards]") {
  TORCHLOOM_REQUIRE_CUDA();
#if TORCHLOOM_HAS_CUDA
  model_dir sync(make_host_sync());
  ts_runner<graphed<torchloom::caller_stream>> g(sync.spec(), gpu);
  for (int i = 0; i < 4; ++i) (void)g.run({input(4, i)});
  REQUIRE(g.stream().stats().uncapturable == 1);
  model_dir m(make_mlp());
  ts_runner<torchloom::pool_stream> p(m.spec(), gpu);
  const auto x = input(8, 1);
  for (int i = 0; i < 100; ++i) (void)p.run({x});
  torch::cuda::synchronize();
  const std::int64_t before = active_bytes();
  for (int i = 0; i < 10000; ++i) (void)p.run({x});
  torch::cuda::synchronize();
  (void)p.run({x});  // the allocator takes back what waited for events
  torch::cuda::synchronize();
  const std::int64_t grown = active_bytes() - before;
  INFO("active bytes grew by " << grown << " over 10000 runs");
  CHECK(grown < (1 << 20));
  // The same with blocks recorded on a second stream by hand, whatever the policy does.
  const c10::Stream side = pool_cuda_stream();
  const auto in_use = [] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  };
  torch::cuda::synchronize();
  const std::int64_t start = in_use();
  for (int i = 0; i < 1000; ++i) {
    const auto t = torch::empty({1 << 18}, torch::kCUDA);  // 1 MiB
    c10::cuda::CUDACachingAllocator::recordStream(
        t.storage().data_ptr(), c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, side));
  }
  torch::cuda::synchronize();
  (void)torch::empty({1}, torch::kCUDA);  // the allocator takes back what waited for events
  const std::int64_t kept = in_use() - start;
  INFO("1000 blocks of 1 MiB used on a second stream: " << kept << " bytes not freed");
  CHECK(kept < (8 << 20));
#endif
}

// The least recently used entry goes to make room, but a captured graph never goes for a
// signature seen once: one-off shapes must not cost the graphs that are replayed.
TEST_CASE("CUDA: one-off input shapes do not push captured graphs out",
          "[stream][graphs][cuda][hazards]") {
  TORCHLOOM_REQUIRE_CUDA();
  model_dir m(make_mlp());
  auto spec = m.spec();
  spec.set("CUDA_GRAPH_MAX_SHAPES", "2");
  ts_runner<torchloom::caller_stream> plain(m.spec(), gpu);
  ts_runner<graphed<torchloom::caller_stream>> g(spec, gpu);
  for (const std::int64_t batch : {4, 8}) {
    for (int i = 0; i < 3; ++i) (void)g.run({input(batch, i)});
  }
  REQUIRE(g.stream().stats().cached_graphs == 2);
  for (const std::int64_t batch : {1, 2, 3, 5, 6, 7}) {
    CHECK(bitwise_equal(g.run({input(batch, 9)})[0], plain.run({input(batch, 9)})[0]));
  }
  auto s = g.stream().stats();
  CHECK(s.cached_graphs == 2);
  CHECK(s.evictions == 0);
  const auto replays = s.replays;
  CHECK(bitwise_equal(g.run({input(4, 11)})[0], plain.run({input(4, 11)})[0]));
  CHECK(bitwise_equal(g.run({input(8, 12)})[0], plain.run({input(8, 12)})[0]));
  s = g.stream().stats();
  CHECK(s.replays == replays + 2);
  CHECK(s.captures == 2);
  // A third signature replayed as often takes the place of the least recently used graph.
  for (int i = 0; i < 3; ++i) (void)g.run({input(16, i)});
  s = g.stream().stats();
  CHECK(s.captures == 3);
  CHECK(s.cached_graphs == 2);
  CHECK(s.evictions == 1);
}

TEST_CASE("graphed refuses ENABLE_CACHE_CLEANING: emptying the cache after every run "
          "synchronises the device and breaks a capture on another thread",
          "[stream][graphs]") {
  model_dir m(make_mlp());
  auto spec = m.spec();
  spec.set("ENABLE_CACHE_CLEANING", "true");
  CHECK_TORCHLOOM_ERROR((ts_runner<graphed<torchloom::caller_stream>>(spec)),
                        torchloom::errc::invalid_option, "ENABLE_CACHE_CLEANING", "graphed");
  // Without graphed it is a plain option.
  CHECK_NOTHROW(ts_runner<torchloom::caller_stream>(spec));
}
