#pragma once
// Test fixtures: TorchScript models built in C++ (no Python), Triton-layout directories (in
// temp_dir.hpp's directories), and a helper that captures a torchloom::error for assertions
// on its code and text.
#include "catch.hpp"
#include "temp_dir.hpp"

#include <torchloom/error.hpp>

#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/script.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace torchloom_test {

namespace fs = std::filesystem;

//! y = x @ w.T + b with w: [out, in], b: [out]; random weights.
inline torch::jit::Module make_linear(std::int64_t in = 8, std::int64_t out = 4) {
  torch::jit::Module m("linear");
  m.register_parameter("w", torch::randn({out, in}), false);
  m.register_parameter("b", torch::randn({out}), false);
  m.define(R"(
def forward(self, x):
    return torch.linear(x, self.w, self.b)
)");
  return m;
}

//! A chain of `steps` products of an [n, n] input with one [n, n] weight (each followed by
//! tanh): on a GPU it runs for milliseconds, long enough for the host to act while it runs.
//! Two chains made with different seeds have the same shapes and different weights.
inline torch::jit::Module make_slow_chain(std::int64_t n = 2048, int steps = 30, int seed = 0) {
  torch::manual_seed(seed);
  torch::jit::Module m("chain");
  m.register_parameter("w", torch::randn({n, n}) / std::sqrt(static_cast<double>(n)), false);
  m.define("def forward(self, x):\n    y = x\n    for _ in range(" + std::to_string(steps) +
           "):\n        y = torch.tanh(torch.matmul(y, self.w))\n    return y\n");
  return m;
}

//! Saves `m` as `<dir>/<version>/model.pt` with `config` as `<dir>/config.pbtxt` (if not
//! empty); returns the model directory.
inline fs::path write_triton_model(const fs::path& dir, torch::jit::Module& m,
                                   std::string_view config = {}, int version = 1) {
  fs::create_directories(dir / std::to_string(version));
  m.save((dir / std::to_string(version) / "model.pt").string());
  if (!config.empty()) write_file(dir / "config.pbtxt", config);
  return dir;
}

//! Resolves `torch` as TorchScript's C++ frontend does, and each custom-op namespace in
//! `namespaces` as a module of operators, so a model defined in C++ can call
//! `tl_test.lookup(...)`: without a resolver, `torch.ops.<ns>` cannot be resolved there.
struct op_namespace_resolver : torch::jit::Resolver {
  std::vector<std::string> namespaces;
  explicit op_namespace_resolver(std::vector<std::string> ns) : namespaces(std::move(ns)) {}
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(const std::string& name,
                                                         torch::jit::GraphFunction&,
                                                         const torch::jit::SourceRange&) override {
    if (name == "torch") return std::make_shared<torch::jit::BuiltinModule>("aten");
    for (const auto& ns : namespaces) {
      if (name == ns) return std::make_shared<torch::jit::BuiltinModule>(ns);
    }
    return nullptr;
  }
  c10::TypePtr resolveType(const std::string&, const torch::jit::SourceRange&) override {
    return nullptr;
  }
};

//! Module::define with custom-op namespaces callable as `<ns>.<op>(...)`.
inline void define_with_ops(torch::jit::Module& m, const std::string& source,
                            std::vector<std::string> namespaces) {
  m.define(source, std::make_shared<op_namespace_resolver>(std::move(namespaces)));
}

inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

//! Runs `f`, which must throw torchloom::error, and returns that error.
template <class F>
torchloom::error capture_error(F&& f) {
  try {
    f();
  } catch (const torchloom::error& e) {
    return e;
  }
  FAIL("expected a torchloom::error, but nothing was thrown");
  throw std::logic_error("unreachable");
}

}  // namespace torchloom_test

//! Checks that `expr` throws torchloom::error with code `code` and a message holding every
//! one of the strings that follow.
#define CHECK_TORCHLOOM_ERROR(expr, errc_code, ...)                             \
  do {                                                                          \
    const auto tl_err_ = ::torchloom_test::capture_error([&] { (void)(expr); }); \
    INFO(tl_err_.what());                                                       \
    CHECK(tl_err_.code() == (errc_code));                                       \
    for (const std::string& tl_part_ : std::initializer_list<std::string>{__VA_ARGS__}) {                           \
      INFO("expected in the message: " << tl_part_);                            \
      CHECK(::torchloom_test::contains(tl_err_.what(), tl_part_));              \
    }                                                                           \
  } while (false)
