// SPDX-License-Identifier: BSD-3-Clause
// The Conan package works: make a TorchScript model (y = x w^T + b), save it, load it with a
// torchloom runner (pool stream, shared weights) and check the runner's output.
#include <torchloom/torchloom.hpp>

#include <torch/script.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: test_package MODEL_FILE_TO_WRITE\n";
    return 2;
  }
  torch::jit::Module m("linear");
  m.register_parameter("w", torch::randn({4, 8}), false);
  m.register_parameter("b", torch::randn({4}), false);
  m.define("def forward(self, x):\n  return torch.linear(x, self.w, self.b)\n");
  m.save(argv[1]);

  using runner = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook,
                                         torchloom::pool_stream, torchloom::shared_weights>;
  runner r(torchloom::model_spec::from_file(argv[1]));
  const at::Tensor x = torch::rand({2, 8});
  const std::vector<at::Tensor> out = r.run({x});
  const at::Tensor expected = torch::linear(x, m.attr("w").toTensor(), m.attr("b").toTensor());
  if (out.size() != 1 || !torch::allclose(out[0], expected)) {
    std::cerr << "test_package: wrong output\n";
    return 1;
  }
  std::cout << "test_package: torchloom " << torchloom::version_string << " ran '" << r.name()
            << "', output " << out[0].sizes() << ": ok\n";
  return 0;
}
