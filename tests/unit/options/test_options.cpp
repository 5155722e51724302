// Options: the described aggregate, its generic parser and printer, and config.pbtxt.
#include "../../support/fixtures.hpp"

#include <torchloom/options.hpp>
#include <torchloom/torchloom.hpp>
#include <torchloom/triton/config.hpp>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using torchloom::errc;
using torchloom::runner_options;

TEST_CASE("option keys are the design's keys, derived from the description", "[options]") {
  const std::vector<std::string> expected = {
      "CUDA_GRAPH_MAX_SHAPES", "CUDA_GRAPH_BATCH_SIZES",  // graph_options, a described base
      "INFERENCE_MODE",        "DISABLE_OPTIMIZED_EXECUTION", "ENABLE_JIT_EXECUTOR",
      "ENABLE_JIT_PROFILING",  "INTRA_OP_THREAD_COUNT",       "INTER_OP_THREAD_COUNT",
      "DISABLE_CUDNN",         "ENABLE_TENSOR_FUSER",         "ENABLE_NVFUSER",
      "ENABLE_CACHE_CLEANING", "ENABLE_WEIGHT_SHARING",       "MODEL_INIT_LIBRARY",
      "OP_LIBRARIES",          "GREEN_CONTEXT_SM_COUNT",      "WEIGHT_OFFLOAD_BUDGET_MB",
      "WEIGHT_OFFLOAD_PREFETCH_DEPTH", "AOTI_NUM_RUNNERS",    "AOTI_MODEL_NAME",
      "WARMUP_ITERATIONS"};
  CHECK(torchloom::option_keys() == expected);
}

TEST_CASE("each policy owns a block of options; the one description still drives the keys",
          "[options]") {
  using torchloom::detail::reads_option;
  // Which policy reads which key comes from the blocks (their read_by), not from a table.
  const std::map<std::string, std::string, std::less<>> readers = {
      {"MODEL_INIT_LIBRARY", "the hook policy dlopen_hook"},
      {"GREEN_CONTEXT_SM_COUNT", "the stream policy green_context_stream"},
      {"WEIGHT_OFFLOAD_BUDGET_MB", "the residency policies streamed_weights and mapped_weights"},
      {"WEIGHT_OFFLOAD_PREFETCH_DEPTH", "the residency policy streamed_weights"},
      {"AOTI_NUM_RUNNERS", "the loader aoti_loader"},
      {"AOTI_MODEL_NAME", "the loader aoti_loader"},
      {"CUDA_GRAPH_MAX_SHAPES", "the stream adaptor graphed<Stream>"},
      {"CUDA_GRAPH_BATCH_SIZES", "the stream adaptor graphed<Stream>"}};
  CHECK(torchloom::policy_option_readers() == readers);
  const std::map<std::string, std::string, std::less<>> aliases = {
      {"CACHE_CLEANING_ENABLED", "ENABLE_CACHE_CLEANING"}};
  CHECK(torchloom::option_aliases() == aliases);

  // A policy reads the blocks it lists, and only those.
  CHECK(reads_option<torchloom::dlopen_hook>("MODEL_INIT_LIBRARY"));
  CHECK_FALSE(reads_option<torchloom::no_hook>("MODEL_INIT_LIBRARY"));
  CHECK(reads_option<torchloom::green_context_stream>("GREEN_CONTEXT_SM_COUNT"));
  CHECK(reads_option<torchloom::graphed<torchloom::green_context_stream>>("GREEN_CONTEXT_SM_COUNT"));
  CHECK(reads_option<torchloom::graphed<torchloom::pool_stream>>("CUDA_GRAPH_BATCH_SIZES"));
  CHECK_FALSE(reads_option<torchloom::pool_stream>("CUDA_GRAPH_BATCH_SIZES"));
  CHECK(reads_option<torchloom::streamed_weights>("WEIGHT_OFFLOAD_BUDGET_MB"));
  CHECK(reads_option<torchloom::streamed_weights>("WEIGHT_OFFLOAD_PREFETCH_DEPTH"));
  CHECK(reads_option<torchloom::mapped_weights>("WEIGHT_OFFLOAD_BUDGET_MB"));
  CHECK_FALSE(reads_option<torchloom::mapped_weights>("WEIGHT_OFFLOAD_PREFETCH_DEPTH"));
  CHECK(reads_option<torchloom::shared_weights>("ENABLE_WEIGHT_SHARING"));
  CHECK_FALSE(reads_option<torchloom::resident_weights>("WEIGHT_OFFLOAD_BUDGET_MB"));
  CHECK_FALSE(reads_option<torchloom::torchscript_loader>("AOTI_NUM_RUNNERS"));

  // runner_options is the blocks composed: a policy takes its block by reference, and what
  // it sets there is the runner's option.
  runner_options o;
  torchloom::aoti_options& aoti = o;
  aoti.aoti_num_runners = 4;
  CHECK(torchloom::get_option(o, "AOTI_NUM_RUNNERS") == "4");
  torchloom::set_option(o, "WEIGHT_OFFLOAD_PREFETCH_DEPTH", "5");
  const torchloom::streamed_weights_options& streamed = o;
  CHECK(streamed.weight_offload_prefetch_depth == 5);
  CHECK(o.weight_offload_prefetch_depth == 5);
}

