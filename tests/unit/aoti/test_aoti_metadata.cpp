// What an AOTInductor package declares about its inputs and outputs, read from text: the
// `torchloom.inputs` metadata entry and the call spec's trees, named as Triton names them. No
// package needed, so these run with every LibTorch.
#include "../../support/catch.hpp"

#include <torchloom/detail/json.hpp>
#include <torchloom/io_names.hpp>
#include <torchloom/loader/aoti_call_spec.hpp>
#include <torchloom/loader/aoti_metadata.hpp>

#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {
bool torchloom_contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}
}  // namespace

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

// ---------------------------------------------------------------------------------------
// Forward-based names (Triton 26.05) from call specs torch 2.11 wrote for real models.

namespace {

using torchloom::detail::json_value;
using torchloom::detail::name_call_spec;
using strings = std::vector<std::string>;

// tests/data/aoti/call_specs.json: each model's input and output treespecs, the compiled
// model's input names and its output count.
const json_value& call_spec_models() {
  static const json_value models = [] {
    std::ifstream in(std::string(TORCHLOOM_TEST_DATA_DIR) + "/aoti/call_specs.json");
    std::ostringstream text;
    text << in.rdbuf();
    return *torchloom::detail::parse_json(text.str()).find("models");
  }();
  return models;
}

torchloom::io_names names_of(const std::string& model) {
  const json_value* m = call_spec_models().find(model);
  REQUIRE(m != nullptr);
  strings inputs;
  for (const auto& n : m->find("package_inputs")->items) inputs.push_back(n.text);
  return name_call_spec({m->find("in_spec")->text, m->find("out_spec")->text}, inputs,
                        std::stoul(m->find("package_outputs")->text));
}

// A call spec written by hand: args and kwargs as treespec JSON.
std::string leaf() { return R"({"type": null, "context": null, "children_spec": []})"; }
std::string node(const std::string& type, const std::string& context, const strings& children) {
  std::string c;
  for (const auto& child : children) c += (c.empty() ? "" : ", ") + child;
  return R"({"type": )" + type + R"(, "context": )" + context + R"(, "children_spec": [)" + c +
         "]}";
}
std::string tuple(const strings& children) {
  return node(R"("builtins.tuple")", R"("null")", children);
}
std::string dict(const std::string& keys_json, const strings& children) {
  std::string quoted;
  for (const char c : keys_json) {
    if (c == '"') quoted += '\\';
    quoted += c;
  }
  return node(R"("builtins.dict")", "\"" + quoted + "\"", children);
}
std::string spec(const std::string& tree) { return "[1, " + tree + "]"; }
std::string inputs_spec(const strings& args, const std::string& kwargs) {
  return spec(tuple({tuple(args), kwargs}));
}

}  // namespace

TEST_CASE("call spec names: Triton's README example, dict keys in insertion order", "[aoti]") {
  const auto n = names_of("triton_example");
  CHECK(n.forward_based);
  CHECK(n.inputs == strings{"ARGS[0]", "ARGS[1]", "ARGS[2][keyA]", "ARGS[2][key2]",
                            "KWARGS[kwarg1]", "KWARGS[kw_arg2]"});
  // The model returns {"AAA", "ZZZ", "BBB": (.., ..), "CCC": {...}, "DDD": {...}}: its order,
  // not sorted.
  CHECK(n.outputs == strings{"RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]",
                             "RESULT[CCC][keyA]", "RESULT[CCC][key2]", "RESULT[DDD][KA]",
                             "RESULT[DDD][KB]"});
  CHECK(n.fixed_inputs.empty());
  CHECK(n.input_index("ARGS[2][key2]") == 3u);
  CHECK(n.input_index("KWARGS[kw_arg2]") == 5u);
  CHECK_FALSE(n.input_index("ARGS[2]"));
  CHECK(n.output_index("RESULT[ZZZ]") == 1u);
  CHECK(n.output_index("RESULT[DDD][KB]") == 7u);
  CHECK(n.output_index("OUTPUT__7") == 7u);
  CHECK_FALSE(n.output_index("OUTPUT__8"));
  CHECK_FALSE(n.output_index("RESULT[BBB]"));
}

