#pragma once
// An in-process Triton server for the backend's tests and benchmark: starts libtritonserver.so
// on a model repository through Triton's C API (tritonserver.h), sends requests and reads
// model statistics and status. Shared by backends/triton/test and bench/bm_triton.cpp.
#include "in_process_requests.hpp"
#include "triton/core/tritonserver.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace torchloom_triton {

//! Settings of the server.
struct server_options {
  std::vector<std::string> repositories;
  std::string backend_directory;
  bool explicit_models = true;  //!< load models on demand (load()/unload())
  std::vector<std::string> startup_models;  //!< with explicit_models
  bool log_info = false;
};

//! One Triton server in this process (Triton allows one at a time per process).
class server {
 public:
  explicit server(const server_options& o) {
    TRITONSERVER_ServerOptions* opts = nullptr;
    check(TRITONSERVER_ServerOptionsNew(&opts), "ServerOptionsNew");
    std::unique_ptr<TRITONSERVER_ServerOptions, void (*)(TRITONSERVER_ServerOptions*)> guard(
        opts, [](TRITONSERVER_ServerOptions* p) { TRITONSERVER_ServerOptionsDelete(p); });
    for (const auto& r : o.repositories) {
      check(TRITONSERVER_ServerOptionsSetModelRepositoryPath(opts, r.c_str()), "repository");
    }
    check(TRITONSERVER_ServerOptionsSetBackendDirectory(opts, o.backend_directory.c_str()),
          "backend directory");
    check(TRITONSERVER_ServerOptionsSetLogInfo(opts, o.log_info), "log info");
    check(TRITONSERVER_ServerOptionsSetLogWarn(opts, o.log_info), "log warn");
    check(TRITONSERVER_ServerOptionsSetExitOnError(opts, false), "exit on error");
    check(TRITONSERVER_ServerOptionsSetStrictModelConfig(opts, true), "strict config");
    check(TRITONSERVER_ServerOptionsSetExitTimeout(opts, 5), "exit timeout");
    // Triton's options leave the retry count uninitialised: a model that fails to load would
    // be retried an arbitrary number of times.
    check(TRITONSERVER_ServerOptionsSetModelLoadRetryCount(opts, 0), "load retry count");
    if (o.explicit_models) {
      check(TRITONSERVER_ServerOptionsSetModelControlMode(opts,
                                                          TRITONSERVER_MODEL_CONTROL_EXPLICIT),
            "control mode");
      for (const auto& m : o.startup_models) {
        check(TRITONSERVER_ServerOptionsSetStartupModel(opts, m.c_str()), "startup model");
      }
    }
    check(TRITONSERVER_ServerNew(&server_, opts), "ServerNew");
    check(TRITONSERVER_ResponseAllocatorNew(&allocator_, &alloc, &release, nullptr),
          "ResponseAllocatorNew");
  }
  server(const server&) = delete;
  server& operator=(const server&) = delete;
  ~server() {
    TRITONSERVER_ResponseAllocatorDelete(allocator_);
    TRITONSERVER_Error* err = TRITONSERVER_ServerStop(server_);
    if (err) TRITONSERVER_ErrorDelete(err);
    TRITONSERVER_ServerDelete(server_);
  }

  TRITONSERVER_Server* get() const { return server_; }

