// streamed_weights and mapped_weights: the schedule arithmetic, the graph pass, outputs bitwise
// equal to resident_weights, the budget, and on a GPU the copy stream.
#include "support/catch.hpp"
#include "support/fixtures.hpp"

#include <torchloom/detail/weight_schedule.hpp>
#include <torchloom/torchloom.hpp>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::temp_dir;
namespace tld = torchloom::detail;

template <class Residency, class Stream = torchloom::caller_stream>
using runner_with =
    torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, Stream, Residency>;
using resident_runner = runner_with<torchloom::resident_weights>;
using streamed_runner = runner_with<torchloom::streamed_weights>;
using mapped_runner = runner_with<torchloom::mapped_weights>;

// A stack of `layers` layers of `dim` x `dim` float weights, each a submodule, then a branch
// that reads a buffer in both arms and a product that reads layer 0's weight again:
//   layer i: relu(x @ W_i.T + b_i)   odd layers through torch.linear; even ones take the
//                                    transposed view of W_i first and apply it after b_i's
//                                    fetch, so W_i's bytes must stay until the view's use
// Its fetches: W_i, b_i per layer (and b_i again in even layers), then `scale` (before the
// branch), then W_0 again.
torch::jit::Module make_stack(int layers, std::int64_t dim) {
  torch::jit::Module top("stack");
  for (int i = 0; i < layers; ++i) {
    torch::jit::Module layer("layer");
    layer.register_parameter("weight", torch::randn({dim, dim}) / std::sqrt(double(dim)), false);
    layer.register_parameter("bias", torch::randn({dim}), false);
    layer.define(i % 2 == 0 ? R"(
def forward(self, x):
    wt = self.weight.t()
    h = x + self.bias
    return torch.relu(torch.matmul(h, wt) - torch.matmul(self.bias, wt))
)"
                            : R"(
def forward(self, x):
    return torch.relu(torch.linear(x, self.weight, self.bias))
)");
    top.register_module("l" + std::to_string(i), layer);
  }
  top.register_buffer("scale", torch::rand({dim}) + 0.5);
  std::string code = "def forward(self, x):\n";
  for (int i = 0; i < layers; ++i) code += "    x = self.l" + std::to_string(i) + ".forward(x)\n";
  code += R"(    if bool(x.sum() > 0):
        x = x * self.scale
    else:
        x = x - self.scale
    return torch.matmul(x, self.l0.weight)
)";
  top.define(code);
  return top;
}

struct stack_model {
  temp_dir dir;
  std::int64_t dim;
  stack_model(int layers, std::int64_t dim_, std::string_view config = {}) : dim(dim_) {
    auto m = make_stack(layers, dim);
    torchloom_test::write_triton_model(dir / "m", m, config);
  }
  model_spec spec(std::map<std::string, std::string> options = {}) const {
    auto s = model_spec::from_directory(dir / "m");
    s.set(options);
    return s;
  }
};

std::map<std::string, std::string> budget(std::int64_t mb, int depth = 2) {
  return {{"WEIGHT_OFFLOAD_BUDGET_MB", std::to_string(mb)},
          {"WEIGHT_OFFLOAD_PREFETCH_DEPTH", std::to_string(depth)}};
}

// A random schedule: sizes of 1-16 alignment units, each released 1-4 fetches later, or, one
// in six, at the end of the run (a weight used again at the end, a long-lived view).
tld::weight_schedule random_schedule(std::mt19937& rng, std::size_t n) {
  tld::weight_schedule s;
  std::uniform_int_distribution<int> size(1, 16);
  std::uniform_int_distribution<std::size_t> after(1, 4);
  std::uniform_int_distribution<int> long_lived(0, 5);
  for (std::size_t p = 0; p < n; ++p) {
    s.bytes.push_back(size(rng) * tld::weight_alignment);
    s.release.push_back(long_lived(rng) == 0 ? n : std::min(n, p + after(rng)));
  }
  return s;
}

// The smallest feasible arena, by trying every size.
std::int64_t brute_force_minimum(const tld::weight_schedule& s) {
  std::int64_t total = 0;
  for (const auto b : s.bytes) total += b;
  for (std::int64_t a = tld::weight_alignment; a < total; a += tld::weight_alignment) {
    if (tld::plan_arena(s, a).feasible) return a;
  }
  return total;
}