TEST_CASE("call spec names: lists, a single tensor, torchvision's ResNet", "[aoti]") {
  const auto lists = names_of("list_in_list_out");
  CHECK(lists.inputs == strings{"ARGS[0][0]", "ARGS[0][1]"});
  CHECK(lists.outputs == strings{"RESULT[0][0]", "RESULT[0][1]", "RESULT[1][0]"});
  for (const char* model : {"single", "resnet18"}) {
    const auto n = names_of(model);
    CHECK(n.inputs == strings{"ARGS[0]"});
    CHECK(n.outputs == strings{"RESULT"});
    CHECK(n.output_index("OUTPUT__0") == 0u);
  }
}

TEST_CASE("call spec names: Hugging Face models, keyword arguments and ModelOutput", "[aoti]") {
  // ModelOutput types (BaseModelOutputWithPooling..., CausalLMOutputWithPast, ...) are named
  // as the dicts they are: RESULT[<field>].
  const auto bert = names_of("bert_kwargs");
  CHECK(bert.inputs == strings{"KWARGS[input_ids]", "KWARGS[attention_mask]"});
  CHECK(bert.outputs == strings{"RESULT[last_hidden_state]", "RESULT[pooler_output]"});
  const auto t5 = names_of("t5_kwargs");
  CHECK(t5.inputs == strings{"KWARGS[input_ids]", "KWARGS[decoder_input_ids]"});
  CHECK(t5.outputs == strings{"RESULT[logits]", "RESULT[encoder_last_hidden_state]"});
  // use_cache=False is a leaf of the call spec, but torch fixed it at export: the package
  // takes input_ids alone, and the names line up with its inputs, not the leaves.
  for (const char* model : {"gpt2_kwargs", "llama_kwargs"}) {
    const auto n = names_of(model);
    CHECK(n.inputs == strings{"KWARGS[input_ids]"});
    CHECK(n.fixed_inputs == strings{"KWARGS[use_cache]"});
    CHECK(n.outputs == strings{"RESULT[logits]"});
    CHECK(torchloom_contains(n.why_not("KWARGS[use_cache]"), "fixed when the model was exported"));
  }
  CHECK(t5.fixed_inputs == strings{"KWARGS[use_cache]"});
  // A positional tensor and a fixed keyword argument (return_dict=False: a tuple out).
  const auto tuple_out = names_of("bert_tuple");
  CHECK(tuple_out.inputs == strings{"ARGS[0]"});
  CHECK(tuple_out.fixed_inputs == strings{"KWARGS[return_dict]"});
  CHECK(tuple_out.outputs == strings{"RESULT[0]", "RESULT[1]"});
  // Read from packages aoti_compile_and_package made: two fixed values among three leaves.
  const auto gpt2 = names_of("gpt2_package");
  CHECK(gpt2.inputs == strings{"KWARGS[input_ids]"});
  CHECK(gpt2.fixed_inputs == strings{"KWARGS[use_cache]", "KWARGS[return_dict]"});
  CHECK(gpt2.outputs == strings{"RESULT[0]"});
  const auto bert_package = names_of("bert_package");
  CHECK(bert_package.inputs == strings{"KWARGS[input_ids]", "KWARGS[attention_mask]"});
  CHECK(bert_package.fixed_inputs == strings{"KWARGS[return_dict]"});
}

