#pragma once
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torchloom {

//! The largest config.pbtxt read (1 MiB): Triton's configs are a few KiB; the limit bounds
//! the memory a hostile file can take.
inline constexpr std::size_t max_config_bytes = std::size_t{1} << 20;

//! An input or output as a Triton config declares it.
struct tensor_decl {
  std::string name;
  std::optional<c10::ScalarType> dtype;  //!< unset for TYPE_STRING (a list of strings)
  bool is_string = false;                //!< TYPE_STRING
  std::vector<std::int64_t> dims;        //!< -1 for a variable dimension; no batch dimension
};

//! One `instance_group` entry.
struct instance_group {
  std::string kind = "KIND_AUTO";  //!< KIND_GPU, KIND_CPU, KIND_MODEL or KIND_AUTO
  std::int64_t count = 1;
  std::vector<std::int64_t> gpus;
};

//! One input of a `model_warmup` sample.
struct warmup_input_decl {
  std::string name;
  std::optional<c10::ScalarType> dtype;
  std::vector<std::int64_t> dims;  //!< without the batch dimension
  enum class data { zero, random, file } source = data::zero;
  std::string file;  //!< input_data_file, relative to `<model dir>/warmup/`
};

//! One `model_warmup` sample: Triton runs it `count` times (at least once) at load.
struct warmup_decl {
  std::string name;
  std::int64_t batch_size = 0;  //!< > 0: a batch dimension of that size is prepended
  std::int64_t count = 1;
  std::vector<warmup_input_decl> inputs;
  std::size_t line = 0;
};

//! What torchloom reads from a Triton `config.pbtxt`. The whole file is checked against
//! Triton's ModelConfig (field names, value kinds, ranges); fields torchloom has no use for
//! (dynamic batching, rate limiting, ...) are accepted and ignored.
struct triton_config {
  std::string name;
  std::string platform;  //!< as written: `pytorch_libtorch`, `libtorch`, `torch_aoti` or empty
  std::string backend;   //!< as written: `pytorch`, `torchloom` or empty
  std::int64_t max_batch_size = 0;  //!< > 0: every input has an implicit batch dimension
  std::string default_model_filename;
  std::size_t platform_line = 0;  //!< where each of the three above is; 0 when absent
  std::size_t backend_line = 0;
  std::size_t default_model_filename_line = 0;
  std::vector<instance_group> instance_groups;
  std::vector<tensor_decl> inputs;
  std::vector<tensor_decl> outputs;
  std::map<std::string, std::string> parameters;  //!< the `parameters` block, as text
  std::map<std::string, std::size_t> parameter_lines;  //!< where each parameter is
  std::vector<warmup_decl> warmups;                   //!< `model_warmup`, in order
};

}  // namespace torchloom
