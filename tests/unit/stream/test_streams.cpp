// Stream policies: every policy is a no-op on CPU; on CUDA, the model's ops run on the stream
// the policy promises (a custom op inside the model reports its current stream), and outputs
// read on the caller's stream right after run() are correct.
#include "../../support/fixtures.hpp"
#include "../../support/streams.hpp"

#include <torchloom/torchloom.hpp>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cstdint>

using torchloom::model_spec;
using torchloom_test::current_cuda_stream;
using torchloom_test::pool_cuda_stream;
using torchloom_test::stream_probe_model;
using torchloom_test::temp_dir;

namespace {

// The stream the calling op runs on, as the model sees it: c10's current stream of the
// input's device (-1 on CPU).
std::int64_t current_stream_id(const at::Tensor& x) {
  if (!x.is_cuda()) return -1;
  return c10::impl::getDeviceGuardImpl(x.device().type())->getStream(x.device()).id();
}

TORCH_LIBRARY(tl_stream_test, m) { m.def("current_stream_id(Tensor x) -> int", current_stream_id); }

}  // namespace

model_spec torchloom_test::stream_probe_model(const temp_dir& t) {
  torch::jit::Module m("probe");
  torchloom_test::define_with_ops(m, R"(
def forward(self, x):
    return (x * 2, tl_stream_test.current_stream_id(x))
)",
                                  {"tl_stream_test"});
  m.save((t / "probe.pt").string());
  return model_spec::from_file(t / "probe.pt");
}

namespace {

template <class Stream>
using runner = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook, Stream>;

template <class Stream>
std::int64_t stream_seen_by_model(runner<Stream>& r, const at::Tensor& x) {
  const auto out = r.run_ivalue({x}).toTuple();
  return out->elements()[1].toInt();
}

}  // namespace

TEMPLATE_TEST_CASE("every stream policy is a no-op on CPU", "[stream]", torchloom::caller_stream,
                   torchloom::pool_stream, torchloom::adaptive_stream) {
  temp_dir t;
  runner<TestType> r(stream_probe_model(t));
  const auto x = torch::rand({4});
  const auto out = r.run_ivalue({x}).toTuple();
  CHECK(torch::equal(out->elements()[0].toTensor(), x * 2));
  CHECK(out->elements()[1].toInt() == -1);
}

TEST_CASE("CUDA: caller_stream runs on the caller's current stream", "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  temp_dir t;
  runner<torchloom::caller_stream> r(stream_probe_model(t), c10::Device("cuda:0"));
  const auto x = torch::rand({4}, torch::kCUDA);
  CHECK(stream_seen_by_model(r, x) == current_cuda_stream().id());
  const c10::Stream side = pool_cuda_stream();
  c10::StreamGuard guard(side);
  CHECK(stream_seen_by_model(r, x) == side.id());
}

TEST_CASE("CUDA: pool_stream runs on a pool stream, never the caller's", "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  temp_dir t;
  runner<torchloom::pool_stream> r(stream_probe_model(t), c10::Device("cuda:0"));
  const auto x = torch::rand({4}, torch::kCUDA);
  const auto on_default = stream_seen_by_model(r, x);
  CHECK(on_default != current_cuda_stream().id());
  const c10::Stream side = pool_cuda_stream();
  c10::StreamGuard guard(side);
  CHECK(stream_seen_by_model(r, x) != side.id());
  CHECK(current_cuda_stream() == side);  // the caller's current stream is restored
}

TEST_CASE("CUDA: adaptive_stream uses a pool stream only when the caller is on the default",
          "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  temp_dir t;
  runner<torchloom::adaptive_stream> r(stream_probe_model(t), c10::Device("cuda:0"));
  const auto x = torch::rand({4}, torch::kCUDA);
  const c10::Stream default_stream = current_cuda_stream();
  CHECK(stream_seen_by_model(r, x) != default_stream.id());
  const c10::Stream side = pool_cuda_stream();
  c10::StreamGuard guard(side);
  CHECK(stream_seen_by_model(r, x) == side.id());
}

TEMPLATE_TEST_CASE("CUDA: outputs read on the caller's stream right after run() are correct",
                   "[stream][cuda]", torchloom::pool_stream, torchloom::adaptive_stream,
                   torchloom::caller_stream) {
  TORCHLOOM_REQUIRE_CUDA();
  const torchloom_test::busy_caller check;
  runner<TestType> r(check.spec(), c10::Device("cuda:0"));
  CHECK(check.wrong_outputs(r, 1000) == 0);
}
