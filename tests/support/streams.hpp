#pragma once
// Streams of cuda:0 as c10 sees them, and the check that a runner's outputs, read on the
// caller's stream right after run(), are correct while the caller's stream is busy.
#include "fixtures.hpp"

#include <torchloom/model_spec.hpp>

#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/script.h>

namespace torchloom_test {

//! cuda:0's current stream.
inline c10::Stream current_cuda_stream() {
  const c10::Device d(c10::kCUDA, 0);
  return c10::impl::getDeviceGuardImpl(d.type())->getStream(d);
}

//! A stream of torch's pool on cuda:0: not the default stream.
inline c10::Stream pool_cuda_stream() {
  const c10::Device d(c10::kCUDA, 0);
  return c10::impl::getDeviceGuardImpl(d.type())->getStreamFromGlobalPool(d);
}

//! A 256 -> 256 linear model for a runner on cuda:0, and the check of its outputs against a
//! reference computed on a busy caller's stream.
struct busy_caller {
  temp_dir dir;
  at::Tensor w;
  at::Tensor b;

  busy_caller() {
    auto module = make_linear(256, 256);
    write_triton_model(dir / "linear", module);
    w = module.attr("w").toTensor().cuda();
    b = module.attr("b").toTensor().cuda();
  }
  torchloom::model_spec spec() const {
    return torchloom::model_spec::from_directory(dir / "linear");
  }

  //! `calls` runs of `r` from a pool stream on which a long kernel is queued before each input
  //! is written; returns how many outputs differ from x @ w.T + b computed on that stream. A
  //! runner that did not order its run after the caller's work would read the input early,
  //! and one that did not order the caller after its run would hand over outputs early.
  template <class Runner>
  int wrong_outputs(Runner& r, int calls) const {
    const c10::Stream side = pool_cuda_stream();
    c10::StreamGuard guard(side);
    const auto slow = torch::rand({2048, 2048}, torch::kCUDA);
    int wrong = 0;
    for (int i = 0; i < calls; ++i) {
      auto busy = at::matmul(slow, slow);
      const auto x = torch::full({64, 256}, static_cast<float>(i % 97) / 97.0f, torch::kCUDA) +
                     busy.narrow(0, 0, 64).narrow(1, 0, 256) * 0;
      const auto out = r.run({x})[0];
      const auto expected = at::matmul(x, w.t()) + b;  // on the caller's stream too
      if (!torch::allclose(out, expected, 1e-3, 1e-3)) ++wrong;
    }
    return wrong;
  }
};

//! A model whose forward(x) returns (x * 2, the id of the stream it ran on), saved in `t`:
//! the op that reports the stream is registered once, in unit/stream/test_streams.cpp.
torchloom::model_spec stream_probe_model(const temp_dir& t);

}  // namespace torchloom_test
