// libtriton_torchloom.so: a Triton Inference Server backend that serves TorchScript and
// AOTInductor models through torchloom's model_runner.
//
// The model configuration Triton hands the backend is read and checked by torchloom
// (model_spec::from_directory with the configuration as JSON), so a repository written for
// Triton's PyTorch backend moves over by setting `backend: "torchloom"`. The runner's
// policies come from parameters the backend reserves (TORCHLOOM_STREAM, TORCHLOOM_RESIDENCY,
// TORCHLOOM_HOOK, TORCHLOOM_DEVICE, TORCHLOOM_GRAPHS), the loader from the model file's type;
// torchloom::with_runner_type maps that choice to one of the runner types compiled into this
// library. Each model instance owns one runner. docs/triton-backend.md tells the whole story.
#include <torchloom/policy_choice.hpp>
#include <torchloom/torchloom.hpp>

#include "any_runner.hpp"
#include "backend_errors.hpp"
#include "host_copy.hpp"
#include "io_binding.hpp"
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
#include "in_flight.hpp"
#endif
#include "string_tensors.hpp"
#include "triton/backend/backend_common.h"
#include "triton/backend/backend_input_collector.h"
#include "triton/backend/backend_model.h"
#include "triton/backend/backend_model_instance.h"
#include "triton/backend/backend_output_responder.h"
#include "triton/core/tritonbackend.h"

#if TORCHLOOM_HAS_CUDA
#include <torchloom/cuda/event.hpp>
#include <torchloom/cuda/stream_lease.hpp>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#ifdef TRITON_ENABLE_GPU
#include <cuda_runtime_api.h>
#endif

#include <ATen/Functions.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::triton_backend {

namespace tb = triton::backend;
namespace fs = std::filesystem;
using triton::common::TritonJson;

//! A tensor of `dtype` and `shape` over `bytes` at `data` (a request's or the collector's
//! buffer, which stays theirs) on `device`, the one Triton says the buffer is on: from_blob
//! would otherwise ask CUDA again for a device buffer (cudaPointerGetAttributes, in every
//! run). No bytes: an empty tensor of that shape.
at::Tensor over_buffer(const void* data, std::size_t bytes, c10::IntArrayRef shape,
                       c10::ScalarType dtype, c10::Device device) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  if (bytes == 0) return at::empty(shape, options);
  return at::for_blob(const_cast<void*>(data), shape)
      .options(options)
      .target_device(device)
      .make_tensor();
}

//! What each of a GPU instance's request slots (in_flight) holds from the start for a
//! request's inputs, on the host and on the device, and for its outputs on the host; and the
//! most it grows to. A request with more input bytes takes the collector's path (Triton's
//! pinned pool); larger outputs are copied into the response's buffer without staging.
constexpr std::size_t staging_bytes = std::size_t{64} << 10;
constexpr std::size_t max_staging_bytes = std::size_t{8} << 20;

//! The parameters this backend reads itself; every other parameter is a runner option.
const std::vector<std::string> backend_keys = {"TORCHLOOM_STREAM", "TORCHLOOM_RESIDENCY",
                                               "TORCHLOOM_HOOK", "TORCHLOOM_DEVICE",
                                               "TORCHLOOM_GRAPHS"};

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

// Whether `err` is success; deletes it otherwise (a failed optional lookup).
bool succeeded(TRITONSERVER_Error* err) {
  if (err == nullptr) return true;
  TRITONSERVER_ErrorDelete(err);
  return false;
}

// Throws a Triton error as a torchloom error of `code` naming `model` and `what`.
void check_triton(TRITONSERVER_Error* err, const std::string& model, std::string_view what,
                  errc code = errc::invalid_option) {
  if (err == nullptr) return;
  const std::string msg = message_of(err);
  TRITONSERVER_ErrorDelete(err);
  throw error(code, model, detail::concat(what, ": ", msg));
}

//! The torch type of a Triton data type; nothing for BYTES and types torch lacks.
std::optional<c10::ScalarType> scalar_type(TRITONSERVER_DataType t) {
  switch (t) {
    case TRITONSERVER_TYPE_BOOL: return c10::kBool;
    case TRITONSERVER_TYPE_UINT8: return c10::kByte;
    case TRITONSERVER_TYPE_INT8: return c10::kChar;
    case TRITONSERVER_TYPE_INT16: return c10::kShort;
    case TRITONSERVER_TYPE_INT32: return c10::kInt;
    case TRITONSERVER_TYPE_INT64: return c10::kLong;
    case TRITONSERVER_TYPE_FP16: return c10::kHalf;
    case TRITONSERVER_TYPE_FP32: return c10::kFloat;
    case TRITONSERVER_TYPE_FP64: return c10::kDouble;
    case TRITONSERVER_TYPE_BF16: return c10::kBFloat16;
    default: return std::nullopt;
  }
}

//! The Triton data type of a torch type; INVALID for one Triton lacks.
TRITONSERVER_DataType triton_type(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: return TRITONSERVER_TYPE_BOOL;
    case c10::kByte: return TRITONSERVER_TYPE_UINT8;
    case c10::kChar: return TRITONSERVER_TYPE_INT8;
    case c10::kShort: return TRITONSERVER_TYPE_INT16;
    case c10::kInt: return TRITONSERVER_TYPE_INT32;
    case c10::kLong: return TRITONSERVER_TYPE_INT64;
    case c10::kHalf: return TRITONSERVER_TYPE_FP16;
    case c10::kFloat: return TRITONSERVER_TYPE_FP32;
    case c10::kDouble: return TRITONSERVER_TYPE_FP64;
    case c10::kBFloat16: return TRITONSERVER_TYPE_BF16;
    default: return TRITONSERVER_TYPE_INVALID;
  }
}

// A config data type name ("TYPE_FP32") as a Triton data type ("FP32").
TRITONSERVER_DataType config_type(const std::string& name) {
  return TRITONSERVER_StringToDataType(name.rfind("TYPE_", 0) == 0 ? name.c_str() + 5
                                                                   : name.c_str());
}

// The value of a reserved parameter as a policy of role `E`, or `fallback` when it is absent.
template <policy_kind E>
E policy_parameter(const model_spec& spec, const std::string& key, E fallback) {
  const auto it = spec.host_parameters.find(key);
  if (it == spec.host_parameters.end()) return fallback;
  try {
    return parse_policy<E>(detail::trim(it->second), spec.name);
  } catch (const error& e) {
    throw error(e.code(), spec.name, detail::concat("parameter ", key, ": ", e.message()));
  }
}

//! The runner policies a model asks for: the loader from its model file (`.pt2`: aoti), the
//! rest from the reserved parameters, with these defaults: the hook is dlopen when
//! MODEL_INIT_LIBRARY is set; the residency is shared when ENABLE_WEIGHT_SHARING is true
//! (the model's instances then hold one copy of the weights); the stream is the caller's.
//! Throws invalid_option for a value that names no policy, unsupported for a policy this
//! build does not have.
policy_choice choose_policies(const model_spec& spec) {
  policy_choice c;
  c.loader = loader_for(spec);
  c.hook = policy_parameter(spec, "TORCHLOOM_HOOK", spec.options.model_init_library.empty()
                                                        ? hook_kind::none
                                                        : hook_kind::dlopen);
  c.stream = policy_parameter(spec, "TORCHLOOM_STREAM", stream_kind::caller);
  c.residency = policy_parameter(spec, "TORCHLOOM_RESIDENCY",
                                 spec.options.enable_weight_sharing.value_or(false)
                                     ? residency_kind::shared
                                     : residency_kind::resident);
  if (c.hook == hook_kind::none && !spec.options.model_init_library.empty()) {
    throw error(errc::invalid_option, spec.name,
                "TORCHLOOM_HOOK=none, but MODEL_INIT_LIBRARY is set: the library would never "
                "run; remove one of them");
  }
  if (!is_available(c)) {
    throw error(errc::unsupported, spec.name,
                detail::concat("no runner for ", to_string(c), " in this build of the backend: ",
                               why_unavailable(c)));
  }
  return c;
}

std::unique_ptr<any_runner> make_runner(const policy_choice& choice, const model_spec& spec,
                                        std::optional<c10::Device> device) {
  return with_runner_type(
      choice,
      [&](auto type) -> std::unique_ptr<any_runner> {
        using runner = typename decltype(type)::type;
        return std::make_unique<runner_box<runner>>(spec, device);
      },
      spec.name);
}

//! What Triton hands the model besides the config's inputs, and how each input is gathered.
enum class input_kind {
  tensor,   //!< a config input: one batch tensor [batch, dims...]
  string,   //!< a TYPE_STRING config input: one List[str] of the batch's elements
  ragged,   //!< a config input with allow_ragged_batch: the requests' elements, flat
  batch,    //!< a batch_input, computed by Triton's input collector
  control,  //!< a sequence-batching control input (START, END, READY, CORRID)
  state,    //!< an implicit-state input of sequence batching
};

//! One input the model receives, as the model configuration describes it.
struct input_decl {
  std::string name;
  input_kind kind = input_kind::tensor;
  std::optional<c10::ScalarType> dtype;
  std::vector<std::int64_t> dims;  //!< as the model sees them (reshape applied), no batch
  const tb::BatchInput* batch = nullptr;
};

//! One output the model gives, as the model configuration describes it.
struct output_decl {
  std::string name;
  std::optional<c10::ScalarType> dtype;
  bool is_string = false;                  //!< TYPE_STRING: the model returns a List[str]
  std::size_t index = 0;                   //!< the element of the model's output
  const tb::BatchOutput* batch = nullptr;  //!< scattered in the shape of an input
  bool state = false;                      //!< an implicit-state output
};

