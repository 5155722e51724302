#pragma once
// A TorchScript MLP of four Linear(width, width) layers with ReLU between, for the serving
// tests and benchmarks: weights scaled by 1/sqrt(width) (activations stay near 1), biases by
// 0.01, drawn from torch's generator in layer order (seed it first for fixed weights).
#include <torch/script.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace torchloom_test {

//! `output` is the expression forward returns, of the last layer's result `y` (e.g.
//! "y[:, 0:16]" to return fewer columns).
inline torch::jit::Module linear_mlp(const std::string& name, std::int64_t width,
                                     const std::string& output = "y") {
  torch::jit::Module m(name);
  const double scale = 1.0 / std::sqrt(static_cast<double>(width));
  for (int i = 1; i <= 4; ++i) {
    const std::string n = std::to_string(i);
    m.register_parameter("w" + n, torch::randn({width, width}) * scale, false);
    m.register_parameter("b" + n, torch::randn({width}) * 0.01, false);
  }
  m.define(R"(
def forward(self, x):
    h = torch.relu(torch.linear(x, self.w1, self.b1))
    h = torch.relu(torch.linear(h, self.w2, self.b2))
    h = torch.relu(torch.linear(h, self.w3, self.b3))
    y = torch.linear(h, self.w4, self.b4)
    return )" + output + "\n");
  return m;
}

}  // namespace torchloom_test
