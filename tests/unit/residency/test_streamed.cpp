// streamed_weights: the graph pass that refuses weights that cannot move, outputs bitwise
// equal to resident_weights, the budget, failed and concurrent runs, and on a GPU the copy
// stream.
#include "support/catch.hpp"
#include "support/fixtures.hpp"
#include "support/stack_model.hpp"

#include <torchloom/torchloom.hpp>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <string>
#include <thread>
#include <utility>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;
using torchloom_test::budget;
using torchloom_test::resident_runner;
using torchloom_test::stack_model;
using torchloom_test::streamed_runner;
using torchloom_test::temp_dir;

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
    CHECK(mem.high_water_bytes + mem.resident_bytes <= mem.budget_bytes);
    CHECK(mem.budget_violations == 0);
    // Every run copies the streamed fetches (all of them, with nothing resident: 7 weights
    // of 1 MiB and 10 vectors of 2 KiB, the even layers reading their bias twice); after the
    // last run, the next one's first copies have started.
    const std::int64_t per_run = 7 * (512 * 512 * 4) + 10 * (512 * 4);
    if (mem.resident_bytes == 0) {
      CHECK(mem.streamed_bytes == per_run);
    }
    CHECK(mem.streamed_bytes <= per_run);
    CHECK(mem.copied_bytes >= 12 * mem.streamed_bytes);
    CHECK(mem.copied_bytes <= 13 * mem.streamed_bytes);
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

namespace {

// Runs `streamed` and `resident` on the same inputs `runs` times; true when every output is
// bitwise equal.
template <class Streamed>
bool equal_runs(Streamed& streamed, resident_runner& resident, std::int64_t dim, int runs) {
  bool equal = true;
  for (int run = 0; run < runs; ++run) {
    const auto x = torch::randn({4, dim}) * (run % 3 == 0 ? -1 : 1);
    equal = equal && torch::equal(streamed.run({x})[0], resident.run({x})[0]);
  }
  return equal;
}

}  // namespace

TEST_CASE("streamed_weights: a budget above the minimum keeps weights on the device",
          "[residency][streamed]") {
  stack_model m(6, 512);
  resident_runner resident(m.spec());
  // The weights: six of 1 MiB and seven vectors of 2 KiB.
  const std::int64_t all = 6 * (512 * 512 * 4) + 7 * (512 * 4);
  SECTION("a budget that holds every weight: nothing is copied per run") {
    for (const int depth : {0, 2}) {
      streamed_runner streamed(m.spec(budget(7, depth)));
      CHECK(equal_runs(streamed, resident, 512, 6));
      const auto mem = streamed.memory();
      CHECK(mem.resident_bytes == all);
      CHECK(mem.streamed_bytes == 0);
      CHECK(mem.copied_bytes == 0);
      CHECK(mem.high_water_bytes == 0);
      CHECK(mem.budget_violations == 0);
    }
  }
  SECTION("a budget in between: the rest streams, and only the rest") {
    // Without prefetching the ring needs one layer at a time; with it, room for the copies
    // started ahead (2 fetches and 8 MiB): the model of 4 MiB weights.
    stack_model wide(6, 1024);
    resident_runner wide_resident(wide.spec());
    struct setting {
      const stack_model& model;
      resident_runner& reference;
      int mb;
      int depth;
    };
    for (const auto& [model, reference, mb, depth] :
         {setting{m, resident, 4, 0}, setting{m, resident, 3, 0},
          setting{wide, wide_resident, 24, 2}}) {
      INFO("weights of " << model.dim << "^2, budget " << mb << " MiB, prefetch depth "
                         << depth);
      const std::int64_t w0 = model.dim * model.dim * 4;
      streamed_runner streamed(model.spec(budget(mb, depth)));
      CHECK(equal_runs(streamed, reference, model.dim, 1));
      const auto once = streamed.memory().copied_bytes;
      CHECK(equal_runs(streamed, reference, model.dim, 10));
      const auto mem = streamed.memory();
      // Layer 0's weight, read twice a run, saves the most: it stays.
      CHECK(mem.resident_bytes >= w0);
      CHECK(mem.resident_bytes < 6 * w0);
      CHECK(mem.streamed_bytes > 0);
      CHECK(mem.streamed_bytes < 7 * w0);
      // Ten more runs copy the streamed bytes ten times (give or take the copies started
      // ahead for the next run).
      CHECK(mem.copied_bytes - once >= 9 * mem.streamed_bytes);
      CHECK(mem.copied_bytes - once <= 11 * mem.streamed_bytes);
      CHECK(mem.high_water_bytes > 0);
      CHECK(mem.high_water_bytes + mem.resident_bytes <= mem.budget_bytes);
      CHECK(mem.budget_violations == 0);
    }
  }
  SECTION("the smallest budget keeps only what the ring leaves room for") {
    // With a prefetch depth of 2 the ring needs more than 2 MiB: nothing stays.
    streamed_runner ahead(m.spec(budget(2, 2)));
    CHECK(equal_runs(ahead, resident, 512, 6));
    CHECK(ahead.memory().resident_bytes == 0);
    CHECK(ahead.memory().streamed_bytes == 7 * (512 * 512 * 4) + 10 * (512 * 4));
    // Without prefetching the ring needs just over 1 MiB: a few vectors fit beside it.
    streamed_runner least(m.spec(budget(2, 0)));
    CHECK(equal_runs(least, resident, 512, 6));
    CHECK(least.memory().resident_bytes < 512 * 512 * 4);
    CHECK(least.memory().high_water_bytes + least.memory().resident_bytes <= 2 << 20);
    CHECK(least.memory().budget_violations == 0);
  }
}

