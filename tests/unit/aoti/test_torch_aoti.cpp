// Triton's torch_aoti repositories through the runner: packages made with plain
// aoti_compile_and_package (a torchvision ResNet, a Hugging Face BERT, the dict-in/dict-out
// model of Triton's README) and config.pbtxt files as Triton's documentation writes them,
// named by Triton 26.05's rules; every stream policy and residency, dynamic batches, the
// package's names. Needs LibTorch >= 2.6 and the packages of scripts/make_aoti_fixtures.py
// (TORCHLOOM_AOTI_FIXTURES or the build tree's aoti_fixtures/); without them the cases skip.
#include <torchloom/detail/config.hpp>

#if TORCHLOOM_TORCH_VERSION >= 20600

#include "../../support/aoti_fixtures.hpp"
#include "../../support/aoti_reference.hpp"
#include "../../support/fixtures.hpp"
#include "../../support/streams.hpp"

#include <torchloom/torchloom.hpp>

#include <c10/core/StreamGuard.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <vector>

using torchloom::errc;
using torchloom::model_spec;
using reference = torchloom_test::aoti_reference;
using torchloom_test::on_device;
using torchloom_test::pool_cuda_stream;
using torchloom_test::read_aoti_reference;

namespace {

namespace fs = std::filesystem;

template <class Stream = torchloom::caller_stream>
using runner = torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook, Stream>;

struct repository_case {
  const char* fixture;
  std::vector<std::string> inputs;   // forward-based names, in the call spec's order
  std::vector<std::string> outputs;  // forward-based names, in the call spec's order
  std::vector<std::string> config_outputs;  // the config's name for each output, same order
  double tolerance;
};

const std::vector<repository_case>& repository_cases() {
  static const std::vector<repository_case> cases = {
      {"resnet_aoti", {"ARGS[0]"}, {"RESULT"}, {"OUTPUT__0"}, 1e-3},
      {"bert_aoti",
       {"KWARGS[input_ids]", "KWARGS[attention_mask]"},
       {"RESULT[last_hidden_state]", "RESULT[pooler_output]"},
       {"RESULT[last_hidden_state]", "RESULT[pooler_output]"},
       1e-4},
      {"dict_io_aoti",
       {"ARGS[0]", "ARGS[1]", "ARGS[2][keyA]", "ARGS[2][key2]", "KWARGS[kwarg1]",
        "KWARGS[kw_arg2]"},
       {"RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]", "RESULT[CCC][keyA]",
        "RESULT[CCC][key2]", "RESULT[DDD][KA]", "RESULT[DDD][KB]"},
       {"RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]", "RESULT[CCC][keyA]",
        "RESULT[CCC][key2]", "RESULT[DDD][KA]", "RESULT[DDD][KB]"},
       1e-3},
  };
  return cases;
}

bool close_to(const at::Tensor& got, const at::Tensor& want, double tolerance) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return false;
  return torch::allclose(got.cpu().to(torch::kDouble), want.cpu().to(torch::kDouble), tolerance,
                         tolerance);
}

// The references were computed without TF32 (cuDNN's convolutions use it by default).
struct no_tf32 {
  bool before = at::globalContext().allowTF32CuDNN();
  no_tf32() { at::globalContext().setAllowTF32CuDNN(false); }
  ~no_tf32() { at::globalContext().setAllowTF32CuDNN(before); }
};