//! The per-model state: the spec read from the repository, the policy choice, and the
//! inputs and outputs the model configuration gives. A load failure here (a bad key, a bad
//! policy name, a naming clash) leaves the model unavailable with the message.
class model_state : public tb::BackendModel {
 public:
  explicit model_state(TRITONBACKEND_Model* model)
      : tb::BackendModel(model, /*allow_optional=*/true) {
    // The one place where Triton's model becomes a torchloom model_spec: the model
    // configuration Triton hands the backend (config.pbtxt with what Triton filled in, or a
    // configuration given through the load API), checked as torchloom checks a config.pbtxt.
    TritonJson::WriteBuffer json;
    check_triton(ModelConfig().Write(&json), Name(), "the model configuration");
    try {
      spec_ = model_spec::from_directory(RepositoryPath(), static_cast<std::int64_t>(Version()),
                                         host_keys(), std::string_view(json.Base(), json.Size()));
    } catch (const error& e) {
      if (e.code() != errc::invalid_option ||
          e.message().find("parameters: unknown option") == std::string::npos) {
        throw;
      }
      throw error(e.code(), e.model(),
                  detail::concat(e.message(), "; the torchloom backend refuses parameters it "
                                 "does not read, where Triton's PyTorch backend ignores them: "
                                 "to keep one, name it in TORCHLOOM_IGNORE_PARAMETERS"));
    }
    choice_ = choose_policies(spec_);
    if (auto it = spec_.host_parameters.find("TORCHLOOM_GRAPHS");
        it != spec_.host_parameters.end()) {
      const auto on = detail::parse_bool(it->second);
      if (!on) {
        throw error(errc::invalid_option, spec_.name,
                    detail::concat("parameter TORCHLOOM_GRAPHS='",
                                   detail::printable(it->second, 64),
                                   "' is not a boolean: use true or false"));
      }
      graphs_ = *on;
    }
    if (graphs_) {
      // TORCHLOOM_GRAPHS=true is graphed<S> around the stream policy S: with caller (the
      // default) that is TORCHLOOM_STREAM=graphed_caller, one runner type for both; with
      // graphed_caller it says the same thing again.
      if (choice_.residency == residency_kind::streamed) {
        throw error(errc::invalid_option, spec_.name,
                    "TORCHLOOM_GRAPHS=true with TORCHLOOM_RESIDENCY=streamed: a CUDA graph "
                    "replays the copies of its capture, and streamed weights are placed anew "
                    "at every run; use resident, shared or mapped weights with graphs");
      }
      if (choice_.stream == stream_kind::caller) choice_.stream = stream_kind::graphed_caller;
      if (choice_.stream == stream_kind::graphed_caller) graphs_ = false;
    }
    read_inputs();
    read_outputs();
    if (auto it = spec_.host_parameters.find("TORCHLOOM_DEVICE");
        it != spec_.host_parameters.end()) {
      try {
        model_device_ = c10::Device(std::string(detail::trim(it->second)));
      } catch (const std::exception&) {
        throw error(errc::invalid_option, spec_.name,
                    detail::concat("parameter TORCHLOOM_DEVICE='", it->second,
                                   "' is not valid: expected cpu or cuda:N"));
      }
    }
  }

  const model_spec& spec() const { return spec_; }
  const policy_choice& choice() const { return choice_; }
  //! TORCHLOOM_GRAPHS with a stream policy other than caller and graphed_caller: the policy
  //! wrapped in graphed<...> (CUDA graph replays). With those two, the choice's stream is
  //! graphed_caller instead.
  bool graphs() const { return graphs_; }
  //! Throws why the outputs could not be bound by Triton's rules (output_decl::index), if so.
  void require_outputs_bound() const {
    if (outputs_unbound_) std::rethrow_exception(outputs_unbound_);
  }
  //! The inputs, in the config's order, then Triton's: batch inputs, sequence controls, state.
  const std::vector<input_decl>& inputs() const { return inputs_; }
  const std::vector<output_decl>& outputs() const { return outputs_; }
  //! TORCHLOOM_DEVICE, the device of KIND_MODEL instances; nothing: the model's own placement.
  std::optional<c10::Device> model_device() const { return model_device_; }
  bool cache_cleaning() const { return spec_.options.enable_cache_cleaning; }

  //! The spec a runner of one instance is built from: the instance's own group (Triton
  //! changes instance groups in place, so the config's may be another than this instance's),
  //! no model_warmup (Triton's core sends those samples through the instance itself), no cache
  //! cleaning inside the run (the backend empties the cache once the outputs are sent), and
  //! the inputs as the backend passes them: every input Triton adds, full shapes.
  model_spec instance_spec(TRITONSERVER_InstanceGroupKind kind, std::int32_t device_id) const {
    model_spec s = spec_;
    triton_config& cfg = *s.config;
    instance_group g;
    switch (kind) {
      case TRITONSERVER_INSTANCEGROUPKIND_GPU:
        g.kind = "KIND_GPU";
        g.gpus = {device_id};
        break;
      case TRITONSERVER_INSTANCEGROUPKIND_MODEL: g.kind = "KIND_MODEL"; break;
      default: g.kind = "KIND_CPU";
    }
    cfg.instance_groups = {g};
    cfg.warmups.clear();
    s.options.enable_cache_cleaning = false;
    // The batch dimension is spelled out (max_batch_size 0, -1 in front): a ragged input or a
    // batch input has a first dimension that is not the batch, and Triton checks the batch
    // size itself.
    const bool batching = MaxBatchSize() > 0;
    std::vector<tensor_decl> decls;
    for (const auto& in : inputs_) {
      tensor_decl d;
      d.name = in.name;
      d.dtype = in.dtype;
      d.is_string = in.kind == input_kind::string;
      if (in.kind == input_kind::ragged || in.kind == input_kind::batch) {
        d.dims = {-1};
        if (in.batch && in.batch->BatchInputKind() == tb::BatchInput::Kind::BATCH_ITEM_SHAPE) {
          d.dims = {-1, -1};
        }
      } else {
        if (batching) d.dims.push_back(-1);
        d.dims.insert(d.dims.end(), in.dims.begin(), in.dims.end());
      }
      decls.push_back(std::move(d));
    }
    cfg.inputs = std::move(decls);
    cfg.max_batch_size = 0;
    return s;
  }

 private:
  // The parameters the backend takes out of the runner's options: its own, and those that
  // TORCHLOOM_IGNORE_PARAMETERS names (';'-separated), which it ignores. Any other key is a
  // runner option, and one torchloom does not know fails the load.
  std::vector<std::string> host_keys() {
    std::vector<std::string> keys = backend_keys;
    keys.push_back("TORCHLOOM_IGNORE_PARAMETERS");
    TritonJson::Value parameters;
    TritonJson::Value entry;
    std::string ignored;
    if (ModelConfig().Find("parameters", &parameters) &&
        parameters.Find("TORCHLOOM_IGNORE_PARAMETERS", &entry) &&
        succeeded(entry.MemberAsString("string_value", &ignored))) {
      for (const auto& k : detail::split(ignored, ';')) {
        const std::string key(detail::trim(k));
        if (!key.empty()) keys.push_back(key);
      }
    }
    return keys;
  }

  // Strings reach the model as one List[str] per batch: one dimension in all, the batch's.
  void require_one_dimension(std::string_view what, const std::string& io,
                             const std::vector<std::int64_t>& dims) const {
    const bool batching = MaxBatchSize() > 0;
    if (dims.size() + (batching ? 1 : 0) == 1) return;
    throw error(errc::unsupported, spec_.name,
                detail::concat(what, " '", io, "' is TYPE_STRING with dims ",
                               c10::IntArrayRef(dims), batching ? " and a batch dimension" : "",
                               ": a model takes and returns strings as one List[str], so the ",
                               what, " must be one-dimensional",
                               batching ? " (with max_batch_size > 0: dims: [ 1 ] and "
                                          "reshape: { shape: [ ] })"
                                        : " (dims: [ -1 ])"));
  }

  // The config's inputs, then those Triton adds to every request.
  void read_inputs() {
    const std::string& name = spec_.name;
    TritonJson::Value inputs;
    if (ModelConfig().Find("input", &inputs)) {
      for (std::size_t i = 0; i < inputs.ArraySize(); ++i) {
        TritonJson::Value io;
        check_triton(inputs.IndexAsObject(i, &io), name, "model configuration input");
        input_decl d;
        check_triton(io.MemberAsString("name", &d.name), name, "model configuration input");
        std::string type;
        check_triton(io.MemberAsString("data_type", &type), name,
                     detail::concat("input '", d.name, "'"));
        TritonJson::Value reshape;
        const bool reshaped = io.Find("reshape", &reshape);
        check_triton(tb::ParseShape(reshaped ? reshape : io, reshaped ? "shape" : "dims",
                                    &d.dims),
                     name, detail::concat("input '", d.name, "' dims"));
        if (type == "TYPE_STRING") {
          d.kind = input_kind::string;
          require_one_dimension("input", d.name, d.dims);
          if (IsInputRagged(d.name)) {
            throw error(errc::unsupported, name,
                        detail::concat("input '", d.name, "' is TYPE_STRING with "
                                       "allow_ragged_batch; strings cannot be batched raggedly"));
          }
          inputs_.push_back(std::move(d));
          continue;
        }
        d.dtype = scalar_type(config_type(type));
        if (!d.dtype) {
          throw error(errc::unsupported, name,
                      detail::concat("input '", d.name, "' is ", type,
                                     ", which torchloom cannot pass to a model"));
        }
        bool flag = false;
        if (io.Find("is_shape_tensor") && succeeded(io.MemberAsBool("is_shape_tensor", &flag)) &&
            flag) {
          throw error(errc::unsupported, name,
                      detail::concat("input '", d.name, "' sets is_shape_tensor, which only "
                                     "TensorRT models have; remove it"));
        }
        if (IsInputRagged(d.name)) d.kind = input_kind::ragged;
        inputs_.push_back(std::move(d));
      }
    }
    for (const auto& b : BatchInputs()) {
      for (const auto& target : b.TargetNames()) {
        input_decl d;
        d.name = target;
        d.kind = input_kind::batch;
        d.dtype = scalar_type(b.DataType());
        d.batch = &b;
        inputs_.push_back(std::move(d));
      }
    }
    TritonJson::Value sequence;
    if (!ModelConfig().Find("sequence_batching", &sequence)) return;
    TritonJson::Value controls;
    if (sequence.Find("control_input", &controls)) {
      for (std::size_t i = 0; i < controls.ArraySize(); ++i) {
        TritonJson::Value ci;
        check_triton(controls.IndexAsObject(i, &ci), name, "sequence_batching control_input");
        input_decl d;
        d.kind = input_kind::control;
        check_triton(ci.MemberAsString("name", &d.name), name, "sequence_batching control_input");
        d.dims = {1};
        TritonJson::Value kinds;
        if (ci.Find("control", &kinds) && kinds.ArraySize() > 0) {
          TritonJson::Value c;
          check_triton(kinds.IndexAsObject(0, &c), name, "sequence_batching control");
          TritonJson::Value values;
          std::string type;
          if (c.Find("int32_false_true", &values) && values.ArraySize() > 0) {
            d.dtype = c10::kInt;
          } else if (c.Find("fp32_false_true", &values) && values.ArraySize() > 0) {
            d.dtype = c10::kFloat;
          } else if (c.Find("bool_false_true", &values) && values.ArraySize() > 0) {
            d.dtype = c10::kBool;
          } else if (succeeded(c.MemberAsString("data_type", &type)) && !type.empty()) {
            d.dtype = scalar_type(config_type(type));
            if (!d.dtype) {
              throw error(errc::unsupported, name,
                          detail::concat("sequence_batching control input '", d.name, "' is ",
                                         type, ", which torchloom cannot pass to a model (use "
                                         "TYPE_INT64 or TYPE_INT32 for CONTROL_SEQUENCE_CORRID)"));
            }
          }
        }
        inputs_.push_back(std::move(d));
      }
    }
    TritonJson::Value states;
    if (sequence.Find("state", &states)) {
      for (std::size_t i = 0; i < states.ArraySize(); ++i) {
        TritonJson::Value st;
        check_triton(states.IndexAsObject(i, &st), name, "sequence_batching state");
        input_decl d;
        d.kind = input_kind::state;
        std::string type;
        check_triton(st.MemberAsString("input_name", &d.name), name, "sequence_batching state");
        check_triton(st.MemberAsString("data_type", &type), name, "sequence_batching state");
        d.dtype = scalar_type(config_type(type));
        if (!d.dtype) {
          throw error(errc::unsupported, name,
                      detail::concat("sequence_batching state '", d.name, "' is ", type,
                                     ", which torchloom cannot pass to a model"));
        }
        check_triton(tb::ParseShape(st, "dims", &d.dims), name, "sequence_batching state dims");
        inputs_.push_back(std::move(d));
      }
    }
  }

