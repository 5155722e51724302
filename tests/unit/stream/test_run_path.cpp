// The run path goes one way: the inputs are moved into the stream policy, which keeps what it
// needs of them and hands them to the body; the body's result (an IValue for run_ivalue(), a
// tensor vector for run_tensors()) comes back as it is. On CUDA, a pool_stream run's inputs
// keep their memory until the caller's stream has waited for the run.
#include "../../support/fixtures.hpp"
#include "../../support/streams.hpp"

#include <torchloom/torchloom.hpp>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

using torchloom::model_spec;
using torchloom_test::temp_dir;

namespace {

// What the probe policy saw in its last execute().
struct probe_record {
  std::size_t given = 0;            // input tensors that reached the policy
  std::size_t held_after_body = 0;  // of those, still defined in the policy after the body
  long owners_after_body = 0;       // references to the first input after the body
  const void* first_input = nullptr;
  const void* first_after_body = nullptr;
  std::size_t outputs = 0;          // output tensors the body returned
  bool tensor_result = false;       // the body returned std::vector<at::Tensor>
};
probe_record seen;

// A stream policy that takes what it needs of the inputs before handing them on, as a fencing
// policy does, and looks at it after the body.
struct probe_stream {
  explicit probe_stream(const torchloom::model_context&) {}

  template <class Inputs, class Body>
  torchloom::detail::run_result_t<Body, Inputs> execute(c10::Device device, Inputs inputs,
                                                         Body&& body) {
    seen = {};
    std::vector<at::Tensor> kept;
    torchloom::detail::for_each_tensor(inputs, [&](const at::Tensor& t) { kept.push_back(t); });
    seen.given = kept.size();
    if (!kept.empty()) seen.first_input = kept.front().data_ptr();
    auto out = torchloom::detail::run_on_host(device, std::move(inputs), std::forward<Body>(body));
    for (const auto& t : kept) seen.held_after_body += t.defined() ? 1 : 0;
    if (!kept.empty()) {
      seen.owners_after_body = kept.front().use_count();
      seen.first_after_body = kept.front().data_ptr();
    }
    torchloom::detail::for_each_tensor(out, [&](const at::Tensor&) { ++seen.outputs; });
    seen.tensor_result = std::is_same_v<decltype(out), std::vector<at::Tensor>>;
    return out;
  }
};
static_assert(torchloom::stream_policy<probe_stream>);

// TorchScript with a tensor path of its own (as aoti_loader has), so that run_tensors() lends
// the tensors to the policy and the body returns a tensor vector.
struct tensor_torchscript_loader : torchloom::torchscript_loader {
  std::vector<at::Tensor> run_tensors(model_type& m, const std::vector<at::Tensor>& inputs,
                                      const torchloom::run_context& rc) const {
    return {run(m, std::vector<c10::IValue>(inputs.begin(), inputs.end()), rc).toTensor()};
  }
};
static_assert(torchloom::tensor_loader<tensor_torchscript_loader>);

template <class Loader, class Stream>
using runner = torchloom::model_runner<Loader, torchloom::no_hook, Stream>;

struct linear_model {
  temp_dir dir;
  torch::jit::Module module = torchloom_test::make_linear(8, 4);
  at::Tensor w = module.attr("w").toTensor();
  at::Tensor b = module.attr("b").toTensor();

  linear_model() { torchloom_test::write_triton_model(dir / "linear", module); }
  model_spec spec() const { return model_spec::from_directory(dir / "linear"); }
  at::Tensor reference(const at::Tensor& x) const { return at::matmul(x, w.t()) + b; }
};

// What a watching_loader does after the model: allocates the inputs' size on `caller` (the
// caller's stream), as the caller's next kernels could while the model's are still queued.
struct watch_state {
  std::optional<c10::Stream> caller;
  std::int64_t bytes = 0;
  const void* allocated = nullptr;
};
watch_state watch;

struct watching_loader : torchloom::torchscript_loader {
  c10::IValue run(model_type& m, std::vector<c10::IValue>&& inputs,
                  const torchloom::run_context& rc) const {
    c10::IValue out = torchscript_loader::run(m, std::move(inputs), rc);
    // The model has consumed the inputs: whoever still holds them is the stream policy.
    if (watch.caller) {
      const c10::StreamGuard on_caller(*watch.caller);
      const at::Tensor t = at::empty({watch.bytes}, at::TensorOptions().dtype(at::kByte).device(rc.device));
      watch.allocated = t.data_ptr();
    }
    return out;
  }
};

// forward(x) = x * 2 after a long chain of large products on the stream it runs on, so that
// the run is still going on the GPU when run() returns.
model_spec slow_model(const temp_dir& t) {
  torch::jit::Module m("slow");
  m.define(R"(
def forward(self, x):
    w = torch.full([4096, 4096], 0.000244140625, dtype=x.dtype, device=x.device)
    y = w
    for _ in range(24):
        y = torch.mm(y, w)
    return x * 2.0 + y.sum() * 0.0
)");
  m.save((t / "slow.pt").string());
  return model_spec::from_file(t / "slow.pt");
}

// forward(x) = x * 2: the output has the input's size, so a run's output is made in the block
// the last run's output had whenever that block is free.
model_spec doubling_model(const temp_dir& t) {
  torch::jit::Module m("doubling");
  m.define(R"(
def forward(self, x):
    return x * 2.0
)");
  m.save((t / "doubling.pt").string());
  return model_spec::from_file(t / "doubling.pt");
}

}  // namespace