TEST_CASE("booleans accept every documented spelling in any case", "[options]") {
  for (const char* t : {"true", "TRUE", "1", "yes", "Yes", "on", "ON"}) {
    runner_options o;
    o.inference_mode = false;
    torchloom::set_option(o, "INFERENCE_MODE", t);
    CHECK(o.inference_mode);
  }
  for (const char* f : {"false", "False", "0", "no", "NO", "off", " off "}) {
    runner_options o;
    torchloom::set_option(o, "INFERENCE_MODE", f);
    CHECK_FALSE(o.inference_mode);
  }
}

TEST_CASE("a bad boolean names the model, key, value and what is accepted", "[options]") {
  runner_options o;
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "ENABLE_CACHE_CLEANING", "maybe", "ranker"),
                        errc::invalid_option, "model 'ranker'", "ENABLE_CACHE_CLEANING",
                        "'maybe'", "true/false", "yes/no", "on/off");
  CHECK_FALSE(o.enable_cache_cleaning);
}

TEST_CASE("numbers are range-checked and must be whole", "[options]") {
  runner_options o;
  torchloom::set_option(o, "INTRA_OP_THREAD_COUNT", "8");
  REQUIRE(o.intra_op_thread_count.has_value());
  CHECK(*o.intra_op_thread_count == 8);
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "INTRA_OP_THREAD_COUNT", "4097"),
                        errc::invalid_option, "INTRA_OP_THREAD_COUNT", "'4097'", "up to 4096");
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "AOTI_NUM_RUNNERS", "0"), errc::invalid_option,
                        "AOTI_NUM_RUNNERS", "'0'", "from 1 to 256");
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "AOTI_NUM_RUNNERS", "4x"), errc::invalid_option,
                        "AOTI_NUM_RUNNERS", "'4x'", "an integer");
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "WARMUP_ITERATIONS", "-1"),
                        errc::invalid_option, "WARMUP_ITERATIONS");
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "WEIGHT_OFFLOAD_BUDGET_MB", ""),
                        errc::invalid_option, "WEIGHT_OFFLOAD_BUDGET_MB");
  CHECK(*o.intra_op_thread_count == 8);  // a failed set leaves the old value
}

TEST_CASE("an unknown key suggests the closest valid keys", "[options]") {
  runner_options o;
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "INTRA_OP_THREADS", "4", "m"),
                        errc::invalid_option, "unknown option 'INTRA_OP_THREADS'",
                        "did you mean 'INTRA_OP_THREAD_COUNT'");
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "inference-mode", "1"), errc::invalid_option,
                        "'INFERENCE_MODE'");
}

TEST_CASE("suggestions come from the bounded search as from the full edit distance",
          "[options]") {
  // What closest() ranked before it bounded the search: every candidate's full distance.
  const auto reference = [](std::string_view word, const std::vector<std::string>& candidates) {
    std::vector<std::pair<std::size_t, std::string>> ranked;
    for (const auto& c : candidates) {
      ranked.emplace_back(torchloom::detail::edit_distance(word, c), c);
    }
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<std::string> out;
    for (const auto& [d, c] : ranked) {
      const std::size_t limit = std::max<std::size_t>(2, std::max(word.size(), c.size()) / 3);
      if (d <= limit && out.size() < 3) out.push_back(c);
    }
    return out;
  };
  const auto& keys = torchloom::option_keys();
  std::vector<std::string> words = {"", "X", "INTRA_OP_THREADS", "inference-mode", "OP_LIBRARY",
                                    "WEIGHT_BUDGET", "AOTI_RUNNERS", std::string(40, 'A')};
  for (const auto& k : keys) {
    words.push_back(k.substr(1));
    words.push_back(k + "_X");
    words.push_back(k.substr(0, k.size() / 2));
    words.push_back(torchloom::detail::to_lower(k));
    std::string swapped = k;
    std::swap(swapped[0], swapped[swapped.size() - 1]);
    words.push_back(swapped);
  }
  for (const auto& w : words) {
    INFO(w);
    CHECK(torchloom::detail::closest(w, keys) == reference(w, keys));
  }
  for (std::size_t limit = 0; limit < 12; ++limit) {
    for (const auto& a : words) {
      for (const auto& b : {keys[3], keys[12], std::string("AOTI")}) {
        const std::size_t d = torchloom::detail::edit_distance(a, b);
        CHECK(torchloom::detail::edit_distance_within(a, b, limit) == std::min(d, limit + 1));
      }
    }
  }
  // A key of a few hundred characters is refused without a suggestion, and quickly.
  runner_options o;
  CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, std::string(250, 'W') + "EIGHT", "1"),
                        errc::invalid_option, "unknown option");
}