TEST_CASE("streamed_weights: a weight read twice stays before a larger one read once",
          "[residency][streamed]") {
  // A (1 MiB) is read first and last, B and C (1.5 MiB each) once. A saves 2 MiB of copies a
  // run for 1 MiB of budget, B 1.5 MiB for 1.5. In 3 MiB, A and a ring for B and C (1.5 MiB)
  // fit; A and B and a ring for C do not.
  temp_dir dir;
  torch::jit::Module top("m");
  top.register_parameter("A", torch::randn({512, 512}) / 23, false);
  top.register_parameter("B", torch::randn({768, 512}) / 23, false);
  top.register_parameter("C", torch::randn({512, 768}) / 28, false);
  top.define(R"(
def forward(self, x):
    x = torch.relu(torch.linear(x, self.A))
    y = torch.relu(torch.linear(x, self.B))
    x = torch.linear(y, self.C)
    return torch.linear(x, self.A)
)");
  torchloom_test::write_triton_model(dir / "m", top);
  const auto spec = model_spec::from_directory(dir / "m");
  resident_runner resident(spec);
  constexpr std::int64_t a_bytes = 512 * 512 * 4;
  constexpr std::int64_t b_bytes = 768 * 512 * 4;
  streamed_runner streamed(model_spec(spec).set(budget(3, 0)));
  CHECK(equal_runs(streamed, resident, 512, 5));
  const auto mem = streamed.memory();
  CHECK(mem.resident_bytes == a_bytes);
  CHECK(mem.streamed_bytes == 2 * b_bytes);
  CHECK(mem.copied_bytes == 5 * 2 * b_bytes);  // no prefetching: nothing copied ahead
  CHECK(mem.budget_violations == 0);
  // The minimum the error names is still the whole schedule's: one of B or C at a time.
  CHECK_TORCHLOOM_ERROR(streamed_runner(model_spec(spec).set(budget(1, 0))),
                        errc::budget_too_small, "at least 2 MiB");
  // At the minimum nothing fits beside the ring: everything streams.
  streamed_runner least(model_spec(spec).set(budget(2, 0)));
  CHECK(equal_runs(least, resident, 512, 3));
  CHECK(least.memory().resident_bytes == 0);
  CHECK(least.memory().streamed_bytes == 2 * a_bytes + 2 * b_bytes);
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
#if TORCHLOOM_HAS_CUDA
using torchloom_test::allocated_on;
using torchloom_test::runner_with;

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
#endif
