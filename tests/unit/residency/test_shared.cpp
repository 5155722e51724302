// shared_weights: runners of one model on one device share one loaded model.
#include "support/catch.hpp"
#include "support/fixtures.hpp"

#include <torchloom/torchloom.hpp>

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <memory>
#include <thread>
#include <vector>

namespace {

using torchloom::model_spec;
using torchloom_test::temp_dir;

using shared_runner = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook,
                                              torchloom::caller_stream,
                                              torchloom::shared_weights>;
using holder = torchloom::shared_weights::holder<torchloom::torchscript_loader>;

// A linear model of `in` x `out` float weights, saved as <dir>/m/1/model.pt.
struct shared_model {
  temp_dir dir;
  torch::jit::Module module;
  explicit shared_model(std::int64_t in = 8, std::int64_t out = 4)
      : module(torchloom_test::make_linear(in, out)) {
    torchloom_test::write_triton_model(dir / "m", module);
  }
  model_spec spec() const { return model_spec::from_directory(dir / "m"); }
  at::Tensor reference(const at::Tensor& x) const {
    return at::matmul(x, module.attr("w").toTensor().t()) + module.attr("b").toTensor();
  }
};

}  // namespace

TEST_CASE("shared_weights: 8 runners of one model share one load; the last frees it",
          "[residency]") {
  shared_model m;
  const auto before = holder::loaded_count();
  {
    std::vector<std::unique_ptr<shared_runner>> runners;
    for (int i = 0; i < 8; ++i) runners.push_back(std::make_unique<shared_runner>(m.spec()));
    CHECK(holder::loaded_count() == before + 1);
    for (const auto& r : runners) CHECK(&r->model() == &runners.front()->model());
    const auto x = torch::randn({3, 8});
    for (const auto& r : runners) CHECK(torch::allclose(r->run({x})[0], m.reference(x)));
    runners.resize(1);  // seven go; the model stays
    CHECK(holder::loaded_count() == before + 1);
    CHECK(torch::allclose(runners.front()->run({x})[0], m.reference(x)));
  }
  CHECK(holder::loaded_count() == before);
}

TEST_CASE("shared_weights: what changes the loaded object is not shared", "[residency]") {
  shared_model m;
  shared_runner a(m.spec());
  SECTION("ENABLE_WEIGHT_SHARING=false loads a copy of its own") {
    shared_runner b(m.spec().set("ENABLE_WEIGHT_SHARING", "false"));
    CHECK(&a.model() != &b.model());
  }
  SECTION("an option that changes the loaded object") {
    shared_runner b(m.spec().set("DISABLE_OPTIMIZED_EXECUTION", "true"));
    CHECK(&a.model() != &b.model());
    CHECK(b.model().optimized_execution == false);
  }
  SECTION("an option that does not") {
    shared_runner b(m.spec().set("WARMUP_ITERATIONS", "0").set("INFERENCE_MODE", "false"));
    CHECK(&a.model() == &b.model());
  }
  SECTION("another model file") {
    shared_model other;
    shared_runner b(other.spec());
    CHECK(&a.model() != &b.model());
  }
}

TEST_CASE("shared_weights: concurrent construction and run() on shared runners",
          "[residency][concurrency]") {
  shared_model m;
  const auto before = holder::loaded_count();
  std::vector<std::unique_ptr<shared_runner>> runners(8);
  {
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < runners.size(); ++i) {
      threads.emplace_back([&, i] { runners[i] = std::make_unique<shared_runner>(m.spec()); });
    }
    for (auto& t : threads) t.join();
  }
  CHECK(holder::loaded_count() == before + 1);
  std::vector<int> correct(runners.size(), 0);
  {
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < runners.size(); ++i) {
      threads.emplace_back([&, i] {
        for (int k = 0; k < 50; ++k) {
          const auto x = torch::randn({2, 8});
          correct[i] += torch::allclose(runners[i]->run({x})[0], m.reference(x)) ? 1 : 0;
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int c : correct) CHECK(c == 50);
  runners.clear();
  CHECK(holder::loaded_count() == before);
}

#if TORCHLOOM_HAS_CUDA
TEST_CASE("shared_weights on a GPU: 8 runners cost one copy of the weights, freed with the last",
          "[residency][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  const c10::Device gpu(c10::kCUDA, 0);
  shared_model m(4096, 4096);  // 64 MiB of float weights
  const auto weights = static_cast<std::int64_t>(4096 * 4096 * sizeof(float));
  const auto allocated = [] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  };
  (void)torch::ones({1}, gpu);  // the allocator keeps no statistics before CUDA starts
  const auto before = allocated();
  {
    std::vector<std::unique_ptr<shared_runner>> runners;
    for (int i = 0; i < 8; ++i) runners.push_back(std::make_unique<shared_runner>(m.spec(), gpu));
    const auto held = allocated() - before;
    CHECK(held >= weights);
    CHECK(held < 2 * weights);  // one copy, not eight
    const auto x = torch::randn({2, 4096});
    CHECK(torch::allclose(runners.back()->run({x})[0].cpu(), m.reference(x), 1e-3, 1e-3));
  }
  CHECK(allocated() - before < weights);  // freed with the last runner
}
#endif
