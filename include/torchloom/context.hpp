#pragma once
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <filesystem>
#include <string>

namespace torchloom {

struct model_spec;      // model_spec.hpp
struct runner_options;  // options.hpp

//! What a hook or a stream policy is told about the model being loaded. The references are
//! valid for the duration of the call that receives the context.
struct model_context {
  const std::string& name;
  const std::filesystem::path& directory;
  c10::Device device;
  const runner_options& options;
  const std::filesystem::path& version_directory;  //!< holds the model file
};

//! What a loader is given to load a model.
struct load_context {
  const model_spec& spec;
  std::filesystem::path file;  //!< the model file, resolved
  c10::Device device;
  //! The runner's stream policy captures runs into CUDA graphs (graphed<Stream>): a loader
  //! whose runtime keeps per-run state that a capture would break loads the model so that
  //! it can be captured (aoti_loader: torch's single-threaded package runner).
  bool graph_capture = false;
};

//! What a loader is given for one run: the device and the stream the stream policy chose.
//! The loader runs the model on `stream` (it makes it current itself, or hands it to its
//! runtime): it does not rely on the stream policy having made it current.
struct run_context {
  c10::Device device;
  c10::Stream stream;
};

}  // namespace torchloom
