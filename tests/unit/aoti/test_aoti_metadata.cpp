// What an AOTInductor package declares about its inputs, read from text: the
// `torchloom.inputs` metadata entry and the call spec's input tree. No package needed, so
// these run with every LibTorch.
#include "../../support/catch.hpp"

#include <torchloom/loader/aoti_metadata.hpp>

#include <stdexcept>
#include <string>

using torchloom::detail::count_pytree_leaves;
using torchloom::detail::parse_declared_inputs;

TEST_CASE("torchloom.inputs: names, dtypes and shapes", "[aoti]") {
  const auto sig = parse_declared_inputs(" x : float32[-1, 64] ; ids:int64[-1,4];s:bool[];m:uint8");
  REQUIRE(sig.size() == 4);
  CHECK(sig[0].name == "x");
  CHECK(sig[0].dtype == c10::ScalarType::Float);
  CHECK(sig[0].shape == std::vector<std::int64_t>{-1, 64});
  CHECK(sig[1].name == "ids");
  CHECK(sig[1].dtype == c10::ScalarType::Long);
  CHECK(sig[1].shape == std::vector<std::int64_t>{-1, 4});
  CHECK(sig[2].shape == std::vector<std::int64_t>{});
  CHECK(sig[3].dtype == c10::ScalarType::Byte);
  CHECK_FALSE(sig[3].shape.has_value());
  for (const auto& s : sig) CHECK(s.is_tensor);
  CHECK(parse_declared_inputs("").empty());
}

TEST_CASE("torchloom.inputs: a malformed entry says which and why", "[aoti]") {
  const auto message = [](const char* text) {
    try {
      parse_declared_inputs(text);
    } catch (const torchloom::error& e) {
      CHECK(e.code() == torchloom::errc::load_failed);
      return e.message();
    }
    return std::string("(nothing thrown)");
  };
  CHECK(message("x") == "entry 'x': expected NAME:DTYPE[DIMS]");
  CHECK(message(":float32") == "entry ':float32': the name is empty");
  CHECK(message("x:float99[1]") ==
        "entry 'x:float99[1]': unknown dtype 'float99' (float32, int64, ...)");
  CHECK(message("x:float32[1,2") == "entry 'x:float32[1,2': the shape must end with ']'");
  CHECK(message("x:float32[1,,2]") ==
        "entry 'x:float32[1,,2]': dimension '' is not an integer >= -1");
  CHECK(message("x:float32[-2]") ==
        "entry 'x:float32[-2]': dimension '-2' is not an integer >= -1");
  CHECK(message("x:float32[a]") == "entry 'x:float32[a]': dimension 'a' is not an integer >= -1");
}

TEST_CASE("call spec: the input tree's leaves are the flattened inputs", "[aoti]") {
  // ((x, ids), {}) as torch.utils._pytree serialises it.
  const std::string two_args = R"([1, {"type": "builtins.tuple", "context": "null",
    "children_spec": [{"type": "builtins.tuple", "context": "null", "children_spec": [
      {"type": null, "context": null, "children_spec": []},
      {"type": null, "context": null, "children_spec": []}]},
    {"type": "builtins.dict", "context": "[]", "children_spec": []}]}])";
  CHECK(count_pytree_leaves(two_args) == 2u);
  // A keyword argument, and a context string that looks like a leaf but is text.
  const std::string kwarg = R"([1,{"type":"builtins.tuple","context":"null","children_spec":[
    {"type":"builtins.tuple","context":"null","children_spec":[]},
    {"type":"builtins.dict","context":"[\"mask\", \"{\\\"type\\\": null}\"]","children_spec":[
      {"type":null,"context":null,"children_spec":[]}]}]}])";
  CHECK(count_pytree_leaves(kwarg) == 1u);
  CHECK(count_pytree_leaves(R"([1, {"type": "builtins.tuple)") == std::nullopt);
}
