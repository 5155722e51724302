// The weight reads of an AOTInductor package exported for streaming, apart from a package
// (torchloom/loader/aoti_weights.hpp): what the first run records (the order of the reads and
// when each read's tensor is let go, a kernel that reads several weights included), how later
// runs are served, and the clear error when a run reads in another order. Plain CPU tensors
// stand for the package's calls of torchloom::stream_weight. Then what such a package declares
// about its weights and weights.pt beside it (torchloom/loader/aoti_package_weights.hpp): the
// metadata entry with the names of tied weights, the checks against the package's constants
// (the export helper's rules), and the file's tensors as the package reads them.
#include "support/catch.hpp"
#include "support/fixtures.hpp"
#include "support/temp_dir.hpp"

#include <torchloom/loader/aoti_weights.hpp>

#include <ATen/ATen.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

using torchloom::errc;
using torchloom::detail::active_reads_scope;
using torchloom::detail::kept_weight_names;
using torchloom::detail::package_constant;
using torchloom::detail::package_reads;
using torchloom::detail::parse_stream_weights;
using torchloom::detail::read_package_weights;
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

namespace {

using names_list = std::vector<std::vector<std::string>>;

// weights.pt as the export helper writes it: buffers w0, w1, ... of a TorchScript module.
std::filesystem::path write_weights(const std::filesystem::path& dir,
                                    const std::vector<at::Tensor>& tensors) {
  torch::jit::Module holder("weights");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    holder.register_buffer(torchloom::detail::concat("w", i), tensors[i]);
  }
  holder.define("def forward(self, x):\n    return x\n");
  const auto file = dir / "weights.pt";
  holder.save(file.string());
  return file;
}

package_constant constant(std::string fqn, c10::ScalarType dtype, std::size_t bytes) {
  return package_constant{std::move(fqn), dtype, bytes};
}

}  // namespace

TEST_CASE("stream_weights metadata: weights by ';', the names of a weight by ','; an empty or "
          "repeated name is malformed, naming the fix",
          "[aoti_reads]") {
  CHECK(parse_stream_weights(
            "m", "lm_head.weight, transformer.wte.weight;transformer.wpe.weight") ==
        names_list{{"lm_head.weight", "transformer.wte.weight"}, {"transformer.wpe.weight"}});
  // A package exported before weights had several names: one name each.
  CHECK(parse_stream_weights("m", "a;b") == names_list{{"a"}, {"b"}});
  CHECK(parse_stream_weights("m", "").empty());
  CHECK_TORCHLOOM_ERROR(parse_stream_weights("m", "a;;b"), errc::load_failed, "model 'm'",
                        "torchloom.stream_weights", "weight 1 has an empty name",
                        "torchloom_export.py");
  CHECK_TORCHLOOM_ERROR(parse_stream_weights("m", "a,;b"), errc::load_failed,
                        "weight 0 has an empty name");
  CHECK_TORCHLOOM_ERROR(parse_stream_weights("m", "a,b;b"), errc::load_failed,
                        "'b' names weights 0 and 1");
}

TEST_CASE("package weights: each weight is the constant the package keeps under one of its "
          "names (tied tensors: inductor's choice)",
          "[aoti_reads]") {
  // GPT-2 as torch 2.11 compiles it: the tied embedding kept as lm_head.weight.
  const names_list gpt2{{"transformer.wte.weight", "lm_head.weight"}, {"transformer.wpe.weight"}};
  const std::vector<package_constant> constants{
      constant("transformer.wpe.weight", c10::kFloat, 1024),
      constant("lm_head.weight", c10::kFloat, 4096)};
  CHECK(kept_weight_names("m", gpt2, constants) ==
        std::vector<std::string>{"lm_head.weight", "transformer.wpe.weight"});
  // A package that cannot tell its constants: the first names.
  CHECK(kept_weight_names("m", gpt2, {}) ==
        std::vector<std::string>{"transformer.wte.weight", "transformer.wpe.weight"});
}