TEST_CASE("call spec names: graph inputs matched by name, or no names rather than wrong ones",
          "[aoti]") {
  const std::string out = spec(leaf());
  // torch names a graph input after the argument and the keys below it, lower case, with
  // '_' for other characters, and '_<n>' when the name is taken.
  const auto keyed = name_call_spec(
      {inputs_spec({dict(R"(["Key A", "b"])", {leaf(), leaf()})},
                   dict(R"(["attn-mask", "flag"])", {leaf(), leaf()})),
       out},
      strings{"options_key_a", "options_b", "attn_mask_1"}, 1);
  CHECK(keyed.inputs == strings{"ARGS[0][Key A]", "ARGS[0][b]", "KWARGS[attn-mask]"});
  CHECK(keyed.fixed_inputs == strings{"KWARGS[flag]"});
  // Two positional leaves, one input: which one is not in the names. No names, and why.
  const auto ambiguous =
      name_call_spec({inputs_spec({leaf(), leaf()}, dict("[]", {})), out}, strings{"x"}, 1);
  CHECK(ambiguous.inputs.empty());
  CHECK(torchloom_contains(ambiguous.inputs_unknown,
                           "whether input 'x' is 'ARGS[0]' or 'ARGS[1]'"));
  CHECK(torchloom_contains(ambiguous.inputs_unknown, "keyword arguments"));
  CHECK(torchloom_contains(ambiguous.why_not("ARGS[0]"), "have no forward-based names"));
  CHECK(ambiguous.outputs == strings{"RESULT"});  // the outputs are named all the same
  // An input no leaf can be; more inputs than leaves.
  const auto unmatched = name_call_spec(
      {inputs_spec({}, dict(R"(["a", "b"])", {leaf(), leaf()})), out}, strings{"c"}, 1);
  CHECK(unmatched.inputs.empty());
  CHECK(torchloom_contains(unmatched.inputs_unknown, "no leaf matches input 'c'"));
  const auto more = name_call_spec({inputs_spec({leaf()}, dict("[]", {})), out},
                                   strings{"x", "y"}, 1);
  CHECK(torchloom_contains(more.inputs_unknown, "1 input leaves ('ARGS[0]') but the package "
                                                "takes 2 inputs ('x' and 'y')"));
  // Equal counts: every leaf is an input, whatever the names (torch < 2.5 made them up).
  const auto generated = name_call_spec(
      {inputs_spec({leaf()}, dict(R"(["m"])", {leaf()})), out}, strings{"arg0_1", "arg1_1"}, 1);
  CHECK(generated.inputs == strings{"ARGS[0]", "KWARGS[m]"});
  // Unreadable graph inputs: the leaves are the inputs.
  CHECK(name_call_spec({inputs_spec({leaf()}, dict("[]", {})), out}, std::nullopt, 1).inputs ==
        strings{"ARGS[0]"});
}

// torch 2.11 names a plain package's inputs arg<N>_<M>: with a value fixed at export among
// the leaves (BERT's return_dict=True), only the config can say which leaves are inputs.
TEST_CASE("call spec names: a config that names the inputs says which leaves they are",
          "[aoti]") {
  const std::string out = spec(leaf());
  const auto spec_of_bert = std::vector<std::string>{
      inputs_spec({}, dict(R"(["input_ids", "attention_mask", "return_dict"])",
                           {leaf(), leaf(), leaf()})),
      out};
  auto names = name_call_spec(spec_of_bert, strings{"arg41_1", "arg42_1"}, 1);
  REQUIRE(names.inputs.empty());
  CHECK(names.leaves == strings{"KWARGS[input_ids]", "KWARGS[attention_mask]",
                                "KWARGS[return_dict]"});
  names.resolve_inputs({"KWARGS[attention_mask]", "KWARGS[input_ids]"}, 2);
  CHECK(names.inputs == strings{"KWARGS[input_ids]", "KWARGS[attention_mask]"});
  CHECK(names.fixed_inputs == strings{"KWARGS[return_dict]"});
  CHECK(names.inputs_unknown.empty());
  CHECK(torchloom_contains(names.why_not("KWARGS[return_dict]"), "fixed when the model was"));
  // A config that names one leaf too few (or ordinal names only) leaves them unknown, and
  // says what would tell.
  auto too_few = name_call_spec(spec_of_bert, strings{"arg41_1", "arg42_1"}, 1);
  too_few.resolve_inputs({"KWARGS[input_ids]", "INPUT__1"}, 2);
  CHECK(too_few.inputs.empty());
  CHECK(torchloom_contains(too_few.inputs_unknown, "declares the package's 2 tensor inputs"));
}

