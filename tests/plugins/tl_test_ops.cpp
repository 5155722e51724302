// The test op library: tl_test::lookup(Tensor keys, int layer) -> Tensor reads an embedding
// table from a process-global registry that a model-init hook fills (tl_test_tables.c).
//
// TL_TEST_OPS_VARIANT builds the libraries that must be refused as conflicts:
//   0  the library
//   1  another TORCH_LIBRARY(tl_test): the namespace is taken
//   2  a TORCH_LIBRARY_FRAGMENT(tl_test) defining lookup again: the operator is taken
//   3  a TORCH_LIBRARY_FRAGMENT(tl_test) adding a new operator to a namespace that is taken
//   4  only a kernel (Meta) for tl_test::lookup, an operator another library defines
//   5  a CPU kernel for aten::relu that replaces torch's (torch itself only warns)
#include "tl_test_tables.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#ifndef TL_TEST_OPS_VARIANT
#define TL_TEST_OPS_VARIANT 0
#endif

namespace {

// A table per layer and device (-1: the CPU): a model with instances on several GPUs gets one
// on each, and each instance's lookups read the one on its keys' device.
struct registry {
  std::mutex mutex;
  std::map<std::pair<std::int32_t, int>, at::Tensor> tables;
  std::int64_t unregister_calls = 0;
};

registry& tables() {
  static registry r;
  return r;
}

[[maybe_unused]] at::Tensor lookup(const at::Tensor& keys, std::int64_t layer) {
  at::Tensor table;
  {
    auto& r = tables();
    std::lock_guard lock(r.mutex);
    const auto l = static_cast<std::int32_t>(layer);
    const int device = keys.is_cuda() ? keys.device().index() : -1;
    const auto it = r.tables.find({l, device});
    if (it == r.tables.end()) {
      // The layer's table on another device, if any: the first entry at or after (layer, CPU).
      const auto other = r.tables.lower_bound({l, -1});
      const bool elsewhere = other != r.tables.end() && other->first.first == l;
      TORCH_CHECK(!elsewhere, "tl_test::lookup: keys are on ", keys.device(),
                  ", the table for layer ", layer, " on ", other->second.device());
      TORCH_CHECK(false, "tl_test::lookup: no embedding table is registered for layer ", layer,
                  " (variant ", TL_TEST_OPS_VARIANT, "; the model-init hook registers them "
                  "from weights/*.bin)");
    }
    table = it->second;
  }
  // Keys are checked on the host before the lookup launches: on a GPU, an out-of-range key
  // would be a device-side assert, which leaves the process's CUDA context unusable; raised
  // here, it is an exception that fails the run and nothing else.
  if (keys.numel() > 0) {
    const std::int64_t low = keys.min().item<std::int64_t>();
    const std::int64_t high = keys.max().item<std::int64_t>();
    TORCH_CHECK(low >= 0 && high < table.size(0), "tl_test::lookup: key ",
                low < 0 ? low : high, " is outside the table for layer ", layer, " (",
                table.size(0), " rows)");
  }
  return at::embedding(table, keys);
}

[[maybe_unused]] at::Tensor other(const at::Tensor& x) { return x; }

// Returns its input unchanged: a model whose relu ran it would compute something else.
[[maybe_unused]] at::Tensor not_relu(const at::Tensor& x) { return x.clone(); }

}  // namespace

extern "C" __attribute__((visibility("default"))) int tl_test_register_table(
    std::int32_t layer, const float* data, std::int64_t rows, std::int64_t cols,
    int device_index, char* error, std::size_t error_size) {
  try {
    auto t = at::from_blob(const_cast<float*>(data), {rows, cols}, at::kFloat).clone();
    if (device_index >= 0) t = t.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)));
    auto& r = tables();
    std::lock_guard lock(r.mutex);
    r.tables[{layer, device_index >= 0 ? device_index : -1}] = t;
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "registering table %d failed: %s", layer, e.what());
    return 1;
  }
}

extern "C" __attribute__((visibility("default"))) void tl_test_unregister_tables() {
  auto& r = tables();
  std::lock_guard lock(r.mutex);
  r.tables.clear();
  ++r.unregister_calls;
}

extern "C" __attribute__((visibility("default"))) std::int64_t tl_test_table_count() {
  auto& r = tables();
  std::lock_guard lock(r.mutex);
  return static_cast<std::int64_t>(r.tables.size());
}

extern "C" __attribute__((visibility("default"))) std::int64_t tl_test_unregister_calls() {
  auto& r = tables();
  std::lock_guard lock(r.mutex);
  return r.unregister_calls;
}

// The kernel is registered for CPU and CUDA, not as a composite: torch.export keeps such an
// operator as one opaque call (a composite kernel would be traced through), so an
// AOTInductor package calls it through the dispatcher at run time, as TorchScript does.
#if TL_TEST_OPS_VARIANT == 0
TORCH_LIBRARY(tl_test, m) { m.def("lookup(Tensor keys, int layer) -> Tensor"); }
TORCH_LIBRARY_IMPL(tl_test, CPU, m) { m.impl("lookup", &lookup); }
TORCH_LIBRARY_IMPL(tl_test, CUDA, m) { m.impl("lookup", &lookup); }
#elif TL_TEST_OPS_VARIANT == 1
TORCH_LIBRARY(tl_test, m) { m.def("lookup(Tensor keys, int layer) -> Tensor", &lookup); }
#elif TL_TEST_OPS_VARIANT == 2
TORCH_LIBRARY_FRAGMENT(tl_test, m) { m.def("lookup(Tensor keys, int layer) -> Tensor", &lookup); }
#elif TL_TEST_OPS_VARIANT == 3
TORCH_LIBRARY_FRAGMENT(tl_test, m) { m.def("other(Tensor x) -> Tensor", &other); }
#elif TL_TEST_OPS_VARIANT == 4
TORCH_LIBRARY_IMPL(tl_test, Meta, m) { m.impl("lookup", &lookup); }
#else
TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("relu", &not_relu); }
#endif
