// T4-T9, T11, T14 (PERF.md): weights that do not fit the device budget, streamed from pinned
// host memory, against the ceiling and the alternatives, all in one process on cuda:0:
//  - BM_offload_limit: pinned host-to-device bandwidth, one 1 GiB copy (the ceiling);
//  - BM_offload/model:large: 16 bias-free linear layers of 8192 x 8192 bf16 (128 MiB each,
//    2 GiB), y = x W_i^T in sequence, at batch 16 (transfer-bound) and 16384 (compute-bound):
//    resident_weights, streamed_weights (budget 512 MiB, prefetch depth 2: one layer stays
//    resident beside a ring of three), mapped_weights (zero-copy; batch 16 only: a large
//    product re-reads every weight over the bus), and a naive loop that copies each layer's
//    weight from pageable memory with a synchronous .to() before its product (batch 16 only);
//  - BM_offload/model:small_tensors: 16 layers that each concatenate 64 tensors of 64 x 4096
//    bf16 (32 MiB a layer), budget 128 MiB (T8: small weights must still move near the ceiling);
//  - BM_offload_shared/runners:8: eight shared_weights runners of the large model (T9);
//  - .../share:{all,half} (T11): streamed_weights with a resident share, a runner of its own: a
//    budget of all the weights (nothing copied per run; timed alternately with resident), and of
//    half of them (held to transfer_ms, its streamed bytes at the pinned limit);
//  - BM_offload/model:large_aoti: the large model as an AOTInductor package exported for
//    streaming (scripts/make_offload_fixture.py): resident and streamed, and the two shares;
//  - BM_offload/model:llama_aoti (T14): a Llama-architecture decoder (Llama-2-7B's layer shapes,
//    6 layers, bf16, 2.75 GiB; scripts/make_transformer_fixtures.py, set llm), prefill of 128
//    tokens at batch 1, streamed (budget 512 MiB) with all but 1.25 GiB of the device taken
//    first, so that its weights exceed the free memory; small_bitwise_equal: its 1-layer twin,
//    streamed against resident. accelerate's row comes from scripts/offload_peer.py.
// Each forward is timed with CUDA events on the caller's stream (30 after 3 warm-up ones;
// streamed at the large batch in blocks alternating with resident). Every variant's output is
// compared bitwise with resident's first.
#include "bench/support/models.hpp"
#include "tests/support/temp_dir.hpp"

#if TORCHLOOM_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>

#include <span>

#include "bench/support/cuda.hpp"
#endif

