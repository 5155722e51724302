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

//! The exit statuses, the same in --help and both READMEs.
enum exit_status : int {
  exit_ok = 0,     //!< the model ran
  exit_model = 1,  //!< torchloom, torch or the program refused the model, its options or inputs
  exit_usage = 2,  //!< the command line itself is wrong
};

//! Bad command-line usage: one line, then where to find the usage text; exit status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! A problem with the model that the program found itself (not torchloom): reported like a
//! torchloom::error, exit status 1.
struct model_error : std::runtime_error {
  model_error(std::string model_name, const std::string& message)
      : std::runtime_error(message), model(std::move(model_name)) {}
  std::string model;  //!< the model's name
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