  // The config's outputs, then the implicit-state outputs, bound to the model's outputs.
  void read_outputs() {
    const std::string& name = spec_.name;
    std::vector<std::string> names;
    TritonJson::Value outputs;
    if (ModelConfig().Find("output", &outputs)) {
      for (std::size_t i = 0; i < outputs.ArraySize(); ++i) {
        TritonJson::Value io;
        check_triton(outputs.IndexAsObject(i, &io), name, "model configuration output");
        output_decl d;
        check_triton(io.MemberAsString("name", &d.name), name, "model configuration output");
        std::string type;
        check_triton(io.MemberAsString("data_type", &type), name,
                     detail::concat("output '", d.name, "'"));
        d.batch = FindBatchOutput(d.name);
        if (type == "TYPE_STRING") {
          d.is_string = true;
          TritonJson::Value reshape;
          const bool reshaped = io.Find("reshape", &reshape);
          std::vector<std::int64_t> dims;
          check_triton(tb::ParseShape(reshaped ? reshape : io, reshaped ? "shape" : "dims",
                                      &dims),
                       name, detail::concat("output '", d.name, "' dims"));
          require_one_dimension("output", d.name, dims);
          if (d.batch) {
            throw error(errc::unsupported, name,
                        detail::concat("output '", d.name, "' is TYPE_STRING and a batch_output; "
                                       "strings cannot be scattered"));
          }
        } else {
          d.dtype = scalar_type(config_type(type));
          if (!d.dtype) {
            throw error(errc::unsupported, name,
                        detail::concat("output '", d.name, "' is ", type,
                                       ", which torchloom cannot return from a model"));
          }
        }
        names.push_back(d.name);
        outputs_.push_back(std::move(d));
      }
    }
    TritonJson::Value sequence;
    TritonJson::Value states;
    if (ModelConfig().Find("sequence_batching", &sequence) && sequence.Find("state", &states)) {
      for (std::size_t i = 0; i < states.ArraySize(); ++i) {
        TritonJson::Value st;
        check_triton(states.IndexAsObject(i, &st), name, "sequence_batching state");
        output_decl d;
        d.state = true;
        std::string type;
        check_triton(st.MemberAsString("output_name", &d.name), name, "sequence_batching state");
        check_triton(st.MemberAsString("data_type", &type), name, "sequence_batching state");
        d.dtype = scalar_type(config_type(type));  // read_inputs refused the others
        names.push_back(d.name);
        outputs_.push_back(std::move(d));
      }
    }
    // Triton's rules for a model without forward-based names; an AOTInductor package with
    // them is bound by its runner's names instead (instance_state::bind_outputs), so a
    // contradiction here counts only for the others.
    try {
      const io_positions bound = bind_output_names(name, names);
      for (std::size_t i = 0; i < outputs_.size(); ++i) outputs_[i].index = bound.positions[i];
    } catch (const error&) {
      outputs_unbound_ = std::current_exception();
    }
  }

  model_spec spec_;
  policy_choice choice_;
  bool graphs_ = false;
  std::vector<input_decl> inputs_;
  std::vector<output_decl> outputs_;
  std::exception_ptr outputs_unbound_;
  std::optional<c10::Device> model_device_;
};

//! One input as the instance passes it: its declaration and the argument it feeds.
struct input_binding {
  const input_decl* decl = nullptr;
  std::size_t position = 0;  //!< the argument of forward (unused for a Dict[str, Tensor] model)
};

