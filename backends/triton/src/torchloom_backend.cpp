// libtriton_torchloom.so: a Triton Inference Server backend that serves TorchScript and
// AOTInductor models through torchloom's model_runner.
//
// A model directory's config.pbtxt is read by torchloom (model_spec::from_directory), so a
// repository written for Triton's PyTorch backend moves over by setting
// `backend: "torchloom"`. The runner's policies come from parameters the backend reserves
// (TORCHLOOM_STREAM, TORCHLOOM_RESIDENCY, TORCHLOOM_HOOK, TORCHLOOM_DEVICE), the loader from
// the model file's type; torchloom::with_runner_type maps that choice to one of the runner
// types compiled into this library. Each model instance owns one runner.
#include <torchloom/policy_choice.hpp>
#include <torchloom/torchloom.hpp>

#include "triton/backend/backend_common.h"
#include "triton/backend/backend_input_collector.h"
#include "triton/backend/backend_model.h"
#include "triton/backend/backend_model_instance.h"
#include "triton/backend/backend_output_responder.h"
#include "triton/core/tritonbackend.h"

#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <ATen/Functions.h>

#include <chrono>
#include <cstdint>
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

//! The parameters this backend reads itself; every other parameter is a runner option.
const std::vector<std::string> backend_keys = {"TORCHLOOM_STREAM", "TORCHLOOM_RESIDENCY",
                                               "TORCHLOOM_HOOK", "TORCHLOOM_DEVICE"};

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

TRITONSERVER_Error_Code triton_code(errc code) {
  switch (code) {
    case errc::invalid_option:
    case errc::bad_input:
      return TRITONSERVER_ERROR_INVALID_ARG;
    case errc::model_not_found:
      return TRITONSERVER_ERROR_NOT_FOUND;
    case errc::unsupported:
      return TRITONSERVER_ERROR_UNSUPPORTED;
    default:
      return TRITONSERVER_ERROR_INTERNAL;
  }
}

// Whether `err` is success; deletes it otherwise (a failed optional lookup).
bool succeeded(TRITONSERVER_Error* err) {
  if (err == nullptr) return true;
  TRITONSERVER_ErrorDelete(err);
  return false;
}

TRITONSERVER_Error* to_triton(const error& e) {
  return TRITONSERVER_ErrorNew(triton_code(e.code()), e.what());
}

// Runs `f`; a torchloom::error (or any other exception) becomes a TRITONSERVER_Error.
template <class F>
TRITONSERVER_Error* guarded(const std::string& model, F&& f) {
  try {
    f();
    return nullptr;
  } catch (const error& e) {
    return to_triton(e);
  } catch (const std::exception& e) {
    return to_triton(error(errc::load_failed, model, e.what()));
  }
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

//! A runner of any policy type, behind one interface.
class any_runner {
 public:
  virtual ~any_runner() = default;
  virtual std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) = 0;
  virtual const input_signature& inputs() const = 0;
};

template <class Runner>
class runner_box final : public any_runner {
 public:
  runner_box(model_spec spec, c10::Device device) : runner_(std::move(spec), device) {}
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) override {
    return runner_.run_tensors(inputs);
  }
  const input_signature& inputs() const override { return runner_.inputs(); }

 private:
  Runner runner_;
};

std::unique_ptr<any_runner> make_runner(const policy_choice& choice, const model_spec& spec,
                                        c10::Device device) {
  return with_runner_type(
      choice,
      [&](auto type) -> std::unique_ptr<any_runner> {
        using runner = typename decltype(type)::type;
        return std::make_unique<runner_box<runner>>(spec, device);
      },
      spec.name);
}

//! Which config.pbtxt input feeds which argument of the model, and which model output each
//! config output is: by name, then by the PyTorch backend's `NAME__<index>`, then by
//! position (the rule the runner applies to the declared inputs).
std::optional<std::size_t> index_suffix(const std::string& name) {
  return torchloom::detail::runner_core::index_suffix(name);  // the runner's own rule
}