TEST_CASE("lists and strings", "[options]") {
  runner_options o;
  torchloom::set_option(o, "OP_LIBRARIES", " libs/a.so ; libs/b.so;;");
  CHECK(o.op_libraries == std::vector<std::string>{"libs/a.so", "libs/b.so"});
  torchloom::set_option(o, "AOTI_MODEL_NAME", "ranker");
  CHECK(o.aoti_model_name == "ranker");
}

TEST_CASE("printing and parsing round-trip and equality is member-wise", "[options]") {
  runner_options a;
  a.inference_mode = false;
  a.intra_op_thread_count = 3;
  a.op_libraries = {"x.so", "y.so"};
  a.enable_jit_profiling = false;
  const std::string text = torchloom::to_string(a, /*only_changed=*/true);
  CHECK(torchloom_test::contains(text, "INFERENCE_MODE=false\n"));
  CHECK(torchloom_test::contains(text, "OP_LIBRARIES=x.so;y.so\n"));
  CHECK_FALSE(torchloom_test::contains(text, "AOTI_MODEL_NAME"));  // unchanged: left out

  std::map<std::string, std::string> values;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    auto eq = line.find('=');
    values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  const runner_options b = torchloom::parse_options(values);
  CHECK(a == b);
  CHECK_FALSE(b == runner_options{});
  CHECK(torchloom::get_option(b, "INTRA_OP_THREAD_COUNT") == "3");

  std::ostringstream all;
  all << runner_options{};
  CHECK(torchloom_test::contains(all.str(), "WARMUP_ITERATIONS=0\n"));
  CHECK(torchloom_test::contains(all.str(), "INTRA_OP_THREAD_COUNT=(unset)\n"));
}

TEST_CASE("parse_options applies a map on top of a base", "[options]") {
  runner_options base;
  base.warmup_iterations = 5;
  auto o = torchloom::parse_options({{"ENABLE_JIT_EXECUTOR", "off"}}, base);
  CHECK(o.warmup_iterations == 5);
  REQUIRE(o.enable_jit_executor.has_value());
  CHECK_FALSE(*o.enable_jit_executor);
  CHECK_TORCHLOOM_ERROR(torchloom::parse_options({{"NOPE", "1"}}, base, "m2"),
                        errc::invalid_option, "model 'm2'", "NOPE");
}

TEST_CASE("config.pbtxt: the fields torchloom reads, in both list styles", "[options]") {
  const auto c = torchloom::parse_triton_config(R"(
# a Triton config
name: "ranker"
platform: "pytorch_libtorch"
max_batch_size: 16
input [
  { name: "keys" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "dense", data_type: TYPE_FP32, dims: [ 4, 8 ] }
]
output { name: "score" data_type: TYPE_FP32 dims: 1 }
instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0, 1 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
parameters: { key: "INFERENCE_MODE" value: { string_value: "false" } }
parameters [
  { key: "INTRA_OP_THREAD_COUNT", value: { string_value: '2' } },
  { key: "MODEL_INIT_LIBRARY" value < string_value: "lib\"x\".so" > }
]
)");
  CHECK(c.name == "ranker");
  CHECK(c.platform == "pytorch_libtorch");
  CHECK(c.max_batch_size == 16);
  REQUIRE(c.inputs.size() == 2);
  CHECK(c.inputs[0].name == "keys");
  CHECK(c.inputs[0].dtype == c10::ScalarType::Long);
  CHECK(c.inputs[0].dims == std::vector<std::int64_t>{-1});
  CHECK(c.inputs[1].dims == std::vector<std::int64_t>{4, 8});
  REQUIRE(c.outputs.size() == 1);
  CHECK(c.outputs[0].dims == std::vector<std::int64_t>{1});
  REQUIRE(c.instance_groups.size() == 1);
  CHECK(c.instance_groups[0].kind == "KIND_GPU");
  CHECK(c.instance_groups[0].count == 2);
  CHECK(c.instance_groups[0].gpus == std::vector<std::int64_t>{0, 1});
  CHECK(c.parameters.size() == 3);
  CHECK(c.parameters.at("INFERENCE_MODE") == "false");
  CHECK(c.parameters.at("INTRA_OP_THREAD_COUNT") == "2");
  CHECK(c.parameters.at("MODEL_INIT_LIBRARY") == "lib\"x\".so");
}

