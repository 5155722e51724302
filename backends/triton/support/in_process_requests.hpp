#pragma once
// What a request to the in-process Triton server (in_process_triton.hpp) and its response
// carry, through Triton's C API (tritonserver.h): inputs, outputs, BYTES tensors in Triton's
// wire format, where outputs go, and the errors. Shared by backends/triton/test and
// bench/bm_triton.cpp.
#include "triton/core/tritonserver.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom_triton {

//! Thrown for a failed Triton call that the caller did not expect to fail.
struct triton_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! Takes ownership of `err`; throws triton_failure naming `what` when it is an error.
inline void check(TRITONSERVER_Error* err, std::string_view what) {
  if (err == nullptr) return;
  std::string msg = std::string(what) + ": " + TRITONSERVER_ErrorCodeString(err) + ": " +
                    TRITONSERVER_ErrorMessage(err);
  TRITONSERVER_ErrorDelete(err);
  throw triton_failure(msg);
}

//! An error Triton returned: its code string ("Invalid argument", ...) and message.
struct triton_error {
  TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_UNKNOWN;
  std::string message;
};

//! One input of a request. `data` must stay valid until infer() returns. `pieces` > 1 hands
//! the data to Triton as that many buffers (the last one takes the remainder), as a client
//! that sends an input in parts does.
struct tensor_in {
  std::string name;
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_FP32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::size_t bytes = 0;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  std::int64_t memory_id = 0;
  std::size_t pieces = 1;
};

//! Triton's wire format of a TYPE_STRING (BYTES) tensor: each element as a 4-byte
//! little-endian length and its bytes.
inline std::string serialize_strings(const std::vector<std::string>& elements) {
  std::string out;
  for (const auto& e : elements) {
    const auto n = static_cast<std::uint32_t>(e.size());
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
    out += e;
  }
  return out;
}

//! The elements of a BYTES tensor in Triton's wire format; throws on a malformed buffer.
inline std::vector<std::string> deserialize_strings(const char* data, std::size_t bytes) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < bytes) {
    if (bytes - at < 4) throw std::runtime_error("truncated string length");
    std::uint32_t n = 0;
    for (int b = 0; b < 4; ++b) {
      n |= static_cast<std::uint32_t>(static_cast<unsigned char>(data[at + b])) << (8 * b);
    }
    at += 4;
    if (bytes - at < n) throw std::runtime_error("truncated string");
    out.emplace_back(data + at, n);
    at += n;
  }
  return out;
}

//! Where the response's outputs go: `alloc` gives a buffer of the size asked for and says
//! which memory it is in, `release` frees it, `to_host` copies such a buffer into host
//! memory. The default is malloc'ed CPU memory.
struct output_memory {
  std::function<void*(std::size_t bytes, TRITONSERVER_MemoryType* type, std::int64_t* id)>
      alloc;
  std::function<void(void* buffer, TRITONSERVER_MemoryType type, std::int64_t id)> release;
  std::function<void(void* host, const void* buffer, std::size_t bytes,
                     TRITONSERVER_MemoryType type, std::int64_t id)>
      to_host;
};

//! What a request carries besides its inputs.
struct request_options {
  std::uint64_t correlation_id = 0;  //!< sequence batching: the sequence
  std::uint32_t flags = 0;           //!< TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
  std::vector<std::string> outputs;  //!< the outputs asked for; empty: all of them
  const output_memory* memory = nullptr;  //!< where outputs go; null: CPU memory
};

//! One output of a response, copied out of Triton's buffer.
struct tensor_out {
  std::string name;
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
  std::vector<std::int64_t> shape;
  std::vector<char> data;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;  //!< where Triton had it

  //! The elements of a BYTES output.
  std::vector<std::string> strings() const { return deserialize_strings(data.data(), data.size()); }

  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(data.data());
  }
  template <class T>
  std::size_t count() const {
    return data.size() / sizeof(T);
  }
};

//! The outcome of one request: outputs, or the error its response carried.
struct infer_result {
  std::vector<tensor_out> outputs;
  std::optional<triton_error> error;
};

}  // namespace torchloom_triton