struct io_binding {
  std::string name;                    // Triton's name
  std::size_t index = 0;               // argument or output position in the model
  std::optional<c10::ScalarType> dtype;  // as config.pbtxt declares it
};

//! The per-model state: the spec read from the repository and the policy choice. A load
//! failure here (a bad key, a bad policy name) leaves the model unavailable with the message.
class model_state : public tb::BackendModel {
 public:
  explicit model_state(TRITONBACKEND_Model* model)
      : tb::BackendModel(model, /*allow_optional=*/true) {
    // The one place where Triton's model directory becomes a torchloom model_spec.
    spec_ = model_spec::from_directory(RepositoryPath(), static_cast<std::int64_t>(Version()),
                                       backend_keys);
    if (!spec_.config) {
      throw error(errc::invalid_option, spec_.name,
                  detail::concat("no config.pbtxt in '", RepositoryPath(), "'"));
    }
    choice_ = choose_policies(spec_);
    // Requests of a ragged batch differ in shape: they cannot be gathered into one tensor.
    triton::common::TritonJson::Value inputs;
    if (ModelConfig().Find("input", &inputs)) {
      for (std::size_t i = 0; i < inputs.ArraySize(); ++i) {
        triton::common::TritonJson::Value input;
        bool ragged = false;
        if (!succeeded(inputs.IndexAsObject(i, &input)) || !input.Find("allow_ragged_batch")) {
          continue;
        }
        if (succeeded(input.MemberAsBool("allow_ragged_batch", &ragged)) && ragged) {
          std::string input_name;
          succeeded(input.MemberAsString("name", &input_name));
          throw error(errc::unsupported, spec_.name,
                      detail::concat("input '", input_name, "' sets allow_ragged_batch, which "
                                     "the torchloom backend does not support"));
        }
      }
    }
    const auto& cfg = *spec_.config;
    for (std::size_t i = 0; i < cfg.outputs.size(); ++i) {
      outputs_.push_back({cfg.outputs[i].name, index_suffix(cfg.outputs[i].name).value_or(i),
                          cfg.outputs[i].dtype});
    }
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
  const std::vector<io_binding>& outputs() const { return outputs_; }
  //! The device for KIND_MODEL instances (TORCHLOOM_DEVICE, default cpu).
  c10::Device model_device() const { return model_device_; }

 private:
  model_spec spec_;
  policy_choice choice_;
  std::vector<io_binding> outputs_;
  c10::Device model_device_{c10::kCPU};
};

//! One model instance: one runner on the instance's device.
class instance_state : public tb::BackendModelInstance {
 public:
  instance_state(model_state* model, TRITONBACKEND_ModelInstance* instance)
      : tb::BackendModelInstance(model, instance), model_(model) {
    switch (Kind()) {
      case TRITONSERVER_INSTANCEGROUPKIND_GPU:
        device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(DeviceId()));
        break;
      case TRITONSERVER_INSTANCEGROUPKIND_MODEL:
        device_ = model->model_device();
        break;
      default:
        device_ = c10::Device(c10::kCPU);
    }
    runner_ = make_runner(model->choice(), model->spec(), device_);
    const auto& sig = runner_->inputs();
    const auto& decls = model->spec().config->inputs;
    for (std::size_t i = 0; i < decls.size(); ++i) {
      std::optional<std::size_t> index;
      for (std::size_t a = 0; a < sig.size() && !index; ++a) {
        if (sig[a].name == decls[i].name) index = a;
      }
      if (!index) index = index_suffix(decls[i].name);
      inputs_.push_back({decls[i].name, index.value_or(i), decls[i].dtype});
    }
    std::sort(inputs_.begin(), inputs_.end(),
              [](const io_binding& a, const io_binding& b) { return a.index < b.index; });
  }

  model_state* model() const { return model_; }

  void execute(TRITONBACKEND_Request** requests, std::uint32_t count);

