#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/graph_values.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/concepts/stream_policy.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <utility>
#include <vector>

namespace torchloom::detail {

// The tensors or values the runner passed, to read.
inline const std::vector<c10::IValue>& given(const std::vector<c10::IValue>& v) { return v; }
inline const std::vector<at::Tensor>& given(lent_tensors v) { return v.get(); }

// What the body runs the model on instead of the caller's inputs: the static buffers, as
// the same kind of inputs (lent: the buffers stay the entry's).
inline std::vector<c10::IValue> replacement(const std::vector<c10::IValue>&,
                                            const std::vector<at::Tensor>& statics) {
  return std::vector<c10::IValue>(statics.begin(), statics.end());
}
inline lent_tensors replacement(lent_tensors, const std::vector<at::Tensor>& statics) {
  return std::cref(statics);
}

// A capture's outputs as the entry keeps them, whichever kind the body returned: one
// tensor as itself, several as a tuple (as a loader boxes them).
inline c10::IValue boxed(c10::IValue v) { return v; }
inline c10::IValue boxed(std::vector<at::Tensor> v) {
  if (v.size() == 1) return c10::IValue(std::move(v.front()));
  return c10::ivalue::Tuple::create(std::vector<c10::IValue>(v.begin(), v.end()));
}

inline const at::Tensor* tensor_of(const at::Tensor& t) { return &t; }
inline const at::Tensor* tensor_of(const c10::IValue& v) {
  return v.isTensor() ? &v.toTensor() : nullptr;
}

inline void flatten(const std::vector<at::Tensor>& v, std::vector<at::Tensor>& out) {
  out.insert(out.end(), v.begin(), v.end());
}

inline void flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& x : v.toTupleRef().elements()) flatten(x, out);
  } else {
    for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(t);
  }
}

inline bool tensors_only(const c10::IValue& v) {
  if (v.isTensor()) return true;
  if (v.isTuple()) {
    for (const auto& x : v.toTupleRef().elements()) {
      if (!tensors_only(x)) return false;
    }
    return true;
  }
  return v.isTensorList();
}

template <class Fn>
c10::IValue map_structure(const c10::IValue& v, Fn& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    elements.reserve(v.toTupleRef().elements().size());
    for (const auto& x : v.toTupleRef().elements()) elements.push_back(map_structure(x, fn));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  c10::List<at::Tensor> list;
  for (const at::Tensor& t : v.toTensorList().vec()) list.push_back(fn(t));
  return list;
}

}  // namespace torchloom::detail