TEST_CASE("run() and run_ivalue() move the inputs into the stream policy, which owns them",
          "[stream]") {
  linear_model m;
  runner<torchloom::torchscript_loader, probe_stream> r(m.spec());
  const at::Tensor x = torch::rand({2, 8});
  // A fresh copy of x as the one input, and where its data lives.
  at::Tensor given = x.clone();
  const void* data = given.data_ptr();
  std::vector<c10::IValue> inputs;
  inputs.emplace_back(std::move(given));
  // The model consumed the inputs it was handed; what the policy kept is still there, and it
  // is the only holder: the runner kept nothing back.
  const auto check_owned_by_policy = [&] {
    CHECK(seen.given == 1);
    CHECK(seen.held_after_body == 1);
    CHECK(seen.first_after_body == data);
    CHECK(seen.owners_after_body == 1);
    CHECK_FALSE(seen.tensor_result);
    CHECK(seen.outputs == 1);
  };

  SECTION("run()") {
    const auto out = r.run(std::move(inputs));
    CHECK(torch::allclose(out.at(0), m.reference(x)));
    check_owned_by_policy();
  }
  SECTION("run_ivalue()") {
    const c10::IValue out = r.run_ivalue(std::move(inputs));
    CHECK(torch::allclose(out.toTensor(), m.reference(x)));
    check_owned_by_policy();
  }
  SECTION("run_tensors() with a loader that has no tensor path: run()'s way") {
    const auto out = r.run_tensors({x});
    CHECK(torch::allclose(out.at(0), m.reference(x)));
    CHECK(seen.given == 1);
    CHECK(seen.held_after_body == 1);
    CHECK_FALSE(seen.tensor_result);
  }
}

TEST_CASE("run_tensors() lends the caller's tensors to the stream policy, and the body's tensor "
          "vector comes back as it is",
          "[stream]") {
  linear_model m;
  runner<tensor_torchscript_loader, probe_stream> r(m.spec());
  const std::vector<at::Tensor> inputs{torch::rand({3, 8})};
  const auto out = r.run_tensors(inputs);
  REQUIRE(out.size() == 1);
  CHECK(torch::allclose(out[0], m.reference(inputs[0])));
  CHECK(seen.given == 1);
  // The caller's own tensor, not a copy, and still there after the body.
  CHECK(seen.first_input == inputs[0].data_ptr());
  CHECK(seen.held_after_body == 1);
  CHECK(seen.first_after_body == inputs[0].data_ptr());
  // No IValue around the outputs: the policy saw the loader's vector.
  CHECK(seen.tensor_result);
  CHECK(seen.outputs == 1);
  // The runner's other entry points on the same runner still take the IValue path.
  CHECK(torch::allclose(r.run({inputs[0]}).at(0), m.reference(inputs[0])));
  CHECK_FALSE(seen.tensor_result);
}

TEST_CASE("CUDA: torchscript_loader runs on the run_context's stream, whatever is current",
          "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  temp_dir t;
  const model_spec spec = torchloom_test::stream_probe_model(t);
  const c10::Device gpu("cuda:0");
  const torchloom::torchscript_loader loader;
  auto model = loader.load(torchloom::load_context{
      spec, spec.model_file(torchloom::torchscript_loader::default_filename), gpu});
  const auto* impl = c10::impl::getDeviceGuardImpl(gpu.type());
  const c10::Stream current = impl->getStream(gpu);
  const c10::Stream chosen = impl->getStreamFromGlobalPool(gpu);
  REQUIRE(chosen != current);
  const auto out =
      loader
          .run(model, std::vector<c10::IValue>{torch::rand({4}, torch::kCUDA)},
               torchloom::run_context{gpu, chosen})
          .toTuple();
  CHECK(out->elements()[1].toInt() == chosen.id());
  CHECK(impl->getStream(gpu) == current);  // put back
}