 private:
  // Runs the model on `inputs`, on Triton's stream where it gives one.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) {
#if TORCHLOOM_HAS_CUDA && defined(TRITON_ENABLE_GPU)
    if (device_.is_cuda() && CudaStream() != nullptr) {
      // caller_stream and the fenced policies take the current stream as the caller's.
      c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(
          static_cast<cudaStream_t>(CudaStream()), device_.index()));
      return runner_->run(inputs);
    }
#endif
    return runner_->run(inputs);
  }

  // The inputs of one request as tensors over Triton's buffers (no copy when the request
  // holds each input in one CPU buffer), in the model's argument order.
  std::vector<at::Tensor> request_views(TRITONBACKEND_Request* request) const;

  // Runs `requests` (all good) as one batch and fills their responses.
  void run_batch(TRITONBACKEND_Request** requests, std::uint32_t count,
                 std::vector<TRITONBACKEND_Response*>& responses, std::int64_t batch);

  model_state* model_;
  c10::Device device_{c10::kCPU};
  std::unique_ptr<any_runner> runner_;
  std::vector<io_binding> inputs_;  // in argument order
};

std::vector<at::Tensor> instance_state::request_views(TRITONBACKEND_Request* request) const {
  const std::string& name = model_->spec().name;
  std::vector<at::Tensor> out;
  bool missing = false;
  for (const auto& b : inputs_) {
    TRITONBACKEND_Input* input = nullptr;
    if (TRITONSERVER_Error* err =
            TRITONBACKEND_RequestInput(request, b.name.c_str(), &input)) {
      TRITONSERVER_ErrorDelete(err);
      missing = true;  // an optional input left out: the runner's check counts them
      continue;
    }
    if (missing) {
      throw error(errc::bad_input, name,
                  detail::concat("input '", b.name, "' is given but an input before it is "
                                 "not; only trailing inputs may be left out"));
    }
    TRITONSERVER_DataType dtype;
    const std::int64_t* shape = nullptr;
    std::uint32_t dims = 0;
    std::uint64_t bytes = 0;
    std::uint32_t buffers = 0;
    if (TRITONSERVER_Error* err = TRITONBACKEND_InputProperties(
            input, nullptr, &dtype, &shape, &dims, &bytes, &buffers)) {
      const std::string msg = TRITONSERVER_ErrorMessage(err);
      TRITONSERVER_ErrorDelete(err);
      throw error(errc::bad_input, name, detail::concat("input '", b.name, "': ", msg));
    }
    const auto scalar = scalar_type(dtype);
    if (!scalar) {
      throw error(errc::bad_input, name,
                  detail::concat("input '", b.name, "' is ", TRITONSERVER_DataTypeString(dtype),
                                 ", which torchloom cannot pass to a model"));
    }
    // Only the metadata is checked here; the data is gathered once for the whole batch.
    out.push_back(at::empty(std::vector<std::int64_t>(shape, shape + dims),
                            at::TensorOptions().dtype(*scalar).device(c10::kMeta)));
  }
  return out;
}