// The property the arena must have, checked independently of plan_arena's own bookkeeping: at
// each fetch x, x's bytes do not overlap those of any earlier position still in use (fetched
// and not yet released by the time x is fetched), and x fits the arena.
bool no_live_overlap(const tld::weight_schedule& s, const tld::arena_plan& plan) {
  for (std::size_t x = 0; x < s.size(); ++x) {
    if (plan.offset[x] < 0 || plan.offset[x] + s.bytes[x] > plan.arena_bytes) return false;
    for (std::size_t q = 0; q < x; ++q) {
      const bool live = s.release[q] > x;
      const bool overlap = plan.offset[q] < plan.offset[x] + s.bytes[x] &&
                           plan.offset[x] < plan.offset[q] + s.bytes[q];
      if (live && overlap) return false;
    }
  }
  return true;
}

// An independent check of wait_for and cross_wait: replays three runs of the schedule over the
// arena's bytes (in units of weight_alignment), remembering each unit's latest occupant; a
// position's copy must wait for the release of every occupant it overwrites, of its own run
// (wait_for) or of the previous one (cross_wait; size() stands for that run's end).
bool waits_cover_occupants(const tld::weight_schedule& s, const tld::arena_plan& plan) {
  const auto u = tld::weight_alignment;
  std::vector<std::pair<int, std::size_t>> owner(
      static_cast<std::size_t>(plan.arena_bytes / u), {-1, 0});
  for (int run = 0; run < 3; ++run) {
    for (std::size_t x = 0; x < s.size(); ++x) {
      const auto first = static_cast<std::size_t>(plan.offset[x] / u);
      const auto last = static_cast<std::size_t>((plan.offset[x] + s.bytes[x]) / u);
      for (std::size_t unit = first; unit < last; ++unit) {
        const auto [r, q] = owner[unit];
        owner[unit] = {run, x};
        if (r < 0) continue;  // never written yet
        const auto release = static_cast<std::ptrdiff_t>(s.release[q]);
        if (r == run && plan.wait_for[x] < release) return false;
        if (r == run - 1 && plan.cross_wait[x] < release) return false;
        if (r < run - 1) return false;  // every run rewrites the same bytes
      }
    }
  }
  return true;
}

}  // namespace

TEST_CASE("weight schedule: the ring keeps live weights apart and finds the minimum arena",
          "[residency][streamed]") {
  SECTION("a hand-worked schedule") {
    // Two layers of (W: 4 units, b: 1 unit): W and b of a layer are released at the next
    // layer's first fetch.
    const auto u = tld::weight_alignment;
    tld::weight_schedule s{{4 * u, u, 4 * u, u}, {2, 2, 4, 4}};
    CHECK(tld::live_bytes_bound(s) == 5 * u);
    CHECK(tld::minimum_arena(s) == 5 * u);
    const auto plan = tld::plan_arena(s, 5 * u);
    REQUIRE(plan.feasible);
    CHECK(plan.offset == std::vector<std::int64_t>{0, 4 * u, 0, 4 * u});
    // The second layer's copies reuse the first layer's bytes once they are released.
    CHECK(plan.wait_for == std::vector<std::ptrdiff_t>{-1, -1, 2, 2});
    // The next run's first layer overwrites the last layer's bytes, in use to the end (4);
    // its second layer overwrites its own first layer's, not the previous run's.
    CHECK(plan.cross_wait == std::vector<std::ptrdiff_t>{4, 4, -1, -1});
    CHECK_FALSE(tld::plan_arena(s, 4 * u).feasible);
    // With room for both layers nothing waits.
    const auto roomy = tld::plan_arena(s, 10 * u);
    CHECK(roomy.wait_for == std::vector<std::ptrdiff_t>{-1, -1, -1, -1});
  }
  SECTION("a weight held to the end of the run blocks the bytes it sits in, laps later") {
    // 8 units released at 2; 2 units held to the end; eight of 4 units, each released at the
    // next fetch; 2 units. In a ring of 10 the last one lands on the one held to the end.
    const auto u = tld::weight_alignment;
    tld::weight_schedule s{{8 * u, 2 * u}, {2, 11}};
    for (std::size_t k = 0; k < 8; ++k) {
      s.bytes.push_back(4 * u);
      s.release.push_back(k + 3);
    }
    s.bytes.push_back(2 * u);
    s.release.push_back(11);
    CHECK(tld::live_bytes_bound(s) == 10 * u);
    CHECK_FALSE(tld::plan_arena(s, 10 * u).feasible);
    CHECK(tld::minimum_arena(s) == brute_force_minimum(s));
  }
  SECTION("random schedules") {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 300; ++trial) {
      const auto s = random_schedule(rng, 1 + trial % 40);
      const auto minimum = tld::minimum_arena(s);
      const auto plan = tld::plan_arena(s, minimum);
      INFO("trial " << trial << ", minimum " << minimum);
      REQUIRE(plan.feasible);
      CHECK(no_live_overlap(s, plan));
      CHECK(waits_cover_occupants(s, plan));
      CHECK(minimum >= tld::live_bytes_bound(s));
      CHECK(minimum == brute_force_minimum(s));
      CHECK_FALSE(tld::plan_arena(s, tld::live_bytes_bound(s) - tld::weight_alignment)
                      .feasible);
      // Every arena the planner calls feasible keeps live weights apart.
      for (auto arena = minimum; arena <= 2 * minimum; arena += tld::weight_alignment) {
        const auto p = tld::plan_arena(s, arena);
        if (p.feasible) CHECK((no_live_overlap(s, p) && waits_cover_occupants(s, p)));
      }
    }
  }
}

