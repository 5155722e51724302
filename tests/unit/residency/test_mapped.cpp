// mapped_weights: outputs bitwise equal to resident_weights; on a GPU the weights stay in
// mapped host memory (zero-copy), and a budget keeps the most-read ones on the device.
#include "support/catch.hpp"
#include "support/fixtures.hpp"
#include "support/stack_model.hpp"

#include <torchloom/torchloom.hpp>

#include <cstdint>

using torchloom_test::mapped_runner;
using torchloom_test::resident_runner;
using torchloom_test::stack_model;

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
using torchloom_test::allocated_on;

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