  //! Loads (or reloads) `model`; returns the error when it does not load.
  std::optional<triton_error> load(const std::string& model) {
    return take(TRITONSERVER_ServerLoadModel(server_, model.c_str()));
  }
  //! Loads (or reloads) `model` with `config_json` (Triton's model configuration as JSON)
  //! instead of the config.pbtxt in its directory, as the load API's "config" parameter does.
  std::optional<triton_error> load_with_config(const std::string& model,
                                               const std::string& config_json) {
    TRITONSERVER_Parameter* p =
        TRITONSERVER_ParameterNew("config", TRITONSERVER_PARAMETER_STRING, config_json.c_str());
    const TRITONSERVER_Parameter* params[] = {p};
    auto err = take(TRITONSERVER_ServerLoadModelWithParameters(server_, model.c_str(), params, 1));
    TRITONSERVER_ParameterDelete(p);
    return err;
  }
  //! Unloads `model` and waits until Triton has let go of it.
  void unload(const std::string& model) {
    check(TRITONSERVER_ServerUnloadModel(server_, model.c_str()), "unload " + model);
    for (int i = 0; i < 6000 && state(model) != "UNAVAILABLE"; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  //! Whether `model` is loaded and ready (false for a model Triton does not know).
  bool ready(const std::string& model) const {
    bool r = false;
    return !take(TRITONSERVER_ServerModelIsReady(server_, model.c_str(), -1, &r)) && r;
  }

  //! The model's entry in Triton's repository index ("state" and "reason"), as JSON text.
  std::string index_entry(const std::string& model) const {
    TRITONSERVER_Message* msg = nullptr;
    check(TRITONSERVER_ServerModelIndex(server_, 0, &msg), "ModelIndex");
    const std::string json = text(msg);
    const std::string key = "\"name\":\"" + model + "\"";
    const auto at = json.find(key);
    if (at == std::string::npos) return {};
    // Up to the next entry: a reason may hold braces of its own.
    const auto begin = json.rfind('{', at);
    const auto end = json.find("},{\"name\":", at);
    return json.substr(begin, end == std::string::npos ? std::string::npos : end - begin + 1);
  }
  //! The model's state in Triton's index ("READY", "UNAVAILABLE", ...), empty if unknown.
  std::string state(const std::string& model) const {
    return field(index_entry(model), "state");
  }
  //! Why the model is unavailable (Triton's model status), empty if it is not.
  std::string reason(const std::string& model) const {
    return field(index_entry(model), "reason");
  }

  //! The model's configuration as Triton's core holds it (what a backend is handed), as JSON.
  std::string model_config(const std::string& model) const {
    TRITONSERVER_Message* msg = nullptr;
    check(TRITONSERVER_ServerModelConfig(server_, model.c_str(), -1, 1, &msg), "model config");
    return text(msg);
  }

  //! The model's statistics as Triton reports them, as JSON text.
  std::string statistics(const std::string& model) const {
    TRITONSERVER_Message* msg = nullptr;
    check(TRITONSERVER_ServerModelStatistics(server_, model.c_str(), -1, &msg), "statistics");
    return text(msg);
  }
  //! One counter of the model's statistics ("inference_count", "execution_count").
  std::uint64_t counter(const std::string& model, std::string_view name) const {
    const std::string json = statistics(model);
    const std::string key = "\"" + std::string(name) + "\":";
    const auto at = json.find(key);
    if (at == std::string::npos) throw triton_failure("no " + key + " in " + json);
    return std::strtoull(json.c_str() + at + key.size(), nullptr, 10);
  }
  //! One duration statistic of the model: `part` is "success", "fail", "queue",
  //! "compute_input", "compute_infer" or "compute_output"; `what` is "count" or "ns".
  std::uint64_t duration(const std::string& model, std::string_view part,
                         std::string_view what) const {
    const std::string json = statistics(model);
    const std::string key = "\"" + std::string(part) + "\":{";
    const auto at = json.find(key);
    if (at == std::string::npos) throw triton_failure("no " + key + " in " + json);
    const std::string inner = "\"" + std::string(what) + "\":";
    const auto end = json.find('}', at);
    const auto field_at = json.find(inner, at);
    if (field_at == std::string::npos || field_at > end) {
      throw triton_failure("no " + inner + " in " + json.substr(at, end - at));
    }
    return std::strtoull(json.c_str() + field_at + inner.size(), nullptr, 10);
  }

  //! Sends one request and waits for its response.
  infer_result infer(const std::string& model, const std::vector<tensor_in>& inputs,
                     const request_options& options = {}) {
    TRITONSERVER_InferenceRequest* req = nullptr;
    check(TRITONSERVER_InferenceRequestNew(&req, server_, model.c_str(), -1), "RequestNew");
    for (const auto& in : inputs) {
      check(TRITONSERVER_InferenceRequestAddInput(req, in.name.c_str(), in.dtype,
                                                  in.shape.data(), in.shape.size()),
            "AddInput");
      const std::size_t pieces = in.pieces == 0 ? 1 : in.pieces;
      const std::size_t piece = in.bytes / pieces;
      for (std::size_t p = 0; p < pieces; ++p) {
        const std::size_t size = p + 1 == pieces ? in.bytes - piece * p : piece;
        check(TRITONSERVER_InferenceRequestAppendInputData(
                  req, in.name.c_str(), static_cast<const char*>(in.data) + piece * p, size,
                  in.memory_type, in.memory_id),
              "AppendInputData");
      }
    }
    if (options.correlation_id != 0) {
      check(TRITONSERVER_InferenceRequestSetCorrelationId(req, options.correlation_id),
            "SetCorrelationId");
    }
    if (options.flags != 0) {
      check(TRITONSERVER_InferenceRequestSetFlags(req, options.flags), "SetFlags");
    }
    for (const auto& o : options.outputs) {
      check(TRITONSERVER_InferenceRequestAddRequestedOutput(req, o.c_str()), "RequestedOutput");
    }
    std::promise<void> released;
    check(TRITONSERVER_InferenceRequestSetReleaseCallback(req, &on_release, &released),
          "SetReleaseCallback");
    std::promise<TRITONSERVER_InferenceResponse*> response;
    check(TRITONSERVER_InferenceRequestSetResponseCallback(
              req, allocator_, const_cast<output_memory*>(options.memory), &on_response,
              &response),
          "SetResponseCallback");
    if (auto err = take(TRITONSERVER_ServerInferAsync(server_, req, nullptr))) {
      TRITONSERVER_InferenceRequestDelete(req);
      return {{}, err};
    }
    TRITONSERVER_InferenceResponse* resp = response.get_future().get();
    released.get_future().wait();
    infer_result result;
    if (auto err = take(TRITONSERVER_InferenceResponseError(resp))) {
      result.error = err;
    } else {
      std::uint32_t n = 0;
      check(TRITONSERVER_InferenceResponseOutputCount(resp, &n), "OutputCount");
      for (std::uint32_t i = 0; i < n; ++i) {
        const char* name = nullptr;
        TRITONSERVER_DataType dtype;
        const std::int64_t* shape = nullptr;
        std::uint64_t dims = 0;
        const void* base = nullptr;
        std::size_t bytes = 0;
        TRITONSERVER_MemoryType mt;
        std::int64_t mid = 0;
        void* userp = nullptr;
        check(TRITONSERVER_InferenceResponseOutput(resp, i, &name, &dtype, &shape, &dims, &base,
                                                   &bytes, &mt, &mid, &userp),
              "ResponseOutput");
        tensor_out out{name, dtype, std::vector<std::int64_t>(shape, shape + dims), {}, mt};
        if (mt == TRITONSERVER_MEMORY_GPU && options.memory && options.memory->to_host) {
          out.data.resize(bytes);
          options.memory->to_host(out.data.data(), base, bytes, mt, mid);
        } else {
          out.data.assign(static_cast<const char*>(base), static_cast<const char*>(base) + bytes);
        }
        result.outputs.push_back(std::move(out));
      }
    }
    TRITONSERVER_InferenceResponseDelete(resp);
    return result;
  }

 private:
  static std::optional<triton_error> take(TRITONSERVER_Error* err) {
    if (err == nullptr) return std::nullopt;
    triton_error e{TRITONSERVER_ErrorCode(err), TRITONSERVER_ErrorMessage(err)};
    TRITONSERVER_ErrorDelete(err);
    return e;
  }
  static std::string text(TRITONSERVER_Message* msg) {
    const char* base = nullptr;
    std::size_t size = 0;
    check(TRITONSERVER_MessageSerializeToJson(msg, &base, &size), "SerializeToJson");
    std::string out(base, size);
    TRITONSERVER_MessageDelete(msg);
    return out;
  }
  // The text of a string field of a flat JSON object, unescaping \" and \\ only.
  static std::string field(const std::string& object, std::string_view name) {
    const std::string key = "\"" + std::string(name) + "\":\"";
    auto at = object.find(key);
    if (at == std::string::npos) return {};
    std::string out;
    for (at += key.size(); at < object.size() && object[at] != '"'; ++at) {
      if (object[at] == '\\' && at + 1 < object.size()) ++at;
      out += object[at];
    }
    return out;
  }
  static TRITONSERVER_Error* alloc(TRITONSERVER_ResponseAllocator*, const char*,
                                   std::size_t size, TRITONSERVER_MemoryType, std::int64_t,
                                   void* userp, void** buffer, void** buffer_userp,
                                   TRITONSERVER_MemoryType* type, std::int64_t* id) {
    const auto* memory = static_cast<const output_memory*>(userp);
    *buffer_userp = userp;
    if (memory && memory->alloc) {
      *buffer = size ? memory->alloc(size, type, id) : nullptr;
      return nullptr;
    }
    *buffer = size ? std::malloc(size) : nullptr;
    *type = TRITONSERVER_MEMORY_CPU;
    *id = 0;
    return nullptr;
  }
  static TRITONSERVER_Error* release(TRITONSERVER_ResponseAllocator*, void* buffer,
                                     void* buffer_userp, std::size_t,
                                     TRITONSERVER_MemoryType type, std::int64_t id) {
    const auto* memory = static_cast<const output_memory*>(buffer_userp);
    if (memory && memory->release) {
      if (buffer) memory->release(buffer, type, id);
      return nullptr;
    }
    std::free(buffer);
    return nullptr;
  }
  static void on_release(TRITONSERVER_InferenceRequest* req, const std::uint32_t, void* p) {
    TRITONSERVER_InferenceRequestDelete(req);
    static_cast<std::promise<void>*>(p)->set_value();
  }
  static void on_response(TRITONSERVER_InferenceResponse* resp, const std::uint32_t,
                          void* p) {
    if (resp != nullptr) {
      static_cast<std::promise<TRITONSERVER_InferenceResponse*>*>(p)->set_value(resp);
    }
  }

  TRITONSERVER_Server* server_ = nullptr;
  TRITONSERVER_ResponseAllocator* allocator_ = nullptr;
};

}  // namespace torchloom_triton