TEST_CASE("streamed_weights: outputs bitwise equal to resident_weights, within the budget",
          "[residency][streamed]") {
  stack_model m(6, 512);  // 1 MiB per weight: 7 MiB in all
  resident_runner resident(m.spec());
  for (const auto& [mb, depth] : std::vector<std::pair<int, int>>{
           {2, 0}, {2, 2}, {3, 1}, {3, 8}, {8, 2}, {64, 4}}) {
    INFO("budget " << mb << " MiB, prefetch depth " << depth);
    streamed_runner streamed(m.spec(budget(mb, depth)));
    // The module keeps its weights, on the host: in the packed buffer.
    CHECK(streamed.model().module.attr("l0").toModule().attr("weight").toTensor().is_cpu());
    for (int run = 0; run < 12; ++run) {
      const auto x = torch::randn({4, 512}) * (run % 3 == 0 ? -1 : 1);
      const auto want = resident.run({x})[0];
      const auto got = streamed.run({x})[0];
      REQUIRE(torch::equal(got, want));
    }
    const auto mem = streamed.memory();
    CHECK(mem.budget_bytes == std::int64_t{mb} << 20);
    CHECK(mem.high_water_bytes > 0);
    CHECK(mem.high_water_bytes <= mem.budget_bytes);
    CHECK(mem.budget_violations == 0);
    // Every run copies every fetch: 7 weights of 1 MiB and 10 vectors of 2 KiB (the even
    // layers read their bias twice); after the last run, the next one's first copies have
    // started.
    const std::int64_t per_run = 7 * (512 * 512 * 4) + 10 * (512 * 4);
    CHECK(mem.copied_bytes >= 12 * per_run);
    CHECK(mem.copied_bytes <= 13 * per_run);
  }
}

TEST_CASE("streamed_weights: a budget below the schedule's minimum fails at load, naming it",
          "[residency][streamed]") {
  stack_model m(6, 512);
  // Live at once, at most: one layer's W (1 MiB) and b (2 KiB); the next layer's W may reuse
  // their bytes once their product is enqueued. So the minimum is just over 1 MiB: 2 MiB.
  CHECK_TORCHLOOM_ERROR(streamed_runner(m.spec(budget(1))), errc::budget_too_small,
                        "model 'm'", "WEIGHT_OFFLOAD_BUDGET_MB=1", "at least 2 MiB");
  CHECK_TORCHLOOM_ERROR(streamed_runner(m.spec()), errc::invalid_option,
                        "needs WEIGHT_OFFLOAD_BUDGET_MB", "at least 2 MiB");
  streamed_runner ok(m.spec(budget(2)));
  CHECK(ok.run({torch::randn({1, 512})})[0].sizes() == c10::IntArrayRef{1, 512});
}

