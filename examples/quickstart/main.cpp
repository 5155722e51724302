// my_app: loads a model directory with torchloom and runs it once on a random batch.
#include <torchloom/torchloom.hpp>

#include <iostream>

int main(int argc, char** argv) {
  // The model directory: yours, or the one ./scripts/run-example.sh builds.
  const char* model_dir = argc > 1 ? argv[1] : "build/models/tiny_mlp";
  try {
    // One runner type: how it loads, its init hook, its CUDA stream, where its weights live.
    using runner_t = torchloom::model_runner<torchloom::torchscript_loader, torchloom::no_hook,
                                             torchloom::caller_stream,
                                             torchloom::resident_weights>;
    runner_t runner(torchloom::model_spec::from_directory(model_dir));  // on the CPU
    // runner_t runner(torchloom::model_spec::from_directory(model_dir), torch::Device("cuda:0"));

    const at::Tensor x = torch::rand({8, 64});        // a batch of 8 rows of 64 features
    std::vector<at::Tensor> out = runner.run({x});    // checked against config.pbtxt first
    std::cout << runner.name() << ": " << x.sizes() << " -> " << out.at(0).sizes() << '\n';
  } catch (const torchloom::error& e) {
    // One line: the model, what is wrong and the code, e.g.
    // torchloom: model 'tiny_mlp': input 0 ('x') must have shape [-1, 64] ... [bad_input]
    // e.code() is a torchloom::errc to branch on; torchloom::to_string(e.code()) its name.
    std::cerr << e.what() << '\n';
    return 1;
  }
  return 0;
}