namespace torchloom_bench {
namespace {

#if TORCHLOOM_HAS_CUDA

constexpr int warmup = 3;
constexpr int reps = 30;
constexpr std::int64_t mib = std::int64_t{1} << 20;

template <class Residency>
using runner_type = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook,
                                            torchloom::caller_stream, Residency>;

// One runner of either loader, seen through what the benchmarks call: its first output on one
// input, and its memory (an indirect call: nothing beside a forward of milliseconds).
struct any_runner {
  std::function<at::Tensor(const at::Tensor&)> run;
  std::function<torchloom::weight_memory()> memory;
};

template <class Runner>
std::unique_ptr<any_runner> make_runner(const torchloom::model_spec& spec) {
  auto r = std::make_shared<Runner>(spec, gpu);
  return std::make_unique<any_runner>(
      any_runner{[r](const at::Tensor& x) { return r->run({x})[0]; }, [r] { return r->memory(); }});
}

// Median (nearest rank: the lower middle of an even count) and p99 of samples in ms.
struct timing {
  double median_ms = 0;
  double p99_ms = 0;
  explicit timing(const std::vector<double>& ms)
      : median_ms(percentile(ms, 0.5)), p99_ms(percentile(ms, 0.99)) {}
};

// Times `forward` with CUDA events on the current stream: `warmup` untimed calls, then `reps`.
timing time_forward(const std::function<void()>& forward) {
  event_timer events;
  const cudaStream_t s = current_stream();
  std::vector<double> ms;
  for (int i = 0; i < warmup + reps; ++i) {
    const double t = events.time_ms(s, forward);
    if (i >= warmup) ms.push_back(t);
  }
  return timing(ms);
}

// T6's pair: blocks of `block` forwards of `a`, then of `b`, until each has `reps` timed ones;
// the first forward of each block is not timed, so each side is measured back to back (its
// steady state) while both share the device's drift (clocks, temperature).
std::pair<timing, timing> time_in_blocks(const std::function<void()>& a,
                                         const std::function<void()>& b) {
  constexpr int block = 6;
  event_timer events;
  const cudaStream_t s = current_stream();
  std::vector<double> ta;
  std::vector<double> tb;
  for (int i = 0; i < warmup; ++i) {
    events.time_ms(s, a);
    events.time_ms(s, b);
  }
  while (static_cast<int>(ta.size()) < reps) {
    for (int i = 0; i < block; ++i) {
      const double t = events.time_ms(s, a);
      if (i > 0) ta.push_back(t);
    }
    for (int i = 0; i < block; ++i) {
      const double t = events.time_ms(s, b);
      if (i > 0) tb.push_back(t);
    }
  }
  return {timing(ta), timing(tb)};
}

// A spec of `dir`, with streamed_weights' budget and prefetch depth when `budget_mb` > 0.
torchloom::model_spec spec_of(const fs::path& dir, std::int64_t budget_mb = 0) {
  auto s = torchloom::model_spec::from_directory(dir);
  if (budget_mb > 0) {
    s.set("WEIGHT_OFFLOAD_BUDGET_MB", std::to_string(budget_mb));
    s.set("WEIGHT_OFFLOAD_PREFETCH_DEPTH", "2");
  }
  return s;
}

// One model on disk, its host weights for the naive loop, and its runners.
struct offload_model {
  fs::path dir;
  std::int64_t width = 0;
  std::int64_t weight_bytes = 0;
  std::vector<std::vector<at::Tensor>> layers;  // host (pageable) weights per layer
  std::unique_ptr<any_runner> resident;
  std::unique_ptr<any_runner> streamed;
  std::unique_ptr<any_runner> mapped;
  // A streamed_weights runner of this model under another spec (T11's budgets).
  std::unique_ptr<any_runner> (*make_streamed)(const torchloom::model_spec&) = nullptr;
};

// layers x (pieces tensors of rows x width), a layer applying their concatenation (pieces x
// rows must equal width): y = x cat(W)^T. Random bf16 weights made on the GPU (fast) and kept
// on the host, scaled so activations stay in range through the stack.
std::unique_ptr<offload_model> make_model(const fs::path& root, const std::string& name,
                                          int layer_count, int pieces, std::int64_t width,
                                          std::int64_t budget_mb) {
  auto m = std::make_unique<offload_model>();
  m->dir = root / name;
  m->width = width;
  const auto on_gpu = torch::TensorOptions().device(gpu).dtype(torch::kBFloat16);
  torch::jit::Module top("offload_" + name);
  std::string code = "def forward(self, x):\n";
  for (int l = 0; l < layer_count; ++l) {
    torch::jit::Module layer("layer");
    std::vector<at::Tensor> weights;
    std::string list;
    for (int p = 0; p < pieces; ++p) {
      weights.push_back(
          (torch::randn({width / pieces, width}, on_gpu) / std::sqrt(static_cast<double>(width)))
              .cpu());
      const std::string attr = pieces == 1 ? "weight" : "w" + std::to_string(p);
      layer.register_parameter(attr, weights.back(), false);
      list += (p == 0 ? "self." : ", self.") + attr;
      m->weight_bytes += static_cast<std::int64_t>(weights.back().nbytes());
    }
    layer.define(pieces == 1 ? "def forward(self, x):\n    return torch.linear(x, self.weight)\n"
                             : "def forward(self, x):\n    return torch.linear(x, torch.cat([" +
                                   list + "], 0))\n");
    top.register_module("l" + std::to_string(l), layer);
    code += "    x = self.l" + std::to_string(l) + ".forward(x)\n";
    m->layers.push_back(std::move(weights));
  }
  top.define(code + "    return x\n");
  fs::create_directories(m->dir / "1");
  top.save((m->dir / "1" / "model.pt").string());
  m->make_streamed = make_runner<runner_type<torchloom::streamed_weights>>;
  m->resident = make_runner<runner_type<torchloom::resident_weights>>(spec_of(m->dir));
  m->streamed = m->make_streamed(spec_of(m->dir, budget_mb));
  m->mapped = make_runner<runner_type<torchloom::mapped_weights>>(spec_of(m->dir));
  return m;
}

#if TORCHLOOM_TORCH_VERSION >= 20600
template <class Residency>
using package_runner = torchloom::model_runner<torchloom::aoti_loader, torchloom::no_hook,
                                               torchloom::caller_stream, Residency>;

// A package of scripts/make_offload_fixture.py or make_transformer_fixtures.py (`script`);
// throws without it.
fs::path package_dir(const std::string& name, const std::string& script) {
  constexpr fixtures offload{"TORCHLOOM_OFFLOAD_FIXTURES", TORCHLOOM_OFFLOAD_FIXTURE_DIR};
  if (auto why = offload.missing(name, "model.pt2", script); !why.empty()) {
    throw std::runtime_error(why);
  }
  return offload.dir(name);
}
#endif

// The package twin of the large model (exported by torchloom_export with offload on): its
// resident and streamed runners, same budget and depth.
std::unique_ptr<offload_model> load_large_package() {
#if TORCHLOOM_TORCH_VERSION >= 20600
  auto m = std::make_unique<offload_model>();
  m->dir = package_dir("large_aoti", "scripts/make_offload_fixture.py");
  m->width = 8192;
  m->make_streamed = make_runner<package_runner<torchloom::streamed_weights>>;
  m->resident = make_runner<package_runner<torchloom::resident_weights>>(spec_of(m->dir));
  m->weight_bytes = m->resident->memory().device_bytes;
  m->streamed = m->make_streamed(spec_of(m->dir, 512));
  return m;
#else
  throw std::runtime_error("the package rows need LibTorch >= 2.6 (aoti_loader)");
#endif
}

// Everything the benchmarks share, built on first use and kept for the whole run.
struct fixture {
  torchloom_test::temp_dir dir{"bm_offload"};
  double limit_gbps = 0;  // the pinned host-to-device bandwidth of a 1 GiB copy
  std::unique_ptr<offload_model> large;
  std::unique_ptr<offload_model> small;
  std::unique_ptr<offload_model> package;  // large_aoti, on first use