void instance_state::run_batch(TRITONBACKEND_Request** requests, std::uint32_t count,
                               std::vector<TRITONBACKEND_Response*>& responses,
                               std::int64_t batch) {
  const bool batching = model_->MaxBatchSize() > 0;
  tb::BackendInputCollector collector(requests, count, &responses,
                                      model_->TritonMemoryManager(), false, nullptr);
  const std::vector<std::pair<TRITONSERVER_MemoryType, std::int64_t>> cpu = {
      {TRITONSERVER_MEMORY_CPU_PINNED, 0}, {TRITONSERVER_MEMORY_CPU, 0}};
  std::vector<at::Tensor> inputs;
  for (const auto& b : inputs_) {
    TRITONBACKEND_Input* input = nullptr;
    if (TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(requests[0], b.name.c_str(), &input)) {
      TRITONSERVER_ErrorDelete(err);
      break;  // a trailing optional input, left out by every request of this batch
    }
    TRITONSERVER_DataType dtype;
    const std::int64_t* shape = nullptr;
    std::uint32_t dims = 0;
    RESPOND_ALL_AND_SET_NULL_IF_ERROR(responses, count,
                                      TRITONBACKEND_InputProperties(input, nullptr, &dtype,
                                                                    &shape, &dims, nullptr,
                                                                    nullptr));
    if (responses[0] == nullptr) return;
    const char* buffer = nullptr;
    std::size_t bytes = 0;
    TRITONSERVER_MemoryType memory_type;
    std::int64_t memory_id = 0;
    RESPOND_ALL_AND_SET_NULL_IF_ERROR(
        responses, count,
        collector.ProcessTensor(b.name.c_str(), nullptr, 0, cpu, &buffer, &bytes, &memory_type,
                                &memory_id));
    if (responses[0] == nullptr) return;
    std::vector<std::int64_t> full(shape, shape + dims);
    if (batching && !full.empty()) full[0] = batch;
    inputs.push_back(at::from_blob(const_cast<char*>(buffer), full,
                                   at::TensorOptions().dtype(*scalar_type(dtype))));
  }
  collector.Finalize();
  for (auto* r : responses) {
    if (r == nullptr) return;  // gathering failed; those requests have their error
  }

  std::vector<at::Tensor> outputs;
  const std::string& name = model_->spec().name;
  try {
    outputs = run(inputs);
    for (auto& t : outputs) t = t.to(c10::kCPU).contiguous();
    for (const auto& o : model_->outputs()) {
      if (o.index >= outputs.size()) {
        throw error(errc::run_failed, name,
                    detail::concat("config.pbtxt declares output '", o.name, "' (output ",
                                   o.index, "), but the model returned ", outputs.size(),
                                   " tensors"));
      }
      const at::Tensor& t = outputs[o.index];
      if (triton_type(t.scalar_type()) == TRITONSERVER_TYPE_INVALID) {
        throw error(errc::run_failed, name,
                    detail::concat("output '", o.name, "' is ", t.scalar_type(),
                                   ", which Triton has no data type for"));
      }
      if (o.dtype && t.scalar_type() != *o.dtype) {
        throw error(errc::run_failed, name,
                    detail::concat("output '", o.name, "' is ", t.scalar_type(),
                                   " but config.pbtxt declares ", *o.dtype));
      }
      if (batching && (t.dim() == 0 || t.size(0) != batch)) {
        throw error(errc::run_failed, name,
                    detail::concat("output '", o.name, "' has shape ", t.sizes(),
                                   "; a batch of ", batch, " needs ", batch,
                                   " rows in its first dimension"));
      }
    }
  } catch (const error& e) {
    for (auto& r : responses) {
      RESPOND_AND_SET_NULL_IF_ERROR(&r, to_triton(e));
    }
    return;
  }

  tb::BackendOutputResponder responder(requests, count, &responses,
                                       model_->TritonMemoryManager(), batching, false, nullptr);
  for (const auto& o : model_->outputs()) {
    const at::Tensor& t = outputs[o.index];
    std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
    responder.ProcessTensor(o.name, triton_type(t.scalar_type()), shape,
                            static_cast<const char*>(t.data_ptr()), TRITONSERVER_MEMORY_CPU, 0);
  }
  responder.Finalize();
}