TEST_CASE("CUDA: a pool_stream run keeps its inputs' memory until the caller's stream has "
          "waited for it",
          "[stream][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  temp_dir t;
  const c10::Device gpu("cuda:0");
  runner<watching_loader, torchloom::pool_stream> r(slow_model(t), gpu);
  const auto* impl = c10::impl::getDeviceGuardImpl(gpu.type());
  const c10::Stream caller = impl->getStream(gpu);
  const auto expected = torch::full({1 << 20}, 6.0f);

  SECTION("an input made on the caller's stream is not handed out again during the run") {
    // The runner holds the only reference: the model consumes it while its kernels that read
    // it are still queued on the pool stream.
    at::Tensor x = torch::full({1 << 20}, 3.0f, torch::kCUDA);
    const void* data = x.data_ptr();
    watch = {caller, static_cast<std::int64_t>(x.nbytes()), nullptr};
    std::vector<c10::IValue> inputs;
    inputs.emplace_back(std::move(x));
    const auto out = r.run(std::move(inputs)).at(0);
    watch.caller.reset();
    REQUIRE(watch.allocated != nullptr);
    CHECK(watch.allocated != data);
    CHECK(torch::equal(out.cpu(), expected));
  }
  SECTION("an input made on another stream is recorded on the caller's stream") {
    // A high-priority pool stream: never the runner's (low-priority) pool stream.
    const c10::Stream other = impl->getStreamFromGlobalPool(gpu, /*isHighPriority=*/true);
    at::Tensor x;
    {
      const c10::StreamGuard on_other(other);
      x = torch::full({1 << 20}, 3.0f, torch::kCUDA);
    }
    other.synchronize();
    const void* data = x.data_ptr();
    const auto bytes = static_cast<std::int64_t>(x.nbytes());
    std::vector<c10::IValue> inputs;
    inputs.emplace_back(std::move(x));
    const auto out = r.run(std::move(inputs)).at(0);
    // The input was freed when run() let go of it, behind the caller's wait for the pool
    // stream. `other` does not wait for that: while the run goes on, the allocator must not
    // give `other` its block.
    at::Tensor again;
    {
      const c10::StreamGuard on_other(other);
      again = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(gpu));
    }
    const bool still_running = !caller.query();
    if (still_running) {
      CHECK(again.data_ptr() != data);
    } else {
      WARN("the run finished before the allocation: this run shows nothing");
    }
    CHECK(torch::equal(out.cpu(), expected));
  }
}

// `{ runner r; out = r.run(x); }` and then another load: the runner must not give its weights
// back to the allocator (which hands them to the next load's weights at once) while the run
// that reads them is still queued, whichever stream it is queued on.
TEMPLATE_TEST_CASE("CUDA: a runner destroyed right after its run leaves the run's outputs "
                   "intact when another model loads",
                   "[stream][cuda][hazards]", torchloom::caller_stream, torchloom::pool_stream,
                   torchloom::graphed<torchloom::pool_stream>) {
  TORCHLOOM_REQUIRE_CUDA();
  const c10::Device gpu("cuda:0");
  temp_dir t;
  auto first = torchloom_test::make_slow_chain(2048, 30, 1);
  auto second = torchloom_test::make_slow_chain(2048, 30, 2);
  torchloom_test::write_triton_model(t / "first", first);
  torchloom_test::write_triton_model(t / "second", second);
  torch::manual_seed(7);
  const auto x = torch::rand({2048, 2048}, torch::kCUDA);
  at::Tensor expected;
  {
    runner<torchloom::torchscript_loader, torchloom::caller_stream> ref(
        model_spec::from_directory(t / "first"), gpu);
    expected = ref.run({x})[0];
  }
  const c10::Stream caller = torchloom_test::pool_cuda_stream();
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    torch::cuda::synchronize();
    at::Tensor out;
    {
      // Loaded on the current (default) stream; run from another caller stream.
      runner<torchloom::torchscript_loader, TestType> r(model_spec::from_directory(t / "first"),
                                                        gpu);
      const c10::StreamGuard on(caller);
      for (int i = 0; i < 3; ++i) out = r.run({x})[0];  // a graphed runner replays the third
    }
    // The next model's weights, of the same size, are copied in on the default stream.
    runner<torchloom::torchscript_loader, torchloom::caller_stream> next(
        model_spec::from_directory(t / "second"), gpu);
    torch::cuda::synchronize();
    CHECK(torch::equal(out, expected));
  }
}

