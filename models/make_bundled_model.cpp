// Writes torchloom's bundled example model, a TorchScript two-layer MLP (64 -> 128 -> 16),
// to DIR/1/model.pt. Built in C++ with Module::define so the repository holds no binaries.
#include <torch/script.h>

#include <filesystem>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_bundled_model DIR\n";
    return 2;
  }
  const std::filesystem::path dir = std::filesystem::path(argv[1]) / "1";
  std::filesystem::create_directories(dir);
  torch::manual_seed(0);
  torch::jit::Module m("tiny_mlp");
  m.register_parameter("w1", torch::randn({128, 64}) * 0.125, false);
  m.register_parameter("b1", torch::randn({128}) * 0.125, false);
  m.register_parameter("w2", torch::randn({16, 128}) * 0.125, false);
  m.register_parameter("b2", torch::randn({16}) * 0.125, false);
  m.define(R"(
def forward(self, x):
    h = torch.relu(torch.linear(x, self.w1, self.b1))
    return torch.linear(h, self.w2, self.b2)
)");
  m.save((dir / "model.pt").string());
  return 0;
}