//! One model instance: one runner on the instance's device.
class instance_state : public tb::BackendModelInstance {
 public:
  instance_state(model_state* model, TRITONBACKEND_ModelInstance* instance)
      : tb::BackendModelInstance(model, instance), model_(model) {
    const std::string& name = model->spec().name;
    std::optional<c10::Device> device;
    switch (Kind()) {
      case TRITONSERVER_INSTANCEGROUPKIND_GPU:
        device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(DeviceId()));
        break;
      case TRITONSERVER_INSTANCEGROUPKIND_MODEL:
        device = model->model_device();  // nothing: where the model was saved
        break;
      default:
        device = c10::Device(c10::kCPU);
    }
    runner_ = model->graphs()
                  ? make_graphed_runner(model->choice(), model->instance_spec(Kind(), DeviceId()),
                                        device)
                  : make_runner(model->choice(), model->instance_spec(Kind(), DeviceId()), device);
    device_ = runner_->device();
    if (model->cache_cleaning() && device_.is_cuda() && !TORCHLOOM_HAS_CUDA) {
      throw error(errc::unsupported, name,
                  "ENABLE_CACHE_CLEANING on a CUDA device needs a backend built with "
                  "torchloom::cuda (TORCHLOOM_HAS_CUDA)");
    }
#if TORCHLOOM_HAS_CUDA
    if (device_.is_cuda()) {
      // torch's work runs on a stream that outlives the instance (see run_group).
      run_stream_ = cuda::stream_lease(name, device_.index());
      const c10::cuda::CUDAGuard guard(device_);
      run_began_ = cuda::event(name, cudaEventDefault);
      run_ended_ = cuda::event(name, cudaEventDefault);
    }
#endif
    bind_inputs();
    bind_outputs();
    // run_single serves plain tensors in and out; on a GPU it stages through pinned memory,
    // which ENABLE_PINNED_INPUT and ENABLE_PINNED_OUTPUT set to false rule out.
    single_ = !dict_ && !strings_ &&
              std::all_of(inputs_.begin(), inputs_.end(),
                          [](const input_binding& b) { return b.decl->kind == input_kind::tensor; }) &&
              std::all_of(model->outputs().begin(), model->outputs().end(),
                          [](const output_decl& o) { return !o.state && !o.batch && !o.is_string; }) &&
              (!device_.is_cuda() || (model->EnablePinnedInput() && model->EnablePinnedOutput()));
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    if (single_ && run_stream_) {
      in_flight_ = std::make_unique<in_flight>(
          device_.index(), [this](request_slot& s) noexcept { answer(s); });
      // Each slot's events and staging buffers now, so that serving allocates nothing until a
      // request needs more room than staging_bytes.
      const c10::cuda::CUDAStreamGuard on_run(
          c10::cuda::getStreamFromExternal(run_stream_.get(), device_.index()));
      in_flight_->prepare([&](request_slot& s) {
        s.began = cuda::event(name, cudaEventDefault);
        s.ended = cuda::event(name, cudaEventDefault);
        s.done = cuda::event(name);
        (void)s.host_in.reserve(staging_bytes, name);
        (void)s.host_out.reserve(staging_bytes, name);
        s.device_in = at::empty({static_cast<std::int64_t>(staging_bytes)},
                                at::TensorOptions().dtype(at::kByte).device(device_));
      });
    }
#endif
  }

  ~instance_state() override {
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    in_flight_.reset();  // every request answered, its slot's buffers gone
#endif
    runner_.reset();
    empty_cache();
  }

  model_state* model() const { return model_; }

  void execute(TRITONBACKEND_Request** requests, std::uint32_t count);

 private:
  // The requests of one run and what happened to them.
  struct group {
    std::vector<TRITONBACKEND_Request*> requests;
    std::vector<TRITONBACKEND_Response*> responses;
    std::vector<std::uint32_t> index;  // in execute()'s arrays
    std::vector<std::int64_t> rows;    // each request's, by its first input
    std::int64_t batch = 0;            // their sum
    std::uint64_t exec_start = 0;
    std::uint64_t compute_start = 0;
    std::uint64_t compute_end = 0;
    bool ran = false;  // the model ran and its outputs went to the responses
    bool handed_off = false;  // its request is in_flight_'s to answer and release
  };

  void bind_inputs() {
    const std::string& name = model_->spec().name;
    const input_signature& sig = runner_->inputs();
    const auto& decls = model_->inputs();
    std::vector<std::string> names;
    for (const auto& d : decls) names.push_back(d.name);
    // A forward that takes one Dict[str, Tensor]: the config's inputs are its keys.
    if (sig.size() == 1 && sig[0].type && sig[0].type->kind() == c10::TypeKind::DictType &&
        std::find(names.begin(), names.end(), sig[0].name) == names.end()) {
      for (const auto& d : decls) {
        if (d.kind != input_kind::tensor) {
          throw error(errc::unsupported, name,
                      detail::concat("forward takes a Dict[str, Tensor], which holds the "
                                     "config's inputs; input '", d.name, "' (a ",
                                     d.kind == input_kind::ragged ? "ragged input"
                                                                  : "batch or sequence input",
                                     ") cannot go into it"));
        }
        inputs_.push_back({&d, 0});
      }
      dict_ = true;
      return;
    }
    std::vector<std::size_t> positions;
    if (const io_names& forward = runner_->names(); forward.forward_based) {
      // An AOTInductor package with a call spec: its forward-based and ordinal names, as
      // model_runner (and Triton 26.05) binds them.
      for (const auto& d : decls) {
        const auto k = runner_->input_index(d.name);
        if (!k) {
          const std::string why = forward.why_not(d.name);
          throw error(errc::invalid_option, name,
                      detail::concat("input '", d.name, "' is not an input of the package",
                                     why.empty()
                                         ? detail::concat(": its inputs are ",
                                                          detail::io_name_list(
                                                              forward.inputs, sig.size(),
                                                              "INPUT", forward.inputs_unknown))
                                         : detail::concat(": ", why)));
        }
        for (std::size_t j = 0; j < positions.size(); ++j) {
          if (positions[j] != *k) continue;
          throw error(errc::invalid_option, name,
                      detail::concat("inputs '", decls[j].name, "' and '", d.name,
                                     "' both name the package's ",
                                     detail::input_label(sig, *k)));
        }
        positions.push_back(*k);
      }
    } else {
      std::vector<std::string> arguments;
      for (const auto& s : sig) arguments.push_back(s.name);
      positions = bind_input_names(name, names, arguments).positions;
    }
    for (std::size_t i = 0; i < decls.size(); ++i) {
      inputs_.push_back({&decls[i], positions[i]});
      if (decls[i].kind != input_kind::string) continue;
      const auto& arg = sig[positions[i]];
      if (!arg.type || !c10::ListType::ofStrings()->isSubtypeOf(*arg.type)) {
        throw error(errc::invalid_option, name,
                    detail::concat("input '", decls[i].name, "' is TYPE_STRING, but forward's ",
                                   detail::input_label(sig, positions[i]), " takes ",
                                   arg.type ? arg.type->str() : std::string("a tensor"),
                                   ", not List[str]"));
      }
      strings_ = true;
    }
    for (const auto& o : model_->outputs()) strings_ = strings_ || o.is_string;
    std::sort(inputs_.begin(), inputs_.end(),
              [](const input_binding& a, const input_binding& b) {
                return a.position < b.position;
              });
    // Every argument without a default needs an input.
    for (std::size_t a = 0; a < sig.size(); ++a) {
      const bool fed = std::any_of(inputs_.begin(), inputs_.end(),
                                   [&](const input_binding& b) { return b.position == a; });
      if (!fed && !sig[a].has_default) {
        throw error(errc::invalid_option, name,
                    detail::concat("forward's ", detail::input_label(sig, a),
                                   " has no input in the model configuration"));
      }
    }
  }

  // Which output of the model each configured output is (output_index_): an AOTInductor
  // package's forward-based and ordinal names as model_runner binds them, else Triton's
  // rules (model_state::read_outputs).
  void bind_outputs() {
    const std::string& name = model_->spec().name;
    const io_names& forward = runner_->names();
    if (!forward.forward_based) {
      model_->require_outputs_bound();
      for (const auto& o : model_->outputs()) output_index_.push_back(o.index);
      return;
    }
    for (const auto& o : model_->outputs()) {
      const auto k = runner_->output_index(o.name);
      if (!k) {
        const std::string why = forward.why_not(o.name);
        throw error(errc::invalid_option, name,
                    detail::concat(o.state ? "state output '" : "output '", o.name,
                                   "' is not an output of the package",
                                   why.empty()
                                       ? detail::concat(": its outputs are ",
                                                        detail::io_name_list(
                                                            forward.outputs,
                                                            forward.output_count.value_or(0),
                                                            "OUTPUT", forward.outputs_unknown))
                                       : detail::concat(": ", why)));
      }
      output_index_.push_back(*k);
    }
  }

  // Where the collector may put a gathered input. A GPU instance takes them in its GPU's
  // memory only, as Triton's PyTorch backend does: the collector copies a request's host
  // buffer there on the run stream without a host wait, ahead of the run.
  // With host memory allowed as well, the collector hands over the request's own host buffer
  // as it is, and the runner then copies it to the device with a host wait in every run.
  std::vector<std::pair<TRITONSERVER_MemoryType, std::int64_t>> input_memory() const {
    if (device_.is_cuda() && Kind() == TRITONSERVER_INSTANCEGROUPKIND_GPU) {
      return {{TRITONSERVER_MEMORY_GPU, device_.index()}};
    }
    return {{TRITONSERVER_MEMORY_CPU_PINNED, 0}, {TRITONSERVER_MEMORY_CPU, 0}};
  }

  // The stream the collector's and the responder's copies go on: the run stream where there
  // is one, so that the copies in, the run and the copies out follow each other on the GPU
  // with no event between them; Triton's stream of the instance otherwise (the default
  // stream where it has none).
  auto copy_stream() {
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    if (run_stream_) return run_stream_.get();
#endif
    return CudaStream();
  }

  // Waits for the copies the collector or the responder queued (they say so), and the run
  // where it shares their stream, on copy_stream(). A device error that surfaces here fails
  // the batch.
  void synchronize() {
#ifdef TRITON_ENABLE_GPU
    if (const cudaError_t err = cudaStreamSynchronize(copy_stream()); err != cudaSuccess) {
      (void)cudaGetLastError();
      throw error(errc::cuda_error, model_->spec().name,
                  detail::concat("waiting for the input and output copies: ",
                                 cudaGetErrorString(err)));
    }
#endif
  }

  // Waits for the device work of a run, so compute end is when the model finished.
  void wait_for_device() {
#if TORCHLOOM_HAS_CUDA
    if (!device_.is_cuda()) return;
    const cudaStream_t stream = run_stream_
                                    ? run_stream_.get()
                                    : c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    const cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw error(errc::cuda_error, model_->spec().name,
                  detail::concat("waiting for the model's run: ", cudaGetErrorString(err)));
    }
#endif
  }

  // The responder copies every output on copy_stream(). An output on another GPU than the
  // run stream's (a KIND_MODEL model placed across GPUs, or one on the CPU that makes its
  // outputs on a GPU) was written on that GPU's current stream: the run stream waits for it
  // first, or without a run stream the host does.
  void wait_for_other_gpus([[maybe_unused]] const std::vector<at::Tensor>& outputs) {
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    const std::string& name = model_->spec().name;
    std::vector<c10::DeviceIndex> waited;
    for (const at::Tensor& t : outputs) {
      if (!t.defined() || !t.is_cuda() || (run_stream_ && t.device() == device_)) continue;
      const c10::DeviceIndex d = t.device().index();
      if (std::find(waited.begin(), waited.end(), d) != waited.end()) continue;
      waited.push_back(d);
      if (!run_stream_) {
        c10::cuda::getCurrentCUDAStream(d).synchronize();
        continue;
      }
      const c10::cuda::CUDAGuard guard(t.device());
      const cuda::event written(name);  // destroyed once the wait is queued, as CUDA allows
      cuda::check(cudaEventRecord(written.get(), c10::cuda::getCurrentCUDAStream(d).stream()),
                  name, "cudaEventRecord");
      cuda::check(cudaStreamWaitEvent(run_stream_.get(), written.get(), 0), name,
                  "cudaStreamWaitEvent");
    }
#endif
  }

  // Whether the copies go on the run stream (copy_stream()), in order with the run.
  bool one_stream() {
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    return static_cast<bool>(run_stream_);
#else
    return false;
#endif
  }

  // Waits for copy_stream() without throwing: on the way out of a run that failed while
  // copies into the collector's buffers were still queued.
  void synchronize_quietly() noexcept {
#ifdef TRITON_ENABLE_GPU
    if (cudaStreamSynchronize(copy_stream()) != cudaSuccess) (void)cudaGetLastError();
#endif
  }

  // Records the start (`began`) or the end of a run's device work on the run stream, with
  // timing, where one_stream().
  void mark_run([[maybe_unused]] bool began) {
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    mark_run(began ? run_began_.get() : run_ended_.get());
#endif
  }
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  void mark_run(cudaEvent_t e) {
    if (const cudaError_t err = cudaEventRecord(e, run_stream_.get()); err != cudaSuccess) {
      (void)cudaGetLastError();
      throw error(errc::cuda_error, model_->spec().name,
                  detail::concat("timing the model's run: ", cudaGetErrorString(err)));
    }
  }
#endif

  // The compute end of a run timed by mark_run(), once its device work is done:
  // `compute_start` plus the device time between the marks, within [`launched`, now].
  std::uint64_t timed_compute_end(std::uint64_t compute_start, std::uint64_t launched) const {
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    return timed_compute_end(compute_start, launched, run_began_.get(), run_ended_.get());
#else
    (void)compute_start;
    return std::min(launched, now_ns());
#endif
  }
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  static std::uint64_t timed_compute_end(std::uint64_t compute_start, std::uint64_t launched,
                                         cudaEvent_t began, cudaEvent_t ended) {
    std::uint64_t end = launched;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, began, ended) == cudaSuccess) {
      end = std::max(launched, compute_start + static_cast<std::uint64_t>(ms * 1e6));
    } else {
      (void)cudaGetLastError();
    }
    return std::min(end, now_ns());
  }
#endif

  void empty_cache() const {
#if TORCHLOOM_HAS_CUDA
    if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }

  // Checks one request against what the runner declares; throws bad_input. Returns its
  // batch size (the first dimension of its first input; 1 without batching).
  std::int64_t check_request(TRITONBACKEND_Request* request) const;

  // Runs one group: gathers its inputs, runs the model, sends the outputs to its responses
  // (a response set to null has had its error sent).
  void run_group(group& g);
  std::vector<at::Tensor> checked_outputs(const group& g,
                                          const std::vector<c10::IValue>& outputs) const;
  // One request on its own, without the collector and the responder, where it fits; false,
  // with nothing done, where it does not.
  bool run_single(group& g);
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  // Waits for a slot's device work and answers and releases its request (in_flight_'s
  // thread).
  void answer(request_slot& s) noexcept;
#endif

  // The model's outputs, flattened (a tensor or a list of strings each), on `values` in
  // argument order (or the one Dict[str, Tensor]).
  std::vector<c10::IValue> run_model(std::vector<c10::IValue> values);
  void flatten_outputs(const c10::IValue& v, std::vector<c10::IValue>& out) const;
  c10::List<std::string> gather_strings(const input_decl& d, group& g);
  bool send_strings(const output_decl& o, const c10::List<std::string>& list, group& g,
                    std::vector<std::string>& keep);
  static bool requested(TRITONBACKEND_Request* request, const std::string& output);

  model_state* model_;
  c10::Device device_{c10::kCPU};