void instance_state::execute(TRITONBACKEND_Request** requests, std::uint32_t count) {
  const std::uint64_t exec_start = now_ns();
  std::vector<TRITONBACKEND_Response*> responses(count, nullptr);
  for (std::uint32_t r = 0; r < count; ++r) {
    if (TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&responses[r], requests[r])) {
      TRITONSERVER_ErrorDelete(err);
      responses[r] = nullptr;
    }
  }

  // Each request on its own against what the runner declares: a bad one gets its own error
  // and leaves the batch.
  const bool batching = model_->MaxBatchSize() > 0;
  std::vector<TRITONBACKEND_Request*> good;
  std::vector<TRITONBACKEND_Response*> good_responses;
  std::vector<std::uint32_t> good_index;
  std::int64_t batch = 0;
  const std::string& name = model_->spec().name;
  for (std::uint32_t r = 0; r < count; ++r) {
    if (responses[r] == nullptr) continue;
    try {
      const std::vector<at::Tensor> views = request_views(requests[r]);
      // The runner's own check, on tensors that hold no data.
      (void)detail::check_tensor_inputs(name, runner_->inputs(), views, c10::kMeta);
      batch += batching && !views.empty() && views[0].dim() > 0 ? views[0].size(0) : 1;
    } catch (const error& e) {
      RESPOND_AND_SET_NULL_IF_ERROR(&responses[r], to_triton(e));
      continue;
    } catch (const std::exception& e) {
      RESPOND_AND_SET_NULL_IF_ERROR(&responses[r],
                                    to_triton(error(errc::bad_input, name, e.what())));
      continue;
    }
    good.push_back(requests[r]);
    good_responses.push_back(responses[r]);
    good_index.push_back(r);
  }

  const std::uint64_t compute_start = now_ns();
  if (!good.empty()) {
    if (batching) {
      run_batch(good.data(), static_cast<std::uint32_t>(good.size()), good_responses, batch);
    } else {
      // A model without a batch dimension runs each request on its own.
      for (std::size_t i = 0; i < good.size(); ++i) {
        std::vector<TRITONBACKEND_Response*> one{good_responses[i]};
        run_batch(&good[i], 1, one, 1);
        good_responses[i] = one[0];
      }
    }
  }
  const std::uint64_t compute_end = now_ns();

  std::vector<bool> ok(count, false);
  for (std::size_t i = 0; i < good.size(); ++i) {
    if (good_responses[i] != nullptr) {
      ok[good_index[i]] = true;
      LOG_IF_ERROR(TRITONBACKEND_ResponseSend(good_responses[i],
                                              TRITONSERVER_RESPONSE_COMPLETE_FINAL, nullptr),
                   "torchloom: failed to send a response");
    }
  }
  const std::uint64_t exec_end = now_ns();
  for (std::uint32_t r = 0; r < count; ++r) {
    LOG_IF_ERROR(TRITONBACKEND_ModelInstanceReportStatistics(TritonModelInstance(), requests[r],
                                                             ok[r], exec_start, compute_start,
                                                             compute_end, exec_end),
                 "torchloom: failed to report statistics");
  }
  if (!good.empty()) {
    LOG_IF_ERROR(TRITONBACKEND_ModelInstanceReportBatchStatistics(
                     TritonModelInstance(), static_cast<std::uint64_t>(batch), exec_start,
                     compute_start, compute_end, exec_end),
                 "torchloom: failed to report batch statistics");
  }
  for (std::uint32_t r = 0; r < count; ++r) {
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
  tlb::model_state* state = nullptr;
  RETURN_IF_ERROR(tlb::guarded(name, [&] {
    try {
      state = new tlb::model_state(model);
    } catch (const triton::backend::BackendModelException& e) {
      throw std::runtime_error(e.err_ ? TRITONSERVER_ErrorMessage(e.err_) : "model state");
    }
  }));
  return TRITONBACKEND_ModelSetState(model, state);
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
  tlb::instance_state* state = nullptr;
  RETURN_IF_ERROR(tlb::guarded(ms->spec().name, [&] {
    try {
      state = new tlb::instance_state(ms, instance);
    } catch (const triton::backend::BackendModelInstanceException& e) {
      throw std::runtime_error(e.err_ ? TRITONSERVER_ErrorMessage(e.err_) : "model instance");
    }
  }));
  return TRITONBACKEND_ModelInstanceSetState(instance, state);
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
  static_cast<tlb::instance_state*>(state)->execute(requests, request_count);
  return nullptr;
}

}  // extern "C"
