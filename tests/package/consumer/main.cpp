// Loads a model through torchloom and runs it once: the smallest real use of the package.
#include <torchloom/torchloom.hpp>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  torchloom::model_runner<torchloom::torchscript_loader> runner(
      torchloom::model_spec::from_directory(argv[1]));
  const auto out = runner.run({torch::rand({2, 64})});
  if (out.size() != 1 || out[0].sizes() != c10::IntArrayRef{2, 16}) return 1;
  std::cout << "consumer: ok (" << runner.name() << ", torchloom " << torchloom::version_string
            << ")\n";
  return 0;
}