// A run that fails after its kernels went out must still order the caller's stream after
// them: the inputs it held go back to the caller's pool, and the caller's next kernels must
// not overwrite them while the failed run's kernels still read them.
TEST_CASE("CUDA: a pool_stream run that throws after launching still fences the caller",
          "[stream][cuda][hazards][async]") {
  TORCHLOOM_REQUIRE_CUDA();
  const c10::Device gpu("cuda:0");
  temp_dir t;
  torch::jit::Module m("fails_late");
  m.register_parameter("w", torch::randn({2048, 2048}) / 45.0, false);
  m.define(R"(
def forward(self, x):
    y = x
    for _ in range(30):
        y = torch.tanh(torch.matmul(y, self.w))
    assert y.size(0) == 1, "fails after launching its kernels"
    return y
)");
  m.save((t / "fails_late.pt").string());
  runner<torchloom::torchscript_loader, torchloom::pool_stream> r(
      model_spec::from_file(t / "fails_late.pt"), gpu);
  const c10::Stream caller = torchloom_test::pool_cuda_stream();
  const c10::StreamGuard on(caller);
  const auto x = torch::rand({2048, 2048}, torch::kCUDA);
  torch::cuda::synchronize();
  CHECK_THROWS_AS(r.run({x}), torchloom::error);
  // The caller's stream waits for the run's kernels (milliseconds of them): it cannot be idle.
  CHECK_FALSE(caller.query());
  torch::cuda::synchronize();
}

// A fenced run's output is made on the policy's work stream. The caller reads it on its own
// stream, behind kernels still running there, and lets go of it; the policy's next run, from
// the same stream or another, must not make its output in that memory (and write it) before
// the read. The runner's outputs are checked bitwise. (From the same stream the fence alone
// orders the next run after the read; from another stream only the output's record on the
// caller's stream does.) A switch for tests leaves the outputs unrecorded: the same sequence
// must then show the hazard, or the check could not fail.
TEMPLATE_TEST_CASE("CUDA: an output let go while the caller's stream still reads it keeps its "
                   "bytes until that read, wherever the policy's next run comes from",
                   "[stream][cuda][hazards]", torchloom::pool_stream, torchloom::adaptive_stream,
                   torchloom::graphed<torchloom::pool_stream>) {
  TORCHLOOM_REQUIRE_CUDA();
  const c10::Device gpu("cuda:0");
  temp_dir t;
  runner<torchloom::torchscript_loader, TestType> r(doubling_model(t), gpu);
  const auto* impl = c10::impl::getDeviceGuardImpl(gpu.type());
  // adaptive_stream fences only a caller on the default stream.
  const c10::Stream first = impl->getDefaultStream(gpu);
  const c10::Stream other = impl->getStreamFromGlobalPool(gpu, /*isHighPriority=*/true);
  constexpr std::int64_t n = 1 << 20;
  torch::manual_seed(3);
  const auto slow = torch::rand({4096, 4096}, torch::kCUDA);
  // Rounds where the caller's copy of the output is not what the run returned.
  const auto wrong_copies = [&](const c10::Stream& next) {
    int wrong = 0;
    for (int i = 0; i < 8; ++i) {
      at::Tensor copy;
      {
        const c10::StreamGuard on(first);
        at::Tensor out = r.run({torch::full({n}, static_cast<float>(i), torch::kCUDA)})[0];
        const auto busy = at::matmul(slow, slow);  // milliseconds on the caller's stream
        copy = out.clone();                        // queued behind them
      }  // the output is let go while its read is still queued
      {
        const c10::StreamGuard on(next);
        (void)r.run({torch::full({n}, 1000.0f + static_cast<float>(i), torch::kCUDA)});
      }
      torch::cuda::synchronize();
      if (!torch::equal(copy, torch::full({n}, 2.0f * static_cast<float>(i), torch::kCUDA))) {
        ++wrong;
      }
    }
    return wrong;
  };
  SECTION("the next run from the same stream") { CHECK(wrong_copies(first) == 0); }
  SECTION("the next run from another stream") { CHECK(wrong_copies(other) == 0); }
  if constexpr (std::is_same_v<TestType, torchloom::pool_stream>) {
    SECTION("with the outputs not recorded, the check sees the hazard") {
      struct unguarded {  // set for this section only, also when it throws
        unguarded() { torchloom::detail::unguarded_outputs_for_tests = true; }
        ~unguarded() { torchloom::detail::unguarded_outputs_for_tests = false; }
      } on;
      CHECK(wrong_copies(other) > 0);
    }
  }
}