  static fixture& get() {
    return kept<fixture>([] {
      auto f = std::make_unique<fixture>();
      f->limit_gbps = [] {
        const auto bytes = torch::TensorOptions().dtype(torch::kUInt8);
        auto host = torch::empty({1024 * mib}, bytes.pinned_memory(true));
        host.fill_(1);
        auto device = torch::empty({1024 * mib}, bytes.device(gpu));
        const timing t = time_forward([&] { device.copy_(host, /*non_blocking=*/true); });
        return static_cast<double>(1024 * mib) / (t.median_ms * 1e-3) / 1e9;
      }();
      f->large = make_model(f->dir.path(), "large", 16, 1, 8192, 512);
      f->small = make_model(f->dir.path(), "small_tensors", 16, 64, 4096, 128);
      return f;
    });
  }
};

at::Tensor input(const offload_model& m, std::int64_t batch) {
  torch::manual_seed(batch);
  return torch::randn({batch, m.width}, torch::TensorOptions().device(gpu).dtype(torch::kBFloat16));
}

// The counters of a timed row: the median (also the manual time), p99, GB/s (`moved`, the
// bytes a forward moves to the device: its weights, or what streamed_weights copies of them,
// over the median), % of the ceiling, and whether the output was bitwise resident's.
void report(benchmark::State& state, const timing& t, std::int64_t weight_bytes, double limit,
            bool equal, std::int64_t moved) {
  state.SetIterationTime(t.median_ms * 1e-3);
  const double gbps = static_cast<double>(moved) / (t.median_ms * 1e-3) / 1e9;
  set_counters(state, {{"ms_median", t.median_ms},
                       {"ms_p99", t.p99_ms},
                       {"reps", reps},
                       {"weight_bytes", static_cast<double>(weight_bytes)},
                       {"gbps", gbps},
                       {"pct_of_limit", 100.0 * gbps / limit},
                       {"bitwise_equal", equal ? 1 : 0}});
}

// streamed_weights' memory: the budget checks (T7) and the split of the budget.
void streamed_counters(benchmark::State& state, const torchloom::weight_memory& mem) {
  set_counters(state, {{"budget_bytes", static_cast<double>(mem.budget_bytes)},
                       {"high_water_bytes", static_cast<double>(mem.high_water_bytes)},
                       {"violations", static_cast<double>(mem.budget_violations)},
                       {"resident_bytes", static_cast<double>(mem.resident_bytes)},
                       {"streamed_bytes", static_cast<double>(mem.streamed_bytes)}});
}

enum class variant { resident, streamed, mapped, naive };
enum class model_kind { large, small_tensors, large_package };
// T11: none, or streamed_weights with a budget of all the weights or half of them.
enum class share { none, all, half };

// One row: the model at `batch` under `v` (and, with a share, T11's runner, built here; it
// goes at the end, with its device memory).
void bm_offload(benchmark::State& state, model_kind which, std::int64_t batch, variant v, share s) {
  guarded(state, [&] {
    auto& f = fixture::get();
    if (which == model_kind::large_package && !f.package) f.package = load_large_package();
    const offload_model& m = which == model_kind::large           ? *f.large
                             : which == model_kind::small_tensors ? *f.small
                                                                  : *f.package;
    std::unique_ptr<any_runner> shared;
    if (s != share::none) {
      const std::int64_t bytes = s == share::all ? m.weight_bytes : m.weight_bytes / 2;
      shared = m.make_streamed(spec_of(m.dir, (bytes + mib - 1) / mib));
    }
    any_runner* streamed = shared ? shared.get() : m.streamed.get();
    const at::Tensor x = input(m, batch);
    const at::Tensor want = m.resident->run(x);
    std::function<at::Tensor()> forward;
    switch (v) {
      case variant::resident:
        forward = [&] { return m.resident->run(x); };
        break;
      case variant::streamed:
        forward = [&] { return streamed->run(x); };
        break;
      case variant::mapped:
        forward = [&] { return m.mapped->run(x); };
        break;
      case variant::naive:
        forward = [&] {
          at::Tensor y = x;
          for (const auto& weights : m.layers) {
            std::vector<at::Tensor> on_device;
            for (const auto& w : weights) on_device.push_back(w.to(x.device()));
            y = at::linear(y, on_device.size() == 1 ? on_device[0] : at::cat(on_device, 0));
          }
          return y;
        };
        break;
    }
    const bool equal = torch::equal(forward(), want);
    // T6 (streamed against resident when compute-bound) and T11's share:all (against
    // resident) are ratios of two runs: timed in alternating blocks, so that both see the
    // same clocks.
    const bool paired = (v == variant::streamed && batch > 16) || s == share::all;
    const std::int64_t moved =
        v == variant::streamed ? streamed->memory().streamed_bytes : m.weight_bytes;
    const auto timed = [&] { (void)forward(); };
    for (auto _ : state) {
      if (paired) {
        const auto [t, resident] = time_in_blocks(timed, [&] { (void)m.resident->run(x); });
        report(state, t, m.weight_bytes, f.limit_gbps, equal, moved);
        state.counters["resident_ms_paired"] = resident.median_ms;
      } else {
        report(state, time_forward(timed), m.weight_bytes, f.limit_gbps, equal, moved);
        if (s == share::half) {
          state.counters["transfer_ms"] = static_cast<double>(moved) / (f.limit_gbps * 1e9) * 1e3;
        }
      }
    }
    if (v == variant::streamed) streamed_counters(state, streamed->memory());
  });
}

void bm_offload_limit(benchmark::State& state) {
  guarded(state, [&] {
    auto& f = fixture::get();
    for (auto _ : state) state.SetIterationTime(1024.0 * mib / (f.limit_gbps * 1e9));
    set_counters(state, {{"gbps", f.limit_gbps},
                         {"bytes", static_cast<double>(1024 * mib)},
                         {"ms_median", 1024.0 * mib / (f.limit_gbps * 1e9) * 1e3},
                         {"reps", reps}});
  });
}

// T9: eight shared runners of the large model hold one copy of its weights. A, the memory a
// run needs besides the weights, is measured on the resident runner; the eight runners are
// then built, run once each (outputs kept), and the allocator's peak over that is compared
// with W + 8 A.
void bm_offload_shared(benchmark::State& state) {
  guarded(state, [&] {
    const offload_model& m = *fixture::get().large;
    const at::Tensor x = input(m, 16);
    namespace alloc = c10::cuda::CUDACachingAllocator;
    const auto current = [] { return alloc::getDeviceStats(0).allocated_bytes[0].current; };
    const auto peak = [] { return alloc::getDeviceStats(0).allocated_bytes[0].peak; };
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    alloc::resetPeakStats(0);
    const auto before_run = current();
    (void)m.resident->run(x);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const std::int64_t activation = peak() - before_run;
    const std::int64_t weights = m.resident->memory().device_bytes;
    for (auto _ : state) {
      alloc::resetPeakStats(0);
      const auto before = current();
      std::vector<std::unique_ptr<runner_type<torchloom::shared_weights>>> runners;
      std::vector<at::Tensor> outputs;
      for (int i = 0; i < 8; ++i) {
        runners.push_back(
            std::make_unique<runner_type<torchloom::shared_weights>>(spec_of(m.dir), gpu));
        outputs.push_back(runners.back()->run({x})[0]);
      }
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      const std::int64_t used = peak() - before;
      state.SetIterationTime(1e-3);
      // use_count: how many of the runners hold the first one's model (all eight, when shared).
      int sharing = 0;
      for (const auto& r : runners) sharing += &r->model() == &runners.front()->model() ? 1 : 0;
      set_counters(state, {{"weight_bytes", static_cast<double>(weights)},
                           {"activation_bytes", static_cast<double>(activation)},
                           {"device_bytes", static_cast<double>(used)},
                           {"bound_bytes", static_cast<double>(weights + 8 * activation)},
                           {"use_count", sharing}});
    }
  });
}

// T14: the decoder streamed at batch 1 and 128 tokens while its weights exceed the device's
// free memory; the 1-layer twin bitwise against resident first.
void bm_offload_llm(benchmark::State& state) {
#if TORCHLOOM_TORCH_VERSION >= 20600
  constexpr std::int64_t llm_budget_mb = 512;
  constexpr std::int64_t llm_tokens = 128;
  guarded(state, [&] {
    auto& f = fixture::get();
    const std::string how = "scripts/make_transformer_fixtures.py DIR llm";
    const auto big = package_dir("llama_offload", how);
    const auto small = package_dir("llama_offload_small", how);
    torch::manual_seed(14);
    const at::Tensor ids = torch::randint(1, 32000, {1, llm_tokens},
                                          torch::TensorOptions().dtype(torch::kLong).device(gpu));
    bool small_equal = false;
    {
      package_runner<torchloom::resident_weights> resident(spec_of(small), gpu);
      package_runner<torchloom::streamed_weights> streamed(spec_of(small, llm_budget_mb), gpu);
      const at::Tensor want = resident.run({ids})[0];
      small_equal = torch::equal(streamed.run({ids})[0], want);
      small_equal = torch::equal(streamed.run({ids})[0], want) && small_equal;
    }
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    c10::cuda::CUDACachingAllocator::emptyCache();
    std::size_t free = 0;
    std::size_t total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    const auto file_bytes = static_cast<std::int64_t>(fs::file_size(big / "1" / "weights.pt"));
    // What is left: the arena, the first run's temporary copies and the activations fit; the
    // weights do not.
    const std::int64_t left = std::min<std::int64_t>(1280 * mib, file_bytes / 2);
    if (static_cast<std::int64_t>(free) <= left) {
      throw std::runtime_error("the device has only " + std::to_string(free >> 20) +
                               " MiB free before the decoder loads");
    }
    // Device memory taken outside torch's allocator while the row runs.
    void* taken = nullptr;
    check_cuda(cudaMalloc(&taken, free - static_cast<std::size_t>(left)),
               "cudaMalloc (taking the device's free memory)");
    const std::unique_ptr<void, decltype(&cudaFree)> give_back(taken, &cudaFree);
    check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    const auto free_at_load = static_cast<std::int64_t>(free);
    auto streamed = std::make_unique<package_runner<torchloom::streamed_weights>>(
        spec_of(big, llm_budget_mb), gpu);
    // The pinned host bytes that hold the weights (each padded to 256 bytes): W.
    const std::int64_t weights = streamed->memory().host_bytes;
    at::Tensor out;
    for (auto _ : state) {
      const timing t = time_forward([&] { out = streamed->run({ids})[0]; });
      report(state, t, weights, f.limit_gbps, small_equal, streamed->memory().streamed_bytes);
      set_counters(state, {{"tokens", static_cast<double>(llm_tokens)},
                           {"small_bitwise_equal", small_equal ? 1 : 0},
                           {"free_bytes", static_cast<double>(free_at_load)},
                           {"exceeds_free", weights > free_at_load ? 1 : 0},
                           {"finite", torch::isfinite(out).all().item<bool>() ? 1 : 0}});
    }
    streamed_counters(state, streamed->memory());
  });
#else
  state.SkipWithError("the package rows need LibTorch >= 2.6 (aoti_loader)");
#endif
}

void register_all() {
  const auto add = [](const std::string& name, auto fn, auto... args) {
    benchmark::RegisterBenchmark(name.c_str(), fn, args...)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  };
  using enum variant;
  using enum model_kind;
  const std::pair<const char*, variant> all_variants[] = {
      {"resident", resident}, {"streamed", streamed}, {"mapped", mapped}, {"naive", naive}};
  const auto row = [&](const char* model, model_kind k, std::int64_t batch, const char* name,
                       variant v, share s = share::none, const char* suffix = "") {
    add(std::string("BM_offload/model:") + model + "/batch:" + std::to_string(batch) +
            "/variant:" + name + suffix,
        bm_offload, k, batch, v, s);
  };
  add("BM_offload_limit", bm_offload_limit);
  for (const auto& [name, v] : all_variants) {
    row("large", large, 16, name, v);
    row("small_tensors", small_tensors, 16, name, v);
  }
  for (const auto& [name, v] : std::span(all_variants, 2)) row("large", large, 16384, name, v);
  add("BM_offload_shared/runners:8", bm_offload_shared);
  row("large", large, 16, "streamed", streamed, share::all, "/share:all");
  row("large", large, 16, "streamed", streamed, share::half, "/share:half");
  // The same model as an AOTInductor package (T4, T6, T11 for packages).
  for (const std::int64_t batch : {16, 16384}) {
    for (const auto& [name, v] : std::span(all_variants, 2)) {
      row("large_aoti", large_package, batch, name, v);
    }
  }
  row("large_aoti", large_package, 16, "streamed", streamed, share::all, "/share:all");
  row("large_aoti", large_package, 16, "streamed", streamed, share::half, "/share:half");
  // T14: an LLM larger than the device's free memory.
  add("BM_offload/model:llama_aoti/batch:1/variant:streamed", bm_offload_llm);
}

#else

void register_all() {
  benchmark::RegisterBenchmark("BM_offload_limit",
                               skip_with("bm_offload needs CUDA (TORCHLOOM_HAS_CUDA)"));
}

#endif

}  // namespace
}  // namespace torchloom_bench

TORCHLOOM_BENCH_MAIN(register_all)
