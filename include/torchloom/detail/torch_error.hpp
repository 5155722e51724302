#pragma once
#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace torchloom::detail {

//! The message of an exception from torch, without the C++ backtrace torch appends.
inline std::string torch_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace torchloom::detail
