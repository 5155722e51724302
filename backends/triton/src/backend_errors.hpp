#pragma once
// How libtriton_torchloom.so hands failures to Triton: torchloom's error codes as Triton's,
// and a wrapper that turns whatever a call throws into a TRITONSERVER_Error, so that nothing
// unwinds into the Triton core through the backend's C entry points.
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/error.hpp>

#include "triton/backend/backend_model.h"
#include "triton/backend/backend_model_instance.h"
#include "triton/core/tritonserver.h"

#include <exception>
#include <string>

namespace torchloom::triton_backend {

//! Triton's error code for a torchloom error code: bad input and invalid options are
//! INVALID_ARG, a missing model NOT_FOUND, unsupported UNSUPPORTED, the rest INTERNAL.
inline TRITONSERVER_Error_Code triton_code(errc code) noexcept {
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

//! A new TRITONSERVER_Error (owned by the caller) carrying `e`'s code and message.
inline TRITONSERVER_Error* to_triton(const error& e) {
  return TRITONSERVER_ErrorNew(triton_code(e.code()), e.what());
}

//! The message of a TRITONSERVER_Error, which stays the caller's.
inline std::string message_of(TRITONSERVER_Error* err) {
  return err == nullptr ? std::string() : std::string(TRITONSERVER_ErrorMessage(err));
}

//! Runs `f` and returns nullptr, or what it threw as a TRITONSERVER_Error the caller owns:
//! a torchloom::error with its own code; the error object of the backend utilities'
//! BackendModelException / BackendModelInstanceException (thrown by their base-class
//! constructors; the object passes on to the caller, never copied or leaked); anything else
//! (a c10::Error, std::bad_alloc, an exception of no known type) as `fallback` naming `model`.
template <class F>
TRITONSERVER_Error* call_guarded(const std::string& model, errc fallback, F&& f) noexcept {
  try {
    try {
      f();
      return nullptr;
    } catch (const error& e) {
      return to_triton(e);
    } catch (const triton::backend::BackendModelException& e) {
      return e.err_ != nullptr ? e.err_
                               : to_triton(error(fallback, model, "the backend utilities failed"));
    } catch (const triton::backend::BackendModelInstanceException& e) {
      return e.err_ != nullptr ? e.err_
                               : to_triton(error(fallback, model, "the backend utilities failed"));
    } catch (const std::exception& e) {
      return to_triton(error(fallback, model, detail::torch_message(e)));
    } catch (...) {
      return to_triton(error(fallback, model, "an exception of an unknown type"));
    }
  } catch (...) {  // making the error failed (out of memory): a fixed message, never a throw
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                 "torchloom: out of memory while reporting an error");
  }
}

}  // namespace torchloom::triton_backend