#if TORCHLOOM_HAS_CUDA
  // The stream torch's work and the copies in and out run on, for a CUDA device (see
  // run_group).
  cuda::stream_lease run_stream_;
  // Timing events around a run on the GPU: its compute end without a host wait (see run_group).
  cuda::event run_began_;
  cuda::event run_ended_;
#endif
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  // The requests run_single queued on the GPU and has yet to answer, in their slots.
  std::unique_ptr<in_flight> in_flight_;
#endif
  std::unique_ptr<any_runner> runner_;
  std::vector<input_binding> inputs_;  // in argument order
  std::vector<std::size_t> output_index_;  // per model_->outputs(): the model's output
  bool dict_ = false;
  bool strings_ = false;  // strings in or out: the model runs on IValues
  bool single_ = false;   // run_single may take a request alone
};

std::int64_t instance_state::check_request(TRITONBACKEND_Request* request) const {
  const std::string& name = model_->spec().name;
  const input_signature& sig = runner_->inputs();
  const bool batching = model_->MaxBatchSize() > 0;
  std::int64_t batch = -1;
  std::size_t given = 0;
  bool missing = false;
  for (const auto& b : inputs_) {
    if (b.decl->kind == input_kind::batch) {  // made by the collector for the whole batch
      ++given;
      continue;
    }
    TRITONBACKEND_Input* input = nullptr;
    if (TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(request, b.decl->name.c_str(),
                                                             &input)) {
      TRITONSERVER_ErrorDelete(err);
      missing = true;  // an optional input left out: the count check below sees it
      continue;
    }
    if (missing && !dict_) {
      throw error(errc::bad_input, name,
                  detail::concat("input '", b.decl->name, "' is given but an input before it "
                                 "is not; only trailing inputs may be left out"));
    }
    ++given;
    TRITONSERVER_DataType dtype;
    const std::int64_t* shape = nullptr;
    std::uint32_t dims = 0;
    if (TRITONSERVER_Error* err = TRITONBACKEND_InputProperties(input, nullptr, &dtype, &shape,
                                                                &dims, nullptr, nullptr)) {
      const std::string msg = message_of(err);
      TRITONSERVER_ErrorDelete(err);
      throw error(errc::bad_input, name, detail::concat("input '", b.decl->name, "': ", msg));
    }
    if (batch < 0) batch = batching && dims > 0 ? shape[0] : 1;
    if (b.decl->kind == input_kind::string) {
      if (dtype != TRITONSERVER_TYPE_BYTES) {
        throw error(errc::bad_input, name,
                    detail::concat("input '", b.decl->name, "' is ",
                                   TRITONSERVER_DataTypeString(dtype), ", not BYTES"));
      }
      continue;
    }
    const auto scalar = scalar_type(dtype);
    if (!scalar) {
      throw error(errc::bad_input, name,
                  detail::concat("input '", b.decl->name, "' is ",
                                 TRITONSERVER_DataTypeString(dtype),
                                 ", which torchloom cannot pass to a model"));
    }
    if (dict_) continue;  // Triton checked it against the config; the dict has no schema
    c10::IntArrayRef sizes(shape, dims);
    std::int64_t elements = 1;
    if (b.decl->kind == input_kind::ragged) {
      for (auto d : sizes) elements *= d;
      sizes = c10::IntArrayRef(&elements, 1);
    }
    // The runner's own check, on a tensor that holds no data, where the input does not pass
    // the same rules checked here without making one (it throws the runner's message).
    if (!detail::fits_input(sig[b.position], *scalar, sizes)) {
      (void)detail::check_tensor_input(
          name, sig, b.position,
          at::empty(sizes, at::TensorOptions().dtype(*scalar).device(c10::kMeta)), c10::kMeta);
    }
  }
  if (!dict_) detail::check_input_count(name, sig, given);
  return batch < 0 ? 1 : batch;
}

std::vector<c10::IValue> instance_state::run_model(std::vector<c10::IValue> values) {
  std::vector<c10::IValue> out;
  if (!dict_ && !strings_) {
    // All tensors, in and out: the runner's path without boxing.
    std::vector<at::Tensor> tensors;
    tensors.reserve(values.size());
    for (auto& v : values) tensors.push_back(std::move(v).toTensor());
    for (auto& t : runner_->run_tensors(tensors)) out.emplace_back(std::move(t));
    return out;
  }
  flatten_outputs(runner_->run_values(std::move(values)), out);
  return out;
}

void instance_state::flatten_outputs(const c10::IValue& v, std::vector<c10::IValue>& out) const {
  // A tuple's elements are the outputs; nested tuples and lists of tensors are flattened, as
  // the runner flattens them; a list of strings is one (TYPE_STRING) output.
  if (v.isTensor()) {
    out.push_back(v);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) flatten_outputs(e, out);
  } else if (v.isList() && v.type()->isSubtypeOf(*c10::ListType::ofStrings())) {
    out.push_back(v);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) out.emplace_back(t);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) flatten_outputs(e, out);
  } else {
    throw error(errc::run_failed, model_->spec().name,
                detail::concat("the model returned ", detail::describe_ivalue(v),
                               "; Triton takes tensors and lists of strings"));
  }
}

// Gathers a TYPE_STRING input: every request's elements, in request order, into one list.
// A request whose strings cannot be read gets its error and empty strings in its place, so
// the rows of the others keep their positions.
c10::List<std::string> instance_state::gather_strings(const input_decl& d, group& g) {
  const std::string& name = model_->spec().name;
  struct piece {
    std::vector<char> host;  // a copy, where the request's buffer is not one host buffer
    const char* data = nullptr;
    std::size_t bytes = 0;
    std::int64_t elements = 0;
  };
  std::vector<piece> pieces(g.requests.size());
  bool copied = false;
  for (std::size_t r = 0; r < g.requests.size(); ++r) {
    if (g.responses[r] == nullptr) continue;
    piece& p = pieces[r];
    TRITONBACKEND_Input* input = nullptr;
    const std::int64_t* shape = nullptr;
    std::uint32_t rank = 0;
    std::uint64_t bytes = 0;
    std::uint32_t buffers = 0;
    TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(g.requests[r], d.name.c_str(), &input);
    if (err == nullptr) {
      err = TRITONBACKEND_InputPropertiesForHostPolicy(input, HostPolicyName().c_str(), nullptr,
                                                       nullptr, &shape, &rank, &bytes, &buffers);
    }
    if (err != nullptr) {
      RESPOND_AND_SET_NULL_IF_ERROR(&g.responses[r], err);
      continue;
    }
    p.elements = 1;
    for (std::uint32_t i = 0; i < rank; ++i) p.elements *= shape[i];
    p.bytes = bytes;
    std::size_t offset = 0;
    for (std::uint32_t i = 0; i < buffers && err == nullptr; ++i) {
      const void* data = nullptr;
      std::uint64_t size = 0;
      TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
      std::int64_t id = 0;
      err = TRITONBACKEND_InputBufferForHostPolicy(input, HostPolicyName().c_str(), i, &data,
                                                   &size, &type, &id);
      if (err != nullptr) break;
      if (buffers == 1 && type != TRITONSERVER_MEMORY_GPU) {
        p.data = static_cast<const char*>(data);  // read in place
        break;
      }
      if (p.host.empty()) p.host.resize(p.bytes);
      if (size > p.bytes - offset) {
        err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                    "string input buffers larger than the input");
        break;
      }
      bool cuda = false;
      err = tb::CopyBuffer("string input", type, id, TRITONSERVER_MEMORY_CPU, 0, size, data,
                           p.host.data() + offset, copy_stream(), &cuda);
      copied = copied || cuda;
      offset += size;
    }
    if (!p.host.empty()) p.data = p.host.data();
    if (err != nullptr) RESPOND_AND_SET_NULL_IF_ERROR(&g.responses[r], err);
  }
  if (copied) synchronize();
  c10::List<std::string> list;
  for (std::size_t r = 0; r < g.requests.size(); ++r) {
    const piece& p = pieces[r];
    const std::size_t before = list.size();
    if (g.responses[r] != nullptr) {
      try {
        read_strings(name, d.name, p.data, p.bytes, p.elements, list);
        continue;
      } catch (const error& e) {
        RESPOND_AND_SET_NULL_IF_ERROR(&g.responses[r], to_triton(e));
      }
    }
    // A failed request keeps its rows, as empty strings.
    while (list.size() > before) list.pop_back();
    for (std::int64_t e = 0; e < g.rows[r]; ++e) list.push_back(std::string());
  }
  return list;
}

// Sends a TYPE_STRING output: each request gets its rows of the list (all of it without
// batching), if it asked for the output. Returns whether a copy into device memory is queued.
bool instance_state::send_strings(const output_decl& o, const c10::List<std::string>& list,
                                  group& g, std::vector<std::string>& keep) {
  const std::string& name = model_->spec().name;
  const bool batching = model_->MaxBatchSize() > 0;
  bool cuda = false;
  std::size_t begin = 0;
  for (std::size_t r = 0; r < g.requests.size(); ++r) {
    const std::size_t end = batching ? begin + static_cast<std::size_t>(g.rows[r]) : list.size();
    auto*& response = g.responses[r];
    const bool wanted = response != nullptr && requested(g.requests[r], o.name);
    const std::size_t first = begin;
    begin = end;
    if (!wanted) continue;
    const std::int64_t shape = static_cast<std::int64_t>(end - first);
    keep.push_back(write_strings(name, o.name, list, first, end));
    const std::string& bytes = keep.back();
    TRITONBACKEND_Output* output = nullptr;
    void* buffer = nullptr;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    std::int64_t id = 0;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(response, &output, o.name.c_str(),
                                                           TRITONSERVER_TYPE_BYTES, &shape, 1);
    if (err == nullptr) err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes.size(), &type, &id);
    if (err == nullptr) {
      bool used = false;
      err = tb::CopyBuffer("string output", TRITONSERVER_MEMORY_CPU, 0, type, id, bytes.size(),
                           bytes.data(), buffer, copy_stream(), &used);
      cuda = cuda || used;
    }
    if (err != nullptr) RESPOND_AND_SET_NULL_IF_ERROR(&response, err);
  }
  return cuda;
}

