// graphed<green_context_stream>: a replayed graph's kernels run on the partition's SMs only
// (a kernel reports %smid), as the eager run's do: the graph is captured in the green
// context, whose kernels it keeps.
#include "support/fixtures.hpp"

#include <torchloom/cuda/green_context.hpp>
#include <torchloom/stream/graphed.hpp>
#include <torchloom/stream/green_context.hpp>
#include <torchloom/torchloom.hpp>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

// tests/cuda/smid.cu: block i writes the id of the SM it ran on to out[i].
void launch_smid_kernel(unsigned* out, int blocks, cudaStream_t stream);

namespace {

const c10::Device gpu(c10::kCUDA, 0);

std::set<unsigned> sm_set(const at::Tensor& ids) {
  const at::Tensor cpu = ids.cpu();
  std::set<unsigned> out;
  const auto* p = cpu.data_ptr<int>();
  for (std::int64_t i = 0; i < cpu.numel(); ++i) {
    REQUIRE(p[i] >= 0);  // every block wrote its SM id
    out.insert(static_cast<unsigned>(p[i]));
  }
  return out;
}

}  // namespace

TEST_CASE("graphed<green_context_stream>: replayed kernels run only on the partition's SMs",
          "[stream][graphs][cuda]") {
  TORCHLOOM_REQUIRE_CUDA();
  const auto counts = torchloom::cuda::possible_sm_counts(0, torchloom::cuda::sm_split_part::group);
  const auto it = std::lower_bound(counts.begin(), counts.end(), 16);
  REQUIRE(it != counts.end());
  torchloom_test::temp_dir dir;
  auto module = torchloom_test::make_linear();
  torchloom_test::write_triton_model(dir / "linear", module);
  auto spec = torchloom::model_spec::from_directory(dir / "linear");
  spec.set("GREEN_CONTEXT_SM_COUNT", std::to_string(*it));
  torchloom::graphed<torchloom::green_context_stream> policy(torchloom::model_context{
      spec.name, spec.directory, gpu, spec.options, spec.version_directory});
  const int sm_total = torchloom::cuda::sm_resource_of(0).sm_count;
  const int blocks = 4 * sm_total;

  // The "model": the smid kernel writing into its input, which it returns.
  const auto launch = [&](const torchloom::run_context& rc, const at::Tensor& ids) {
    launch_smid_kernel(reinterpret_cast<unsigned*>(ids.data_ptr<int>()), blocks,
                       c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, rc.stream).stream());
    return c10::IValue(ids);
  };
  const at::Tensor mine = torch::full({blocks}, -1, torch::dtype(torch::kInt32).device(gpu));
  std::set<unsigned> replayed;
  for (int i = 0; i < 5; ++i) {
    const c10::IValue out = policy.execute(
        gpu, std::vector<c10::IValue>{torch::full_like(mine, -1)},
        [&](const torchloom::run_context& rc, std::vector<c10::IValue>&& in) {
          return launch(rc, in[0].toTensor());
        });
    if (i >= torchloom::graph_eager_runs_before_capture) {
      const auto ids = sm_set(out.toTensor());
      replayed.insert(ids.begin(), ids.end());
    }
  }
  const auto s = policy.stats();
  CHECK(s.captures == 1);
  CHECK(s.uncapturable == 0);
  CHECK(s.replays == 5 - torchloom::graph_eager_runs_before_capture);
  INFO("partition of " << *it << " SMs; replays used " << replayed.size() << " of " << sm_total);
  CHECK(!replayed.empty());
  CHECK(static_cast<int>(replayed.size()) <= *it);

  // The same graph launched through a plain graphed<caller_stream> spreads wider, so the
  // check above can fail.
  torchloom::graphed<torchloom::caller_stream> plain(torchloom::model_context{
      spec.name, spec.directory, gpu, spec.options, spec.version_directory});
  std::set<unsigned> wide;
  for (int i = 0; i < 4; ++i) {
    const c10::IValue out = plain.execute(
        gpu, std::vector<c10::IValue>{torch::full_like(mine, -1)},
        [&](const torchloom::run_context& rc, std::vector<c10::IValue>&& in) {
          return launch(rc, in[0].toTensor());
        });
    const auto ids = sm_set(out.toTensor());
    wide.insert(ids.begin(), ids.end());
  }
  CHECK(static_cast<int>(wide.size()) > *it);
}