TEST_CASE("streamed_weights: models whose weights cannot move are refused at load",
          "[residency][streamed]") {
  temp_dir dir;
  const auto refused = [&](const char* code, const char* says) {
    torch::jit::Module m("m");
    m.register_parameter("w", torch::randn({4, 4}), false);
    m.define(code);
    torchloom_test::write_triton_model(dir / "m", m);
    auto spec = model_spec::from_directory(dir / "m");
    spec.options.weight_offload_budget_mb = 1;
    CHECK_TORCHLOOM_ERROR(streamed_runner(spec), errc::unsupported, says);
  };
  refused("def forward(self, x):\n    return self.w\n", "returns the weight 'w'");
  refused("def forward(self, x):\n    return self.w.t()\n", "may alias the weight 'w'");
  refused("def forward(self, x):\n    self.w.add_(x)\n    return x + 1\n",
          "writes into the weight 'w'");
  refused("def forward(self, x):\n    self.w = x\n    return x + 1\n",
          "assigns the tensor attribute 'w'");
  refused("def forward(self, x):\n    return (self.w.type_as(x), x)\n",
          "may alias the weight 'w'");
  // A list of tensors as an attribute: not moved, so refused rather than left behind.
  torch::jit::Module listed("m");
  listed.register_attribute("ws", c10::ListType::ofTensors(),
                            c10::List<at::Tensor>({torch::randn({4})}));
  listed.define("def forward(self, x):\n    return x + self.ws[0]\n");
  torchloom_test::write_triton_model(dir / "listed", listed);
  auto spec = model_spec::from_directory(dir / "listed");
  spec.options.weight_offload_budget_mb = 1;
  CHECK_TORCHLOOM_ERROR(streamed_runner(spec), errc::unsupported, "reads 'ws'",
                        "a container of tensors");
}

TEST_CASE("streamed_weights: an op that returns a weight without declaring it keeps it alive",
          "[residency][streamed]") {
  // type_as returns its input itself, and its schema does not say so: `a` is the weight A,
  // used after six more layers have been fetched through the arena.
  temp_dir dir;
  torch::jit::Module top("m");
  top.register_parameter("A", torch::randn({512, 512}), false);  // 1 MiB, as each layer
  std::string code = "def forward(self, x):\n    a = self.A.type_as(x)\n";
  for (int i = 0; i < 6; ++i) {
    const auto w = "w" + std::to_string(i);
    top.register_parameter(w, torch::randn({512, 512}) / 23, false);
    code += "    x = torch.relu(torch.linear(x, self." + w + "))\n";
  }
  code += "    return x + a[0]\n";
  top.define(code);
  torchloom_test::write_triton_model(dir / "m", top);
  const auto spec = model_spec::from_directory(dir / "m");
  resident_runner resident(spec);
  streamed_runner streamed(model_spec(spec).set(budget(3, 2)));  // of 7 MiB
  for (int run = 0; run < 4; ++run) {
    const auto x = torch::randn({2, 512});
    CHECK(torch::equal(streamed.run({x})[0], resident.run({x})[0]));
  }
  CHECK(streamed.memory().budget_violations == 0);
}

TEST_CASE("streamed_weights: a run that fails half-way leaves the next one correct",
          "[residency][streamed]") {
  temp_dir dir;
  torch::jit::Module top("m");
  std::string code = "def forward(self, x):\n";
  for (int i = 0; i < 6; ++i) {
    const auto w = "w" + std::to_string(i);
    top.register_parameter(w, torch::randn({256, 256}) / 16, false);
    code += "    x = torch.relu(torch.linear(x, self." + w + "))\n";
    if (i == 2) code += "    assert bool(x.sum() < 1.0e6), \"too large\"\n";
  }
  code += "    return x\n";
  top.define(code);
  torchloom_test::write_triton_model(dir / "m", top);
  const auto spec = model_spec::from_directory(dir / "m");
  resident_runner resident(spec);
  streamed_runner streamed(model_spec(spec).set(budget(1, 3)));
  for (int run = 0; run < 6; ++run) {
    CHECK_TORCHLOOM_ERROR(streamed.run({torch::full({2, 256}, 1.0e8)}), errc::run_failed,
                          "too large");
    const auto x = torch::rand({2, 256});
    CHECK(torch::equal(streamed.run({x})[0], resident.run({x})[0]));
  }
  CHECK(streamed.memory().budget_violations == 0);
}

TEST_CASE("streamed_weights: concurrent runs on one runner are serialised and correct",
          "[residency][streamed]") {
  stack_model m(4, 256);
  resident_runner resident(m.spec());
  streamed_runner streamed(m.spec(budget(1, 1)));
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 16; ++i) {
    inputs.push_back(torch::randn({2, 256}));
    expected.push_back(resident.run({inputs.back()})[0]);
  }
  std::vector<int> equal(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 32; ++k) {
        const auto i = static_cast<std::size_t>((t * 5 + k) % 16);
        equal[static_cast<std::size_t>(t)] +=
            torch::equal(streamed.run({inputs[i]})[0], expected[i]) ? 1 : 0;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const int e : equal) CHECK(e == 32);
  CHECK(streamed.memory().budget_violations == 0);
}