// Loads the repository `dir` with model_runner<aoti_loader, no_hook, Stream, Residency> on
// the GPU its instance_group names, and checks run() and run_named() (forward-based and
// ordinal names in, the config's names out) against the eager reference.
template <class Stream, class Residency>
void check_repository(const repository_case& c, const fs::path& dir) {
  INFO(c.fixture << " with " << typeid(Stream).name() << ", " << typeid(Residency).name());
  using runner_type = torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook, Stream,
                                              Residency>;
  model_spec spec = model_spec::from_directory(dir);
  REQUIRE(spec.platform.name == "torch_aoti");
  REQUIRE(torchloom::loader_for(spec) == torchloom::loader_kind::aoti);
  if constexpr (std::is_same_v<Stream, torchloom::green_context_stream>) {
    spec.set("GREEN_CONTEXT_SM_COUNT", "16");
  }
  const reference ref = read_aoti_reference(dir);
  REQUIRE(ref.inputs.size() == c.inputs.size());
  REQUIRE(ref.outputs.size() == c.outputs.size());
  runner_type r(spec);
  CHECK(r.device() == c10::Device("cuda:0"));  // instance_group KIND_GPU gpus [0]
  CHECK(r.names().inputs == c.inputs);
  CHECK(r.names().outputs == c.outputs);
  const auto check_outputs = [&](const std::vector<at::Tensor>& got) {
    REQUIRE(got.size() == ref.outputs.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("output " << i << " (" << c.outputs[i] << ")");
      CHECK(got[i].device() == c10::Device("cuda:0"));
      CHECK(close_to(got[i], ref.outputs[i], c.tolerance));
    }
  };
  check_outputs(r.run(ref.inputs));  // CPU inputs, moved
  check_outputs(r.run(on_device(ref.inputs, c10::Device("cuda:0"))));
  std::map<std::string, c10::IValue> forward;
  std::map<std::string, c10::IValue> ordinal;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    forward[c.inputs[i]] = ref.inputs[i];
    ordinal["INPUT__" + std::to_string(i)] = ref.inputs[i];
  }
  for (const auto& named : {r.run_named(forward), r.run_named(ordinal)}) {
    REQUIRE(named.size() == c.config_outputs.size());
    std::vector<at::Tensor> got;
    for (const auto& n : c.config_outputs) {
      INFO(n);
      REQUIRE(named.count(n) == 1);
      got.push_back(named.at(n).toTensor());
    }
    check_outputs(got);
  }
  for (std::size_t i = 0; i < c.outputs.size(); ++i) {
    CHECK(r.output_index(c.outputs[i]) == i);
    CHECK(r.output_index("OUTPUT__" + std::to_string(i)) == i);
  }
  if constexpr (std::is_same_v<Residency, torchloom::shared_weights>) {
    runner_type second(spec);  // the same package's weights, shared
    check_outputs(second.run(ref.inputs));
  }
}

template <class Stream>
void check_repositories() {
  TORCHLOOM_REQUIRE_CUDA();
  const no_tf32 exact;
  for (const auto& c : repository_cases()) {
    const auto found = torchloom_test::aoti_fixture(c.fixture);
    if (!found) {
      TORCHLOOM_CATCH_SKIP(std::string("no AOTI fixture '") + c.fixture + "' in " +
                           torchloom_test::aoti_fixture_root().string() +
                           "; run scripts/make_aoti_fixtures.py DIR and set "
                           "TORCHLOOM_AOTI_FIXTURES");
    }
    const fs::path dir = *found;
    check_repository<Stream, torchloom::resident_weights>(c, dir);
    check_repository<Stream, torchloom::shared_weights>(c, dir);
#if TORCHLOOM_HAS_CUDA
    check_repository<Stream, torchloom::mapped_weights>(c, dir);
#endif
  }
}

}  // namespace

TEST_CASE("torch_aoti CUDA: Triton's repositories through caller_stream", "[aoti][cuda][triton]") {
  check_repositories<torchloom::caller_stream>();
}
TEST_CASE("torch_aoti CUDA: Triton's repositories through pool_stream", "[aoti][cuda][triton]") {
  check_repositories<torchloom::pool_stream>();
}
TEST_CASE("torch_aoti CUDA: Triton's repositories through adaptive_stream",
          "[aoti][cuda][triton]") {
  check_repositories<torchloom::adaptive_stream>();
}
#if TORCHLOOM_HAS_CUDA
TEST_CASE("torch_aoti CUDA: Triton's repositories through green_context_stream",
          "[aoti][cuda][triton]") {
  check_repositories<torchloom::green_context_stream>();
}
#endif

