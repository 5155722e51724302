#pragma once
// torchloom-run's parts shared by its translation units: the parsed command line, and
// run_model<Runner>, whose definitions for each runner type are compiled in
// run_<residency>.cpp (one file per residency policy, so a build spreads over several
// compiler processes and no one file instantiates every runner).
#include <torchloom/model_spec.hpp>
#include <torchloom/policy_choice.hpp>

#include <c10/core/Device.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace torchloom_run {

//! Bad command-line usage: reported with the usage text, exit status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! A problem with the model that the program found itself (not torchloom): printed alone,
//! exit status 1, like a torchloom::error.
struct model_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! The command line, parsed.
struct cli_args {
  std::string model;
  std::optional<torchloom::loader_kind> loader;  //!< unset: from the model file's type
  torchloom::policy_choice policies;             //!< loader filled in before the run
  c10::Device device{c10::kCPU};
  std::vector<std::string> inputs;
  std::vector<std::pair<std::string, std::string>> options;
  int iterations = 100;
  int warmup = 1;
  int threads = 1;
  bool json = false;
  bool help = false;
  bool version = false;
};

//! "float32, float64, ...": the dtypes --input accepts.
std::string dtype_names();
//! torch's version, from its headers.
std::string torch_version();
//! The CUDA runtime and driver versions, or why there are none.
std::string cuda_version();

//! Loads the model with `Runner`, runs it as `args` say and prints the report (text or JSON).
//! Throws torchloom::error, model_error, usage_error (a bad --input).
template <class Runner>
void run_model(const cli_args& args, torchloom::model_spec spec);

}  // namespace torchloom_run