bool instance_state::requested(TRITONBACKEND_Request* request, const std::string& output) {
  std::uint32_t n = 0;
  if (!succeeded(TRITONBACKEND_RequestOutputCount(request, &n))) return true;
  for (std::uint32_t i = 0; i < n; ++i) {
    const char* o = nullptr;
    if (succeeded(TRITONBACKEND_RequestOutputName(request, i, &o)) && output == o) return true;
  }
  return false;
}

// One request alone, each input one buffer in host memory or on the instance's GPU, every
// output a tensor: served without the collector and the responder. A CPU instance reads the
// request's buffers in place. A GPU instance stages its host inputs through one pinned buffer
// and one copy to the GPU on the run stream, and copies each output on the same stream into
// the response's buffer (through a pinned buffer where that is pageable host memory); the
// host waits once, for all of it. Returns false, having done nothing, when the request does
// not fit (an input in several buffers or on another device, an optional input left out, a
// byte size that does not match its shape): run_group then takes it, and says what is wrong.
bool instance_state::run_single(group& g) {
  if (!single_ || g.requests.size() != 1 || g.responses[0] == nullptr) return false;
  const std::string& name = model_->spec().name;
  TRITONBACKEND_Request* request = g.requests[0];
  const bool batching = model_->MaxBatchSize() > 0;
  // A GPU instance with its run stream (and so in_flight_) stages host bytes; without one
  // (a CPU instance) the runner reads host memory as it is.
  const bool staged = device_.is_cuda() && one_stream();
  const auto aligned = [](std::size_t n) { return (n + 255) / 256 * 256; };
  struct in_piece {
    const input_decl* decl;
    const void* data;
    std::size_t bytes;
    c10::SmallVector<std::int64_t, 6> shape;
    bool host;            // in host memory
    std::size_t offset;   // in the staging buffers, where staged
  };
  c10::SmallVector<in_piece, 8> pieces;
  std::size_t host_bytes = 0;
  for (const auto& b : inputs_) {
    const input_decl& d = *b.decl;
    TRITONBACKEND_Input* input = nullptr;
    const std::int64_t* dims = nullptr;
    std::uint32_t rank = 0;
    std::uint64_t bytes = 0;
    std::uint32_t buffers = 0;
    if (!succeeded(TRITONBACKEND_RequestInput(request, d.name.c_str(), &input)) ||
        !succeeded(TRITONBACKEND_InputPropertiesForHostPolicy(
            input, HostPolicyName().c_str(), nullptr, nullptr, &dims, &rank, &bytes, &buffers)) ||
        buffers != 1) {
      return false;
    }
    const void* data = nullptr;
    std::uint64_t size = 0;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    std::int64_t id = 0;
    if (!succeeded(TRITONBACKEND_InputBufferForHostPolicy(input, HostPolicyName().c_str(), 0,
                                                          &data, &size, &type, &id))) {
      return false;
    }
    in_piece p{&d, data, size, {dims, dims + rank}, type != TRITONSERVER_MEMORY_GPU, 0};
    if (batching && !p.shape.empty()) p.shape[0] = g.batch;
    std::int64_t elements = 1;
    for (const auto n : p.shape) elements *= n;
    if (static_cast<std::uint64_t>(elements) * c10::elementSize(*d.dtype) != size) return false;
    if (!p.host && !(device_.is_cuda() && id == device_.index())) return false;
    if (p.host && staged) {
      p.offset = host_bytes;
      host_bytes += aligned(size);
      if (host_bytes > max_staging_bytes) return false;  // Triton's pinned pool's to stage
    }
    pieces.push_back(std::move(p));
  }

  // From here on the request is this path's. Work queued on the copy stream is waited for
  // however the run ends: the request's and the response's buffers, and the model's outputs
  // (declared first, so that they go after the wait), go after it.
  std::vector<c10::IValue> outputs;
  std::vector<at::Tensor> out_tensors;
  struct queued_work {
    instance_state* self;
    bool pending;
    ~queued_work() {
      if (pending) self->synchronize_quietly();
    }
  } queued{this, staged};
  [[maybe_unused]] char* device_in = nullptr;
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  // A GPU instance's request takes a slot: its staging buffers and events are this request's
  // until it is answered, which may be after execute() returns (see in_flight).
  request_slot* slot = staged ? &in_flight_->acquire() : nullptr;
  if (slot != nullptr) {
    slot->after_wait.clear();
    slot->keep.clear();
  }
  if (host_bytes > 0) {
    char* host_in = slot->host_in.reserve(host_bytes, name);
    if (slot->device_in.nbytes() < host_bytes) {
      const std::size_t grown = std::min(max_staging_bytes,
                                         std::max(host_bytes, 2 * slot->device_in.nbytes()));
      slot->device_in = at::Tensor();
      slot->device_in = at::empty({static_cast<std::int64_t>(grown)},
                                  at::TensorOptions().dtype(at::kByte).device(device_));
    }
    device_in = static_cast<char*>(slot->device_in.data_ptr());
    for (const auto& p : pieces) {
      if (p.host && p.bytes > 0) std::memcpy(host_in + p.offset, p.data, p.bytes);
    }
    cuda::check(cudaMemcpyAsync(device_in, host_in, host_bytes, cudaMemcpyHostToDevice,
                                run_stream_.get()),
                name, "copying a request's inputs to the GPU");
  }
#endif
  std::vector<c10::IValue> values;
  values.reserve(pieces.size());
  for (const auto& p : pieces) {
    const c10::Device where = p.host && !staged ? c10::Device(c10::kCPU) : device_;
    const void* data = p.host && staged ? device_in + p.offset : p.data;
    values.emplace_back(over_buffer(data, p.bytes, p.shape, *p.decl->dtype, where));
  }

  g.compute_start = now_ns();
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  if (slot != nullptr) mark_run(slot->began.get());
#endif
  outputs = run_model(std::move(values));
  out_tensors = checked_outputs(g, outputs);
  wait_for_other_gpus(out_tensors);
  [[maybe_unused]] std::uint64_t launched = 0;
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  if (slot != nullptr) {
    mark_run(slot->ended.get());
    launched = now_ns();
  }
#endif
  if (!staged) {
    wait_for_device();
    g.compute_end = now_ns();
  }

  // The outputs, each into the response's buffer: copies from the GPU go on the run stream;
  // copies between host buffers wait until the device work before them is done (an output
  // in host memory may still be written by a copy the model queued).
  c10::SmallVector<host_copy, 8> after_wait;
  std::size_t staged_out = 0;
  bool host_output = false;  // an output the model made in host memory
  for (auto& t : out_tensors) {
    if (!t.defined()) continue;
    if (t.is_cuda() && !staged) t = t.to(c10::kCPU);  // no stream of ours to copy on
    if (t.is_cuda() && staged_out + aligned(t.nbytes()) <= max_staging_bytes) {
      staged_out += aligned(t.nbytes());
    }
    host_output = host_output || !t.is_cuda();
  }
  [[maybe_unused]] char* host_out = nullptr;
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  if (staged_out > 0) host_out = slot->host_out.reserve(staged_out, name);
#endif
  [[maybe_unused]] std::size_t offset = 0;
  bool other_stream = false;  // a copy CopyBuffer queued on copy_stream()
  for (std::size_t i = 0; i < model_->outputs().size(); ++i) {
    const output_decl& o = model_->outputs()[i];
    if (!requested(request, o.name)) continue;
    const at::Tensor& t = out_tensors[i];
    TRITONBACKEND_Output* output = nullptr;
    check_triton(TRITONBACKEND_ResponseOutput(g.responses[0], &output, o.name.c_str(),
                                              triton_type(t.scalar_type()), t.sizes().data(),
                                              static_cast<std::uint32_t>(t.dim())),
                 name, detail::concat("output '", o.name, "'"), errc::run_failed);
    const std::size_t bytes = t.nbytes();
    if (bytes == 0) continue;
    const auto from_type = t.is_cuda() ? TRITONSERVER_MEMORY_GPU : TRITONSERVER_MEMORY_CPU;
    const std::int64_t from_id = t.is_cuda() ? t.device().index() : 0;
    void* buffer = nullptr;
    TRITONSERVER_MemoryType type = from_type;
    std::int64_t id = from_id;
    check_triton(TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &type, &id), name,
                 detail::concat("output '", o.name, "'"), errc::run_failed);
    const void* data = t.data_ptr();
    if (from_type != TRITONSERVER_MEMORY_GPU && type != TRITONSERVER_MEMORY_GPU) {
      after_wait.push_back({buffer, data, bytes});
      continue;
    }
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    if (from_type == TRITONSERVER_MEMORY_GPU && type == TRITONSERVER_MEMORY_CPU &&
        offset + aligned(bytes) <= staged_out) {
      char* stage = host_out + offset;
      offset += aligned(bytes);
      cuda::check(cudaMemcpyAsync(stage, data, bytes, cudaMemcpyDeviceToHost, run_stream_.get()),
                  name, detail::concat("copying output '", o.name, "' from the GPU"));
      after_wait.push_back({buffer, stage, bytes});
      continue;
    }
#endif
    bool cuda_used = false;
    queued.pending = true;
    check_triton(tb::CopyBuffer(o.name, from_type, from_id, type, id, bytes, data, buffer,
                                copy_stream(), &cuda_used),
                 name, detail::concat("output '", o.name, "'"), errc::run_failed);
    other_stream = other_stream || cuda_used;
  }
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  // Answered later, by in_flight_'s thread, once the device is done: execute() goes on to
  // the next request meanwhile. (With ENABLE_CACHE_CLEANING the cache is emptied after the
  // outputs go, so such a model's requests are answered here.)
  // A model's output in host memory is its own until the copy (the next run may write it),
  // so such a request is answered here too.
  if (slot != nullptr && !model_->cache_cleaning() && !host_output) {
    cuda::check(cudaEventRecord(slot->done.get(), run_stream_.get()), name, "cudaEventRecord");
    slot->request = request;
    slot->response = g.responses[0];
    slot->exec_start = g.exec_start;
    slot->compute_start = g.compute_start;
    slot->launched = launched;
    slot->batch = g.batch;
    slot->after_wait = std::move(after_wait);
    slot->keep = std::move(out_tensors);  // what the copies out read
    in_flight_->hand_off(*slot);
    queued.pending = false;
    g.responses[0] = nullptr;
    g.handed_off = true;
    g.ran = true;
    return true;
  }
#endif
  if (staged || other_stream) synchronize();
  queued.pending = false;
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
  if (slot != nullptr) {
    g.compute_end = timed_compute_end(g.compute_start, launched, slot->began.get(),
                                      slot->ended.get());
  }