TEST_CASE("torch_aoti CUDA: a dynamic batch dimension serves batches up to max_batch_size",
          "[aoti][cuda][triton][batch]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "resnet_aoti");
  const no_tf32 exact;
  const reference ref = read_aoti_reference(dir);  // a batch of 8
  const at::Tensor x = ref.inputs.front().toTensor();
  const at::Tensor want = ref.outputs.front();
  REQUIRE(x.size(0) == 8);
  runner<torchloom::pool_stream> r(model_spec::from_directory(dir));
  REQUIRE(r.inputs().size() == 1);
  CHECK(r.inputs()[0].max_batch_size == 8);  // config.pbtxt's max_batch_size
  CHECK(r.inputs()[0].shape == std::vector<std::int64_t>{-1, 3, 64, 64});
  for (const std::int64_t b : {1, 3, 5, 8}) {
    INFO("batch " << b);
    const auto out = r.run_tensors({x.narrow(0, 0, b)});
    REQUIRE(out.size() == 1);
    CHECK(out[0].size(0) == b);
    CHECK(close_to(out[0], want.narrow(0, 0, b), 1e-3));
    // The batches a dynamic batcher gathers: rows from several requests, one call.
    const auto named = r.run_named({{"INPUT__0", x.narrow(0, 8 - b, b)}});
    CHECK(close_to(named.at("OUTPUT__0").toTensor(), want.narrow(0, 8 - b, b), 1e-3));
  }
  CHECK_TORCHLOOM_ERROR(r.run({torch::cat({x, x.narrow(0, 0, 1)})}), errc::bad_input,
                        "input 0", "has a batch of 9", "max_batch_size is 8");
  CHECK_TORCHLOOM_ERROR(r.run({x.narrow(1, 0, 2)}), errc::bad_input, "shape [-1, 3, 64, 64]");
  // Requests of different batch sizes from several threads at once.
  std::vector<at::Tensor> expected;
  for (std::int64_t b = 1; b <= 8; ++b) expected.push_back(r.run_tensors({x.narrow(0, 0, b)})[0]);
  torch::cuda::synchronize();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      c10::StreamGuard guard(pool_cuda_stream());
      for (int i = 0; i < 20; ++i) {
        const std::int64_t b = 1 + (t * 3 + i) % 8;
        const auto out = r.run_tensors({x.narrow(0, 0, b)})[0];
        if (!close_to(out, expected[static_cast<std::size_t>(b - 1)], 1e-5)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
}

TEST_CASE("torch_aoti CUDA: the package's names, the fixed keyword argument, and the wrong loader",
          "[aoti][cuda][triton]") {
  TORCHLOOM_REQUIRE_CUDA();
  TORCHLOOM_REQUIRE_AOTI_FIXTURE(dir, "bert_aoti");
  const reference ref = read_aoti_reference(dir);
  runner<> r(model_spec::from_directory(dir));
  // return_dict=True was fixed at export: a leaf of the call spec, not an input.
  CHECK(r.names().fixed_inputs == std::vector<std::string>{"KWARGS[return_dict]"});
  REQUIRE(r.inputs().size() == 2);
  // torch 2.11 names the package's graph inputs arg<N>_<M>: the config's names, which also
  // say which of the three leaves are inputs, are theirs.
  CHECK(r.inputs()[0].name == "KWARGS[input_ids]");
  CHECK(r.inputs()[0].dtype == c10::ScalarType::Long);  // from config.pbtxt
  CHECK(r.input_index("KWARGS[input_ids]") == 0u);
  CHECK(r.input_index("KWARGS[attention_mask]") == 1u);
  CHECK_TORCHLOOM_ERROR(r.run_named({{"KWARGS[input_ids]", ref.inputs[0]},
                                     {"KWARGS[attention_mask]", ref.inputs[1]},
                                     {"KWARGS[return_dict]", ref.inputs[1]}}),
                        errc::bad_input, "'KWARGS[return_dict]'",
                        "fixed when the model was exported");
  CHECK_TORCHLOOM_ERROR(r.run({ref.inputs[0].toTensor().to(torch::kInt32), ref.inputs[1]}),
                        errc::bad_input, "input 0 ('KWARGS[input_ids]') must be int64");
  // The repository is torch_aoti: a TorchScript runner refuses it, naming both.
  CHECK_TORCHLOOM_ERROR(
      torchloom::model_runner<torchloom::torchscript_loader>(model_spec::from_directory(dir)),
      errc::invalid_option, "platform 'torch_aoti' calls for an AOTInductor package",
      "use model_runner<aoti_loader, ...>");
  // Chosen at run time, as the CLI and the backend choose it.
  const auto spec = model_spec::from_directory(dir);
  torchloom::policy_choice choice;
  choice.loader = torchloom::loader_for(spec);
  choice.stream = torchloom::stream_kind::pool;
  const auto out = torchloom::with_runner_type(choice, [&](auto type) {
    typename decltype(type)::type chosen(spec);
    return chosen.run(ref.inputs);
  });
  REQUIRE(out.size() == 2);
  CHECK(close_to(out[1], ref.outputs[1], 1e-4));
}

#endif  // TORCHLOOM_TORCH_VERSION >= 20600