TEST_CASE("mapped_weights: outputs bitwise equal to resident_weights", "[residency][mapped]") {
  stack_model m(3, 128);
  resident_runner resident(m.spec());
  mapped_runner mapped(m.spec());
  for (int run = 0; run < 4; ++run) {
    const auto x = torch::randn({3, 128});
    CHECK(torch::equal(mapped.run({x})[0], resident.run({x})[0]));
  }
  CHECK(resident.memory().device_bytes ==
        3 * (128 * 128 + 128) * 4 + 128 * 4);  // CPU runner: its weights on its device
}

#if TORCHLOOM_HAS_CUDA
namespace {
std::int64_t allocated_on(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
}
}  // namespace

TEMPLATE_TEST_CASE("streamed_weights on a GPU: weights 4x the budget, bitwise equal to resident",
                   "[residency][streamed][cuda]", torchloom::caller_stream,
                   torchloom::pool_stream) {
  TORCHLOOM_REQUIRE_CUDA();
  const c10::Device gpu(c10::kCUDA, 0);
  (void)torch::ones({1}, gpu);  // the allocator keeps no statistics before CUDA starts
  stack_model m(8, 1024);  // 4 MiB per weight: 36 MiB, fetched 18 times per run
  runner_with<torchloom::resident_weights, TestType> resident(m.spec(), gpu);
  const auto before = allocated_on(0);
  runner_with<torchloom::streamed_weights, TestType> streamed(m.spec(budget(9, 2)), gpu);
  // The weights stay on the host: the device holds the 9 MiB arena.
  CHECK(allocated_on(0) - before <= (std::int64_t{9} << 20) + (std::int64_t{1} << 20));
  const auto caller = c10::cuda::getStreamFromPool(false, 0);
  const c10::cuda::CUDAStreamGuard on_caller(caller);
  int equal = 0;
  for (int run = 0; run < 100; ++run) {
    // A batch large enough that each layer's product outlasts its weight's copy: a copy
    // that did not wait for the kernels reading its bytes would overwrite them mid-product.
    const std::int64_t rows = run % 4 == 0 ? 4096 : 16;
    const auto x = torch::randn({rows, 1024}, gpu) * (run % 2 == 0 ? 1.0 : -0.5);
    const auto want = resident.run({x})[0];
    const auto got = streamed.run({x})[0];
    // Read on the caller's stream right after run(), with no other synchronisation.
    equal += torch::equal(got, want) ? 1 : 0;
  }
  CHECK(equal == 100);
  const auto mem = streamed.memory();
  CHECK(mem.device_bytes == std::int64_t{9} << 20);
  CHECK(mem.high_water_bytes <= mem.budget_bytes);
  CHECK(mem.budget_violations == 0);
  CHECK(mem.host_bytes >= 8 * (1024 * 1024 * 4));
  CHECK(resident.memory().device_bytes == 8 * (1024 * 1024 + 1024) * 4 + 1024 * 4);
}

TEST_CASE("mapped_weights on a GPU: zero-copy weights, bitwise equal to resident",
          "[residency][mapped][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  const c10::Device gpu(c10::kCUDA, 0);
  (void)torch::ones({1}, gpu);
  stack_model m(4, 512);
  resident_runner resident(m.spec(), gpu);
  const auto before = allocated_on(0);
  mapped_runner mapped(m.spec(), gpu);
  CHECK(allocated_on(0) - before < (std::int64_t{1} << 20));  // no weight on the device
  CHECK(mapped.memory().device_bytes == 0);
  mapped_runner partly(m.spec({{"WEIGHT_OFFLOAD_BUDGET_MB", "2"}}), gpu);
  // Layer 0's weight is read twice per forward: the most bytes, kept first; one more fits.
  CHECK(partly.memory().device_bytes == 2 * 512 * 512 * 4);
  for (int run = 0; run < 10; ++run) {
    const auto x = torch::randn({8, 512}, gpu);
    const auto want = resident.run({x})[0];
    CHECK(torch::equal(mapped.run({x})[0], want));
    CHECK(torch::equal(partly.run({x})[0], want));
  }
}
#endif