TEST_CASE("the text-format parser's error is a torchloom::error", "[options]") {
  // Whoever calls the parser directly gets torchloom's one exception type, with the line.
  try {
    (void)torchloom::detail::pb_parser("a {\n b: 1\n").parse();
    FAIL("nothing thrown");
  } catch (const torchloom::error& e) {
    CHECK(e.code() == errc::invalid_option);
    CHECK(torchloom_test::contains(e.what(), "line 3: "));
  }
}

TEST_CASE("config.pbtxt errors name the file, the line and the problem", "[options]") {
  CHECK_TORCHLOOM_ERROR(torchloom::parse_triton_config("name: \"x\"\ninput [ { name: \"a\" ",
                                                       "models/m/config.pbtxt"),
                        errc::invalid_option, "models/m/config.pbtxt:2", "'}'");
  CHECK_TORCHLOOM_ERROR(torchloom::parse_triton_config("name: \"unterminated\n", "c.pbtxt"),
                        errc::invalid_option, "c.pbtxt:1", "unterminated string");
  CHECK_TORCHLOOM_ERROR(torchloom::parse_triton_config("\n\nmax_batch_size: eight", "c.pbtxt"),
                        errc::invalid_option, "c.pbtxt:3", "max_batch_size", "'eight'");
  CHECK_TORCHLOOM_ERROR(
      torchloom::parse_triton_config("input { name: \"a\" data_type: TYPE_FP128 }", "c.pbtxt"),
      errc::invalid_option, "c.pbtxt:1", "'input.data_type' has no value 'TYPE_FP128'");
  CHECK_TORCHLOOM_ERROR(
      torchloom::parse_triton_config("parameters { key: \"A\" value { int_value: 1 } }",
                                     "c.pbtxt"),
      errc::invalid_option, "c.pbtxt:1", "string_value");
  CHECK_TORCHLOOM_ERROR(torchloom::parse_triton_config("name \"x\"", "c.pbtxt"),
                        errc::invalid_option, "expected ':' or '{' after 'name'");
}

TEST_CASE("graphed's options are keys like any other, range-checked", "[options][graphs]") {
  runner_options o;
  CHECK(o.cuda_graph_max_shapes == 8);
  CHECK(o.cuda_graph_batch_sizes.sizes.empty());
  torchloom::set_option(o, "CUDA_GRAPH_MAX_SHAPES", "3");
  CHECK(o.cuda_graph_max_shapes == 3);
  torchloom::set_option(o, "CUDA_GRAPH_BATCH_SIZES", " 1, 2,4 ;8 ");
  CHECK(o.cuda_graph_batch_sizes.sizes == std::vector<std::int64_t>{1, 2, 4, 8});
  CHECK(o.cuda_graph_batch_sizes.bucket_for(3) == 4);
  CHECK(o.cuda_graph_batch_sizes.bucket_for(8) == 8);
  CHECK_FALSE(o.cuda_graph_batch_sizes.bucket_for(9).has_value());
  CHECK(torchloom::get_option(o, "CUDA_GRAPH_BATCH_SIZES") == "1,2,4,8");
  CHECK(torchloom_test::contains(torchloom::to_string(o, true),
                                 "CUDA_GRAPH_BATCH_SIZES=1,2,4,8\n"));
  CHECK_FALSE(o == runner_options{});
  // What to_string prints parses back to the same options.
  runner_options back;
  torchloom::set_option(back, "CUDA_GRAPH_MAX_SHAPES",
                        torchloom::get_option(o, "CUDA_GRAPH_MAX_SHAPES"));
  torchloom::set_option(back, "CUDA_GRAPH_BATCH_SIZES",
                        torchloom::get_option(o, "CUDA_GRAPH_BATCH_SIZES"));
  CHECK(back == o);
  torchloom::set_option(back, "CUDA_GRAPH_BATCH_SIZES", "");
  CHECK(back.cuda_graph_batch_sizes.sizes.empty());

  for (const char* bad : {"0", "1025", "x"}) {
    CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "CUDA_GRAPH_MAX_SHAPES", bad, "ranker"),
                          errc::invalid_option, "model 'ranker'", "CUDA_GRAPH_MAX_SHAPES",
                          "from 1 to 1024");
  }
  for (const char* bad : {"4,2", "1,1", "0,4", "1,x", "70000", "-1"}) {
    CHECK_TORCHLOOM_ERROR(torchloom::set_option(o, "CUDA_GRAPH_BATCH_SIZES", bad, "ranker"),
                          errc::invalid_option, "model 'ranker'", "CUDA_GRAPH_BATCH_SIZES",
                          "strictly increasing");
  }
}