TEST_CASE("call spec names: other node types are refused by name; counts must agree",
          "[aoti]") {
  const std::string in = inputs_spec({leaf()}, dict("[]", {}));
  const auto named_tuple = name_call_spec(
      {in, spec(node(R"("collections.namedtuple")", R"("{}")", {leaf(), leaf()}))},
      strings{"x"}, 2);
  CHECK(named_tuple.inputs == strings{"ARGS[0]"});
  CHECK(named_tuple.outputs.empty());
  CHECK(torchloom_contains(named_tuple.outputs_unknown,
                           "'collections.namedtuple' node, which forward-based names do not "
                           "cover (dict, tuple, list and Tensor only)"));
  CHECK(torchloom_contains(named_tuple.why_not("RESULT[0]"), "collections.namedtuple"));
  CHECK(named_tuple.output_index("OUTPUT__1") == 1u);  // ordinal names still work
  const auto fewer = name_call_spec({in, spec(tuple({leaf(), leaf()}))}, strings{"x"}, 3);
  CHECK(fewer.outputs.empty());
  CHECK(torchloom_contains(fewer.outputs_unknown,
                           "the call spec's output has 2 leaves but the package returns 3"));
  // None has no leaves: an argument passed as None is not an input.
  const auto with_none = name_call_spec(
      {inputs_spec({leaf(), node(R"("builtins.NoneType")", "null", {})},
                   dict(R"(["past"])", {node(R"("builtins.NoneType")", "null", {})})),
       spec(leaf())},
      strings{"x"}, 1);
  CHECK(with_none.inputs == strings{"ARGS[0]"});
  CHECK(with_none.inputs_unknown.empty());
  // Contexts as JSON arrays rather than text, numeric keys, OrderedDict.
  const auto ordered = name_call_spec(
      {in, spec(node(R"("collections.OrderedDict")", R"(["z", 7])", {leaf(), leaf()}))},
      strings{"x"}, 2);
  CHECK(ordered.outputs == strings{"RESULT[z]", "RESULT[7]"});
  // Not a treespec at all.
  for (const std::string& bad : {std::string("[1, {\"type\": "), std::string("{}"),
                                 spec(tuple({leaf()})), spec(leaf())}) {
    const auto n = name_call_spec({bad, spec(leaf())}, strings{"x"}, 1);
    INFO(bad);
    CHECK(n.inputs.empty());
    CHECK_FALSE(n.inputs_unknown.empty());
    CHECK(n.outputs == strings{"RESULT"});
  }
  CHECK(torchloom_contains(name_call_spec({"[1,", "[1,"}, strings{"x"}, 1).outputs_unknown,
                           "not JSON"));
  CHECK(torchloom_contains(name_call_spec({in}, strings{"x"}, 1).inputs_unknown, "1 parts"));
}

TEST_CASE("ordinal names: INPUT__<i> and OUTPUT__<i> only", "[aoti]") {
  using torchloom::io_names;
  CHECK(io_names::ordinal("INPUT__0", "INPUT") == 0u);
  CHECK(io_names::ordinal("INPUT__12", "INPUT") == 12u);
  CHECK_FALSE(io_names::ordinal("INPUT__01", "INPUT"));
  CHECK_FALSE(io_names::ordinal("INPUT__", "INPUT"));
  CHECK_FALSE(io_names::ordinal("INPUT_0", "INPUT"));
  CHECK_FALSE(io_names::ordinal("x__0", "INPUT"));
  CHECK_FALSE(io_names::ordinal("INPUT__-1", "INPUT"));
  CHECK(io_names::looks_forward_based("RESULT"));
  CHECK(io_names::looks_forward_based("KWARGS[a]"));
  CHECK_FALSE(io_names::looks_forward_based("RESULTS"));
  CHECK_FALSE(io_names::looks_forward_based("OUTPUT__0"));
}

TEST_CASE("JSON: what the call spec reader accepts and refuses", "[aoti]") {
  using torchloom::detail::parse_json;
  const auto v =
      parse_json(R"( {"a": [1, -2.5e3, true, false, null], "b": "x\u00e9\n\"", "a": {}} )");
  REQUIRE(v.is_object());
  REQUIRE(v.members.size() == 3);  // in order, duplicates kept; find() gives the first
  CHECK(v.find("a")->items.size() == 5);
  CHECK(v.find("a")->items[1].text == "-2.5e3");
  CHECK(v.find("b")->text == "x\xc3\xa9\n\"");
  CHECK(parse_json(R"("\ud83d\ude00")").text == "\xf0\x9f\x98\x80");
  for (const char* bad : {"", "[1,]", "{\"a\" 1}", "[1] x", "\"\\q\"", "01x", "\"a\nb\"",
                          "tru", "-", "1."}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_json(bad), torchloom::detail::json_error);
  }
  CHECK_THROWS_AS(parse_json(std::string(300, '[') + std::string(300, ']')),
                  torchloom::detail::json_error);
  CHECK(parse_json(std::string(200, '[') + std::string(200, ']')).is_array());
}
