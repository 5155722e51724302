#pragma once
#include <cstddef>

namespace torchloom::triton_backend {

//! A copy between two host buffers, made once the device work before it is done.
struct host_copy {
  void* to;
  const void* from;
  std::size_t bytes;
};

}  // namespace torchloom::triton_backend