#endif
  for (const auto& c : after_wait) std::memcpy(c.to, c.from, c.bytes);
  g.ran = true;
  return true;
}

#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
void instance_state::answer(request_slot& s) noexcept {
  auto* request = static_cast<TRITONBACKEND_Request*>(s.request);
  auto* response = static_cast<TRITONBACKEND_Response*>(s.response);
  const cudaError_t waited = cudaEventSynchronize(s.done.get());
  const bool ok = waited == cudaSuccess;
  std::uint64_t compute_end = s.launched;
  if (ok) {
    compute_end = timed_compute_end(s.compute_start, s.launched, s.began.get(), s.ended.get());
    for (const auto& c : s.after_wait) std::memcpy(c.to, c.from, c.bytes);
  } else {
    (void)cudaGetLastError();
    // A device error surfaced after execute() returned: this request fails with it.
    TRITONSERVER_Error* err = call_guarded(model_->spec().name, errc::cuda_error, [&] {
      throw error(errc::cuda_error, model_->spec().name,
                  detail::concat("waiting for the model's run and its copies: ",
                                 cudaGetErrorString(waited)));
    });
    RESPOND_AND_SET_NULL_IF_ERROR(&response, err);
  }
  s.after_wait.clear();
  s.keep.clear();
  const std::uint64_t exec_end = now_ns();
  LOG_IF_ERROR(TRITONBACKEND_ModelInstanceReportStatistics(TritonModelInstance(), request, ok,
                                                           s.exec_start, s.compute_start,
                                                           compute_end, exec_end),
               "torchloom: failed to report statistics");
  if (ok) {
    LOG_IF_ERROR(TRITONBACKEND_ModelInstanceReportBatchStatistics(
                     TritonModelInstance(), static_cast<std::uint64_t>(s.batch), s.exec_start,
                     s.compute_start, compute_end, exec_end),
                 "torchloom: failed to report batch statistics");
  }
  if (response != nullptr) {
    LOG_IF_ERROR(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                                            nullptr),
                 "torchloom: failed to send a response");
  }
  LOG_IF_ERROR(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL),
               "torchloom: failed to release a request");
  s.request = nullptr;
  s.response = nullptr;
}
#endif

// The tensors the responses are made from, one per configured output (undefined for a string
// output), each checked against the configuration and made contiguous. Throws run_failed for
// the first that does not fit: a bad output fails the whole batch.
std::vector<at::Tensor> instance_state::checked_outputs(const group& g,
                                                        const std::vector<c10::IValue>& outputs) const {
  const std::string& name = model_->spec().name;
  const bool batching = model_->MaxBatchSize() > 0;
  std::vector<at::Tensor> out_tensors(model_->outputs().size());
  for (std::size_t i = 0; i < model_->outputs().size(); ++i) {
    const output_decl& o = model_->outputs()[i];
    const std::size_t index = output_index_[i];
    if (index >= outputs.size()) {
      throw error(errc::run_failed, name,
                  detail::concat("the model configuration's ", o.state ? "state output '"
                                                                     : "output '",
                                 o.name, "' is output ", index, " of the model, but it returned ",
                                 outputs.size()));
    }
    const c10::IValue& v = outputs[index];
    if (o.is_string) {
      if (!v.isList() || !v.type()->isSubtypeOf(*c10::ListType::ofStrings())) {
        throw error(errc::run_failed, name,
                    detail::concat("output '", o.name, "' is TYPE_STRING, but the model returned ",
                                   detail::describe_ivalue(v), " for it, not a List[str]"));
      }
      const auto n = static_cast<std::int64_t>(v.toListRef().size());
      if (batching && n != g.batch) {
        throw error(errc::run_failed, name,
                    detail::concat("output '", o.name, "' has ", n, " strings; a batch of ",
                                   g.batch, " needs one per row"));
      }
      continue;
    }
    if (!v.isTensor()) {
      throw error(errc::run_failed, name,
                  detail::concat("output '", o.name, "' is ", detail::describe_ivalue(v),
                                 ", not a tensor"));
    }
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      throw error(errc::run_failed, name,
                  detail::concat("output '", o.name, "' is an undefined tensor"));
    }
    if (t.layout() != c10::kStrided || !(t.device().is_cpu() || t.device().is_cuda())) {
      throw error(errc::run_failed, name,
                  detail::concat("output '", o.name, "' is a ", t.layout(), " tensor on ",
                                 t.device(), "; Triton takes dense tensors in CPU or CUDA "
                                 "memory"));
    }
    if (triton_type(t.scalar_type()) == TRITONSERVER_TYPE_INVALID) {
      throw error(errc::run_failed, name,
                  detail::concat("output '", o.name, "' is ", t.scalar_type(),
                                 ", which Triton has no data type for"));
    }
    if (o.dtype && t.scalar_type() != *o.dtype) {
      throw error(errc::run_failed, name,
                  detail::concat("output '", o.name, "' is ", t.scalar_type(),
                                 " but the model configuration declares ", *o.dtype));
    }
    if (batching && !o.batch && (t.dim() == 0 || t.size(0) != g.batch)) {
      throw error(errc::run_failed, name,
                  detail::concat("output '", o.name, "' has shape ", t.sizes(), "; a batch of ",
                                 g.batch, " needs ", g.batch, " rows in its first dimension"));
    }
    out_tensors[i] = t.contiguous();
  }
  return out_tensors;
}

void instance_state::run_group(group& g) {
  const std::string& name = model_->spec().name;
  const bool batching = model_->MaxBatchSize() > 0;
  const auto count = static_cast<std::uint32_t>(g.requests.size());
  auto* requests = g.requests.data();
  auto& responses = g.responses;
  const auto memory = input_memory();

#if TORCHLOOM_HAS_CUDA
  // Everything torch does for this group (the run, making outputs contiguous) goes on the
  // instance's run stream, which caller_stream and the fenced policies take as the caller's.
  // Not on Triton's stream of the instance: a new instance gets a new one, and torch keeps a
  // cuBLAS workspace per stream it ran a GEMM on for the life of the process, so every model
  // load would add workspaces. The run stream is leased (cuda::stream_lease) and goes back
  // when the instance goes, for the next. The collector's and the responder's copies go on
  // it too (copy_stream()): before and after the run, with no event to order them.
  std::optional<c10::cuda::CUDAStreamGuard> on_stream;
  if (run_stream_) {
    on_stream.emplace(c10::cuda::getStreamFromExternal(run_stream_.get(), device_.index()));
  }
#endif

  if (run_single(g)) return;

  // Gather. The collector lives as long as the run: its buffers back the input tensors, and
  // an output may be one of them. The responder is made once the outputs are checked; the
  // strings it sends live as long.
  tb::BackendInputCollector collector(requests, count, &responses,
                                      model_->TritonMemoryManager(),
                                      model_->EnablePinnedInput(), copy_stream(), nullptr,
                                      nullptr, 0, HostPolicyName().c_str());
  std::optional<tb::BackendOutputResponder> responder;
  std::vector<std::string> serialized;  // string outputs, until their copies are done
  std::vector<c10::IValue> outputs;     // the model's, flattened
  std::vector<at::Tensor> out_tensors;  // the tensors the responder copies from
  // The work queued on copy_stream() (the collector's copies; on the run stream also the run
  // and the responder's copies) until the host waits for it: a run that throws on the way
  // lets the collector finish what it started and waits for that stream before the buffers
  // above go (the collector's, the responder's, the strings, an output on another GPU, whose
  // allocator knows nothing of the copy) and before the requests are released.
  struct queued_work {
    instance_state* self;
    tb::BackendInputCollector* collector;
    bool pending = false;
    bool gathered = false;  // the collector's Finalize() has run
    ~queued_work() {
      if (!gathered) {
        try {
          collector->Finalize();  // its copies still in flight on worker threads
        } catch (...) {
          (void)0;  // the run's own error is the one to report
        }
      }
      if (pending) self->synchronize_quietly();
    }
  } queued{this, &collector, copy_stream() != nullptr};
  bool host_inputs = false;  // an input the run reads from host memory
  std::vector<c10::IValue> values;
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& b : inputs_) {
    const input_decl& d = *b.decl;
    std::vector<std::int64_t> shape;
    const char* buffer = nullptr;
    std::size_t bytes = 0;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    std::int64_t memory_id = 0;
    if (d.kind == input_kind::batch) {
      check_triton(collector.BatchInputShape(*d.batch, &shape), name,
                   detail::concat("batch input '", d.name, "'"), errc::run_failed);
      check_triton(collector.ProcessBatchInput(*d.batch, nullptr, 0, memory, &buffer, &bytes,
                                               &memory_type, &memory_id),
                   name, detail::concat("batch input '", d.name, "'"), errc::run_failed);
    } else {
      // The first request that still has a response and this input gives the shape.
      TRITONBACKEND_Input* input = nullptr;
      for (std::uint32_t r = 0; r < count && input == nullptr; ++r) {
        if (responses[r] == nullptr) continue;
        if (!succeeded(TRITONBACKEND_RequestInput(requests[r], d.name.c_str(), &input))) {
          input = nullptr;
        }
      }
      if (input == nullptr) break;  // a trailing optional input, left out by this batch
      if (d.kind == input_kind::string) {
        values.emplace_back(gather_strings(d, g));
        continue;
      }
      const std::int64_t* dims = nullptr;
      std::uint32_t rank = 0;
      check_triton(TRITONBACKEND_InputProperties(input, nullptr, nullptr, &dims, &rank, nullptr,
                                                 nullptr),
                   name, detail::concat("input '", d.name, "'"), errc::run_failed);
      shape.assign(dims, dims + rank);
      if (batching && !shape.empty()) shape[0] = g.batch;
      check_triton(collector.ProcessTensor(d.name.c_str(), nullptr, 0, memory, &buffer, &bytes,
                                           &memory_type, &memory_id),
                   name, detail::concat("input '", d.name, "'"), errc::run_failed);
      if (d.kind == input_kind::ragged) {
        shape = {static_cast<std::int64_t>(bytes / c10::elementSize(*d.dtype))};
      }
    }
    host_inputs = host_inputs || memory_type != TRITONSERVER_MEMORY_GPU;
    at::Tensor t = over_buffer(
        buffer, bytes, shape, *d.dtype,
        memory_type == TRITONSERVER_MEMORY_GPU
            ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(memory_id))
            : c10::Device(c10::kCPU));
    if (dict_) {
      dict.insert(d.name, t);
    } else {
      values.emplace_back(std::move(t));
    }
  }
  // The collector's copies: a run that reads only device memory follows them on the run
  // stream, and the host waits for them later, with the responder's (one host wait a run, not
  // two); one that reads host memory, or runs on another stream, waits for them now.
  queued.gathered = true;
  if (collector.Finalize() && (host_inputs || !one_stream())) synchronize();
  // A request the collector could not gather has its error; the others run. Its rows stay
  // in the batch (the responder skips them by its shape).
  if (std::none_of(responses.begin(), responses.end(), [](auto* r) { return r != nullptr; })) {
    return;
  }

  g.compute_start = now_ns();
  // On the GPU the compute end is timed by events, not by a host wait for the run: the
  // responder's copies go out right behind it, and the host waits once, for them.
  const bool timed = one_stream();
  if (timed) mark_run(true);
  if (dict_) values = {c10::IValue(std::move(dict))};
  outputs = run_model(std::move(values));
  // Each output is checked before any is sent: a bad one fails the whole batch.
  out_tensors = checked_outputs(g, outputs);
  wait_for_other_gpus(out_tensors);
  std::uint64_t launched = 0;
  if (timed) {
    mark_run(false);
    launched = now_ns();
  } else {
    wait_for_device();
    g.compute_end = now_ns();
  }

  responder.emplace(requests, count, &responses, model_->TritonMemoryManager(), batching,
                    model_->EnablePinnedOutput(), copy_stream());
  std::vector<TRITONBACKEND_State*> states;
  serialized.reserve(count * model_->outputs().size());
  bool copies = false;
  for (std::size_t i = 0; i < model_->outputs().size(); ++i) {
    const output_decl& o = model_->outputs()[i];
    if (o.is_string) {
      copies = send_strings(o, outputs[output_index_[i]].to<c10::List<std::string>>(), g,
                            serialized) ||
               copies;
      continue;
    }
    const at::Tensor& t = out_tensors[i];
    std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
    const auto memory_type = t.is_cuda() ? TRITONSERVER_MEMORY_GPU : TRITONSERVER_MEMORY_CPU;
    const std::int64_t memory_id = t.is_cuda() ? t.device().index() : 0;
    const auto* data = static_cast<const char*>(t.data_ptr());
    if (o.state) {
      auto s = responder->ProcessStateTensor(o.name, triton_type(t.scalar_type()), shape, data,
                                            memory_type, memory_id);
      states.insert(states.end(), s.begin(), s.end());
    } else if (o.batch) {
      responder->ProcessBatchOutput(o.name, *o.batch, data, memory_type, memory_id);
    } else {
      responder->ProcessTensor(o.name, triton_type(t.scalar_type()), shape, data, memory_type,
                              memory_id);
    }
  }
  copies = responder->Finalize() || copies;
  // One host wait for what is still queued: the copies and, on the GPU, the run before them
  // on the same stream (an idle stream by now where the responder's Finalize() waited for
  // its copies through pinned memory: it says so by returning false, as it does when it
  // queued nothing, so the wait stays).
  if (copies || timed) synchronize();
  queued.pending = false;
  if (timed) g.compute_end = timed_compute_end(g.compute_start, launched);
  for (auto* s : states) {
    if (TRITONSERVER_Error* err = TRITONBACKEND_StateUpdate(s)) {
      RESPOND_ALL_AND_SET_NULL_IF_ERROR(responses, count, err);
    }
  }
  g.ran = true;
}

