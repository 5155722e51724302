// The weight reads of an AOTInductor package exported for streaming, apart from a package
// (torchloom/loader/aoti_weights.hpp): what the first run records (the order of the reads and
// when each read's tensor is let go, a kernel that reads several weights included), how later
// runs are served, and the clear error when a run reads in another order. Plain CPU tensors
// stand for the package's calls of torchloom::stream_weight.
#include "support/catch.hpp"
#include "support/fixtures.hpp"

#include <torchloom/loader/aoti_weights.hpp>

#include <ATen/ATen.h>

#include <cstddef>
#include <vector>

using torchloom::errc;
using torchloom::detail::active_reads_scope;
using torchloom::detail::package_reads;
using torchloom::detail::stream_weight_kernel;

namespace {

// A weight source that hands out tensors it made and notes which positions were asked for.
struct noting_source final : torchloom::detail::weight_source {
  std::vector<std::size_t> asked;
  at::Tensor fetch(std::size_t position) override {
    asked.push_back(position);
    return at::full({4}, static_cast<double>(position));
  }
};

// What the package passes as a weight: the operator ignores it while it streams.
const at::Tensor placeholder = at::zeros({4});
const at::Tensor activation = at::zeros({1});

at::Tensor read(std::int64_t index) { return stream_weight_kernel(placeholder, activation, index); }

std::vector<at::Tensor> host_weights() {
  std::vector<at::Tensor> host;
  for (int w = 0; w < 4; ++w) host.push_back(at::full({4}, 10.0 + w));
  return host;
}

}  // namespace

TEST_CASE("package reads: the first run records the order and when each read is let go, "
          "a kernel reading three weights included",
          "[aoti_reads]") {
  package_reads reads("m", {"a", "b", "c", "d"}, c10::Device(c10::kCPU));
  const auto host = host_weights();
  const auto rewrite = reads.record_with(host, [&] {
    const active_reads_scope serving(&reads);
    at::Tensor a = read(0);  // position 0
    CHECK(torch::equal(a, host[0]));  // the first run reads copies of the weights
    at::Tensor b = read(1);  // position 1
    a.reset();               // the kernel that read a and b is enqueued; b is read again
    at::Tensor c = read(2);  // position 2: a is let go by now
    at::Tensor d = read(3);  // position 3
    at::Tensor view = d.view({2, 2});
    b.reset();  // one fused kernel read b, c and d
    c.reset();
    d.reset();  // a view of d lives on
    at::Tensor again = read(0);  // position 4: b and c are let go, d is not
    view.reset();
    again.reset();
  });
  CHECK(rewrite.position_weight == std::vector<std::size_t>{0, 1, 2, 3, 0});
  CHECK(rewrite.release == std::vector<std::size_t>{2, 4, 4, 5, 5});
  REQUIRE(rewrite.weights.size() == 4);
  CHECK(rewrite.weights[2].name == "c");
  CHECK(torch::equal(rewrite.weights[3].tensor, host[3]));
}

TEST_CASE("package reads: later runs are served from the source in the recorded order; "
          "another order fails naming both weights",
          "[aoti_reads]") {
  package_reads reads("m", {"a", "b", "c", "d"}, c10::Device(c10::kCPU));
  (void)reads.record_with(host_weights(), [&] {
    const active_reads_scope serving(&reads);
    for (const std::int64_t w : {0, 1, 2}) (void)read(w);
  });
  noting_source source;
  reads.bind(source);
  {
    reads.begin();
    const active_reads_scope serving(&reads);
    for (const std::int64_t w : {0, 1, 2}) CHECK(read(w)[0].item<double>() == double(w));
  }
  CHECK(source.asked == std::vector<std::size_t>{0, 1, 2});
  CHECK_FALSE(reads.failure());
  {
    reads.begin();
    const active_reads_scope serving(&reads);
    (void)read(0);
    CHECK_TORCHLOOM_ERROR(read(2), errc::run_failed, "model 'm'", "read weight 'c' at read 1",
                          "its first run read 'b'", "call order changed");
    CHECK(reads.failure());  // what the loader reports in place of the package's failed call
    CHECK_TORCHLOOM_ERROR(read(7), errc::run_failed, "weight index 7", "declares 4 weights");
  }
  // Another thread, or no streaming run: the package's own constant comes back.
  CHECK(read(0).is_same(placeholder));
}

TEST_CASE("package reads: a package that returns a weight cannot stream", "[aoti_reads]") {
  package_reads reads("m", {"a", "b"}, c10::Device(c10::kCPU));
  at::Tensor output;
  CHECK_TORCHLOOM_ERROR(reads.record_with(host_weights(),
                                          [&] {
                                            const active_reads_scope serving(&reads);
                                            (void)read(0);
                                            output = read(1);  // returned as the output
                                          }),
                        errc::unsupported, "returns weight 'b'");
}
