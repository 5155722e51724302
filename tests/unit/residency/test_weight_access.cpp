// weight_access: a loader derived from torchscript_loader gets its base's weight access, so it
// runs the bundled model under every residency policy with the plain runner's outputs.
#include "support/catch.hpp"

#include <torchloom/torchloom.hpp>

#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

namespace tl = torchloom;

// A loader of the user's own that only adds to TorchScript's (here: nothing).
struct derived_loader : tl::torchscript_loader {};

// A loader that wraps TorchScript's without deriving from it: it gets no weight access.
struct wrapping_loader {
  using model_type = tl::torchscript_model;
  static constexpr std::string_view default_filename = "model.pt";
  tl::torchscript_loader inner;
  model_type load(const tl::load_context& ctx) const { return inner.load(ctx); }
  tl::input_signature signature(const model_type& m) const { return inner.signature(m); }
  c10::IValue run(model_type& m, std::vector<c10::IValue>&& in, const tl::run_context& rc) const {
    return inner.run(m, std::move(in), rc);
  }
};

using plain_runner = tl::model_runner<tl::torchscript_loader>;
template <class Residency>
using derived_runner = tl::model_runner<derived_loader, tl::no_hook, tl::caller_stream, Residency>;

tl::model_spec bundled(const std::map<std::string, std::string>& options = {}) {
  auto s = tl::model_spec::from_directory(TORCHLOOM_BUNDLED_MODEL_DIR);
  s.set(options);
  return s;
}

// The options each residency policy needs for the bundled model (a few KiB of weights).
template <class Residency>
std::map<std::string, std::string> options_for() {
  if constexpr (std::is_same_v<Residency, tl::streamed_weights>) {
    return {{"WEIGHT_OFFLOAD_BUDGET_MB", "1"}};
  } else {
    return {};
  }
}

// Runs `runner` and `plain` on the same inputs and checks the outputs are equal.
template <class Runner>
void check_same_outputs(Runner& runner, plain_runner& plain, c10::Device device) {
  for (int run = 0; run < 4; ++run) {
    const auto x = torch::randn({1 + run * 3, 64}, device);
    const auto want = plain.run({x});
    const auto got = runner.run({x});
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(torch::equal(got[i], want[i]));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("weight_access: a loader derived from torchscript_loader works with every "
                   "residency policy",
                   "[residency][weight_access]", tl::resident_weights, tl::shared_weights,
                   tl::streamed_weights, tl::mapped_weights) {
  STATIC_REQUIRE(tl::rewritable_weights<derived_loader>);
  STATIC_REQUIRE(tl::measurable_weights<derived_loader>);
  const c10::Device cpu(c10::kCPU);
  plain_runner plain(bundled(), cpu);
  derived_runner<TestType> runner(bundled(options_for<TestType>()), cpu);
  check_same_outputs(runner, plain, cpu);
  if constexpr (std::is_same_v<TestType, tl::resident_weights> ||
                std::is_same_v<TestType, tl::shared_weights>) {
    // Measured through the base's weight_access: 64 -> 128 -> 16, float weights and biases.
    CHECK(runner.memory().device_bytes == (128 * 64 + 128 + 16 * 128 + 16) * 4);
    CHECK(runner.memory().device_bytes == plain.memory().device_bytes);
  }
}

TEST_CASE("weight_access: a loader without weight access keeps unknown weight memory",
          "[residency][weight_access]") {
  // resident_weights needs no weight access; memory() says it cannot tell.
  STATIC_REQUIRE(!tl::rewritable_weights<wrapping_loader>);
  STATIC_REQUIRE(!tl::measurable_weights<wrapping_loader>);
  const c10::Device cpu(c10::kCPU);
  plain_runner plain(bundled(), cpu);
  tl::model_runner<wrapping_loader> runner(bundled(), cpu);
  check_same_outputs(runner, plain, cpu);
  CHECK(runner.memory().device_bytes == -1);
}

#if TORCHLOOM_HAS_CUDA
TEMPLATE_TEST_CASE("weight_access on a GPU: a loader derived from torchscript_loader streams "
                   "and maps weights",
                   "[residency][weight_access][cuda]", tl::streamed_weights,
                   tl::mapped_weights) {
  TORCHLOOM_REQUIRE_CUDA();
  const c10::Device gpu(c10::kCUDA, 0);
  plain_runner plain(bundled(), gpu);
  derived_runner<TestType> runner(bundled(options_for<TestType>()), gpu);
  check_same_outputs(runner, plain, gpu);
  CHECK(runner.memory().host_bytes > 0);  // the weights stay in pinned host memory
}
#endif