TEST_CASE("package weights: a weight the package does not keep, a constant no weight names, "
          "and two weights in one constant fail at load naming them and the fix",
          "[aoti_reads]") {
  const std::vector<package_constant> constants{constant("a", c10::kFloat, 64),
                                                constant("b", c10::kFloat, 64)};
  // A tensor inductor wrote as code, listed as a weight (what the helper did before it knew).
  CHECK_TORCHLOOM_ERROR(kept_weight_names("m", names_list{{"a"}, {"b"}, {"m.lifted_tensor_0"}},
                                          constants),
                        errc::load_failed, "model 'm'", "weight 'm.lifted_tensor_0'",
                        "fetch index 2", "has no constant of that name", "made it code",
                        "torchloom_export.py");
  CHECK_TORCHLOOM_ERROR(
      kept_weight_names("m", names_list{{"a"}, {"x", "y"}}, constants), errc::load_failed,
      "weight 'x' (also 'y')", "has no constant of any of those names");
  // A constant nothing gives its data to.
  CHECK_TORCHLOOM_ERROR(kept_weight_names("m", names_list{{"a"}}, constants), errc::load_failed,
                        "keeps 1 of its 2 constants out", "'b'", "nothing would give them",
                        "torchloom_export.py");
  CHECK_TORCHLOOM_ERROR(kept_weight_names("m", names_list{{"a", "b"}}, constants),
                        errc::load_failed, "weight 'a' (also 'b')", "two constants, 'a' and 'b'");
  CHECK_TORCHLOOM_ERROR(kept_weight_names("m", names_list{{"a"}, {"c", "a"}}, constants),
                        errc::load_failed, "weights 'a' and 'c' (also 'a')",
                        "one constant, 'a'");
}

TEST_CASE("weights.pt: one tensor per weight with its dtype and strides; a count, dtype or size "
          "that does not match the package fails naming the file and the weight",
          "[aoti_reads]") {
  torchloom_test::temp_dir dir;
  const at::Tensor emb = at::randn({6, 4});                          // fp32, tied
  const at::Tensor ids = at::arange(8, at::kLong);                   // an int64 buffer
  const at::Tensor proj = at::randn({4, 5}).to(at::kBFloat16).t();  // dense, transposed
  const auto file = write_weights(dir.path(), {emb, ids, proj});
  const names_list names{{"emb.weight", "head.weight"}, {"ids"}, {"proj"}};
  const std::vector<package_constant> constants{
      constant("head.weight", c10::kFloat, 6 * 4 * 4), constant("ids", c10::kLong, 8 * 8),
      // A CPU package rounds a constant's bytes up to 64; a view's storage may be larger.
      constant("proj", c10::kBFloat16, 64)};
  const auto read = read_package_weights("m", file, names, constants);
  CHECK(read.names == std::vector<std::string>{"head.weight", "ids", "proj"});
  REQUIRE(read.tensors.size() == 3);
  CHECK(torch::equal(read.tensors[0], emb));
  CHECK(read.tensors[1].scalar_type() == at::kLong);
  CHECK(torch::equal(read.tensors[1], ids));
  CHECK(read.tensors[2].scalar_type() == at::kBFloat16);
  CHECK(read.tensors[2].strides() == proj.strides());  // the package reads it with these
  CHECK(torch::equal(read.tensors[2], proj));

  auto wrong = constants;
  wrong[1].dtype = c10::kInt;
  CHECK_TORCHLOOM_ERROR(read_package_weights("m", file, names, wrong), errc::load_failed,
                        "weights.pt", "weight 'ids' is int64, 64 bytes",
                        "the package's constant 'ids' is int32", "torchloom_export.py");
  wrong = constants;
  wrong[0].bytes = 16;
  CHECK_TORCHLOOM_ERROR(read_package_weights("m", file, names, wrong), errc::load_failed,
                        "weight 'emb.weight' (also 'head.weight')", "96 bytes",
                        "at most 16 bytes");
  CHECK_TORCHLOOM_ERROR(read_package_weights("m", file, names_list{{"emb.weight"}, {"ids"}},
                                             {}),
                        errc::load_failed, "holds 3 tensors but the package declares 2 weights",
                        "torchloom_export.py");
  CHECK_TORCHLOOM_ERROR(read_package_weights("m", dir.path() / "none.pt", names, constants),
                        errc::load_failed, "cannot read the package's weights", "none.pt");
}