void instance_state::execute(TRITONBACKEND_Request** requests, std::uint32_t count) {
  const std::uint64_t exec_start = now_ns();
  const std::string& name = model_->spec().name;
  std::vector<TRITONBACKEND_Response*> responses(count, nullptr);
  for (std::uint32_t r = 0; r < count; ++r) {
    if (!succeeded(TRITONBACKEND_ResponseNew(&responses[r], requests[r]))) responses[r] = nullptr;
  }

  // Each request on its own against what the runner declares: a bad one gets its own error
  // and leaves the batch. A model without a batch dimension runs each request on its own.
  const bool batching = model_->MaxBatchSize() > 0;
  std::vector<group> groups;
  for (std::uint32_t r = 0; r < count; ++r) {
    if (responses[r] == nullptr) continue;
    std::int64_t rows = 1;
    if (TRITONSERVER_Error* err =
            call_guarded(name, errc::bad_input, [&] { rows = check_request(requests[r]); })) {
      RESPOND_AND_SET_NULL_IF_ERROR(&responses[r], err);
      continue;
    }
    if (groups.empty() || !batching) {
      groups.emplace_back();
      groups.back().exec_start = exec_start;
    }
    groups.back().requests.push_back(requests[r]);
    groups.back().responses.push_back(responses[r]);
    groups.back().index.push_back(r);
    groups.back().rows.push_back(rows);
    groups.back().batch += rows;
  }

  std::vector<char> handed(count, 0);
  for (auto& g : groups) {
    // Whatever escapes the run (a torchloom error, a c10::Error, an asynchronous CUDA error
    // surfacing in a copy) fails the requests of this group that have no answer yet.
    if (TRITONSERVER_Error* err = call_guarded(name, errc::run_failed, [&] { run_group(g); })) {
      const std::string msg = message_of(err);
      const auto code = TRITONSERVER_ErrorCode(err);
      TRITONSERVER_ErrorDelete(err);
      for (auto*& r : g.responses) {
        if (r == nullptr) continue;
        RESPOND_AND_SET_NULL_IF_ERROR(&r, TRITONSERVER_ErrorNew(code, msg.c_str()));
      }
      g.ran = false;
    }
    for (std::size_t i = 0; i < g.index.size(); ++i) responses[g.index[i]] = g.responses[i];
    if (g.handed_off) {
      // in_flight_ answers, counts and releases it (it may have done so already): hands off.
      for (const auto r : g.index) handed[r] = 1;
      continue;
    }
    if (!g.ran) {
      for (std::size_t i = 0; i < g.index.size(); ++i) {
        auto*& r = responses[g.index[i]];
        if (r == nullptr) continue;  // already answered with its error
        RESPOND_AND_SET_NULL_IF_ERROR(
            &r, TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                      detail::concat("torchloom: model '", name,
                                                     "': the batch was not run").c_str()));
      }
    }
  }

  // The execution ends before the responses go: sending one runs the client's completion
  // callback on this thread, which is not the model's time (Triton's own backends take their
  // end there too, so that their statistics compare).
  const std::uint64_t exec_end = now_ns();
  std::vector<bool> ok(count, false);
  for (std::uint32_t r = 0; r < count; ++r) {
    if (responses[r] == nullptr) continue;
    ok[r] = true;
    LOG_IF_ERROR(TRITONBACKEND_ResponseSend(responses[r], TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                                            nullptr),
                 "torchloom: failed to send a response");
  }
  // The outputs are gone with run_group's scope: what the caching allocator holds now is
  // free.
  if (model_->cache_cleaning()) empty_cache();

  std::vector<std::uint64_t> compute_start(count, exec_start);
  std::vector<std::uint64_t> compute_end(count, exec_start);
  for (const auto& g : groups) {
    for (const auto r : g.index) {
      if (g.handed_off) continue;
      compute_start[r] = g.compute_start ? g.compute_start : exec_start;
      compute_end[r] = g.compute_end ? g.compute_end : compute_start[r];
    }
  }
  for (std::uint32_t r = 0; r < count; ++r) {
    if (handed[r] != 0) continue;
    LOG_IF_ERROR(TRITONBACKEND_ModelInstanceReportStatistics(TritonModelInstance(), requests[r],
                                                             ok[r], exec_start, compute_start[r],
                                                             compute_end[r], exec_end),
                 "torchloom: failed to report statistics");
  }
  for (const auto& g : groups) {
    if (!g.ran || g.handed_off) continue;  // no execution to count here
    LOG_IF_ERROR(TRITONBACKEND_ModelInstanceReportBatchStatistics(
                     TritonModelInstance(), static_cast<std::uint64_t>(g.batch), exec_start,
                     g.compute_start, g.compute_end, exec_end),
                 "torchloom: failed to report batch statistics");
  }
  for (std::uint32_t r = 0; r < count; ++r) {
    if (handed[r] != 0) continue;
    LOG_IF_ERROR(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL),
                 "torchloom: failed to release a request");
  }
}

}  // namespace torchloom::triton_backend

namespace tlb = torchloom::triton_backend;

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  std::uint32_t major = 0;
  std::uint32_t minor = 0;
  RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR) {
    return TRITONSERVER_ErrorNew(
        TRITONSERVER_ERROR_UNSUPPORTED,
        torchloom::detail::concat("torchloom backend: built for backend API ",
                                  TRITONBACKEND_API_VERSION_MAJOR, ".",
                                  TRITONBACKEND_API_VERSION_MINOR, ", but Triton has ", major,
                                  ".", minor)
            .c_str());
  }
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name = "";
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  std::unique_ptr<tlb::model_state> state;
  RETURN_IF_ERROR(tlb::call_guarded(name, torchloom::errc::load_failed, [&] {
    state = std::make_unique<tlb::model_state>(model);
  }));
  RETURN_IF_ERROR(TRITONBACKEND_ModelSetState(model, state.get()));
  state.release();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  delete static_cast<tlb::model_state*>(state);
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  void* model_state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &model_state));
  auto* ms = static_cast<tlb::model_state*>(model_state);
  std::unique_ptr<tlb::instance_state> state;
  RETURN_IF_ERROR(tlb::call_guarded(ms->spec().name, torchloom::errc::load_failed, [&] {
    state = std::make_unique<tlb::instance_state>(ms, instance);
  }));
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceSetState(instance, state.get()));
  state.release();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  delete static_cast<tlb::instance_state*>(state);
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const std::uint32_t request_count) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  auto* is = static_cast<tlb::instance_state*>(state);
  // execute() answers and releases every request; nothing it throws reaches the core.
  if (TRITONSERVER_Error* err = tlb::call_guarded(is->model()->spec().name,
                                                  torchloom::errc::run_failed,
                                                  [&] { is->execute(requests, request_count); })) {
    LOG_MESSAGE(TRITONSERVER_LOG_ERROR, tlb::message_of(err).c_str());
    TRITONSERVER_ErrorDelete(err);
  }
  return nullptr;
}

}  // extern "C"
