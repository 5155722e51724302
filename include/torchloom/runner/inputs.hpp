#pragma once
#include <torchloom/dtype.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/signature.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchloom::detail {

inline std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "an undefined Tensor";
  return concat("a Tensor (", dtype_name(t.scalar_type()), ", shape ", t.sizes(), ", on ",
                t.device(), ")");
}

inline std::string describe_ivalue(const c10::IValue& v) {
  if (v.isTensor()) return describe_tensor(v.toTensor());
  return concat("a value of type ", v.tagKind());
}

inline std::string input_label(const input_signature& sig, std::size_t i) {
  if (i < sig.size() && !sig[i].name.empty()) return concat("input ", i, " ('", sig[i].name, "')");
  return concat("input ", i);
}

inline void check_input_count(const std::string& model, const input_signature& sig,
                              std::size_t given) {
  std::size_t required = 0;
  for (const auto& s : sig) required += s.has_default ? 0 : 1;
  if (given < required || given > sig.size()) {
    std::string names;
    for (const auto& s : sig) names += (names.empty() ? "" : ", ") + s.name;
    throw error(errc::bad_input, model,
                concat("expected ",
                       required == sig.size() ? std::to_string(required)
                                              : concat(required, " to ", sig.size()),
                       sig.size() == 1 ? " input (" : " inputs (", names, "), got ", given));
  }
}

//! The rules of an input's declaration, each on its own: the data type, the shape (-1: any
//! size) and the batch bound (the first dimension).
inline bool dtype_fits(const input_spec& spec, c10::ScalarType dtype) noexcept {
  return !spec.dtype || dtype == *spec.dtype;
}
inline bool shape_fits(const input_spec& spec, c10::IntArrayRef sizes) noexcept {
  if (!spec.shape) return true;
  const auto& want = *spec.shape;
  if (sizes.size() != want.size()) return false;
  for (std::size_t d = 0; d < want.size(); ++d) {
    if (want[d] >= 0 && want[d] != sizes[d]) return false;
  }
  return true;
}
inline bool batch_fits(const input_spec& spec, c10::IntArrayRef sizes) noexcept {
  return spec.max_batch_size <= 0 || sizes.empty() || sizes[0] <= spec.max_batch_size;
}

//! Whether a tensor of `dtype` and `sizes` passes check_tensor_input's rules for `spec`,
//! without making one (a server checks a request's inputs before it gathers them).
inline bool fits_input(const input_spec& spec, c10::ScalarType dtype,
                       c10::IntArrayRef sizes) noexcept {
  return dtype_fits(spec, dtype) && shape_fits(spec, sizes) && batch_fits(spec, sizes);
}

//! Checks tensor input `i` against its declaration. Returns whether it must be moved to
//! `device` (a CPU tensor for another device).
inline bool check_tensor_input(const std::string& model, const input_signature& sig,
                               std::size_t i, const at::Tensor& t, c10::Device device) {
  const auto& spec = sig[i];
  if (!t.defined()) {
    throw error(errc::bad_input, model,
                concat(input_label(sig, i), " must be a Tensor, got ", describe_tensor(t)));
  }
  if (!dtype_fits(spec, t.scalar_type())) {
    throw error(errc::bad_input, model,
                concat(input_label(sig, i), " must be ", dtype_name(*spec.dtype), ", got ",
                       describe_tensor(t)));
  }
  if (!shape_fits(spec, t.sizes())) {
    throw error(errc::bad_input, model,
                concat(input_label(sig, i), " must have shape ", c10::IntArrayRef(*spec.shape),
                       " (-1: any size), got ", describe_tensor(t)));
  }
  if (!batch_fits(spec, t.sizes())) {
    throw error(errc::bad_input, model,
                concat(input_label(sig, i), " has a batch of ", t.size(0),
                       "; the model's max_batch_size is ", spec.max_batch_size));
  }
  if (t.device() == device) return false;
  if (!t.device().is_cpu()) {
    throw error(errc::bad_input, model,
                concat(input_label(sig, i), " is on ", t.device(), " but the runner is on ",
                       device, "; only CPU inputs are moved to the runner's device"));
  }
  return true;
}

//! Checks `inputs` against the declared signature and moves CPU tensors to `device`.
//! Everything is checked before anything is moved, so a bad request launches nothing.
//! Throws bad_input naming the input, what was expected and what was given.
inline void check_inputs(const std::string& model, const input_signature& sig,
                         std::vector<c10::IValue>& inputs, c10::Device device) {
  check_input_count(model, sig, inputs.size());
  bool needs_move = false;
  std::vector<std::size_t> dicts_to_move;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& spec = sig[i];
    const auto& v = inputs[i];
    if (!spec.is_tensor) {
      // None only where the schema accepts it (Optional[...]): a None for an `int` would
      // fail inside the model as run_failed, far from the input that caused it.
      if (spec.type && !v.type()->isSubtypeOf(*spec.type)) {
        throw error(errc::bad_input, model,
                    concat(input_label(sig, i), " must be ", spec.type->str(), ", got ",
                           describe_ivalue(v)));
      }
      // A Dict[str, Tensor] input: its tensors are checked and moved like tensor inputs.
      if (v.isGenericDict()) {
        bool move = false;
        for (const auto& kv : v.toGenericDict()) {
          if (!kv.value().isTensor()) continue;
          const at::Tensor& t = kv.value().toTensor();
          const std::string key =
              kv.key().isString() ? concat("'", printable(kv.key().toStringRef(), 64), "'")
                                  : std::string("a key");
          if (!t.defined()) {
            throw error(errc::bad_input, model,
                        concat(input_label(sig, i), " holds an undefined Tensor at ", key));
          }
          if (t.device() == device) continue;
          if (!t.device().is_cpu()) {
            throw error(errc::bad_input, model,
                        concat(input_label(sig, i), " holds a Tensor on ", t.device(), " at ",
                               key, " but the runner is on ", device,
                               "; only CPU inputs are moved to the runner's device"));
          }
          move = true;
        }
        if (move) dicts_to_move.push_back(i);
      }
      continue;
    }
    if (!v.isTensor()) {
      throw error(errc::bad_input, model,
                  concat(input_label(sig, i), " must be a Tensor, got ", describe_ivalue(v)));
    }
    needs_move |= check_tensor_input(model, sig, i, v.toTensor(), device);
  }
  if (needs_move) {
    for (auto& v : inputs) {
      if (v.isTensor() && v.toTensor().device() != device) v = v.toTensor().to(device);
    }
  }
  for (const std::size_t i : dicts_to_move) {
    const auto dict = inputs[i].toGenericDict();
    c10::impl::GenericDict moved(dict.keyType(), dict.valueType());
    for (const auto& kv : dict) {
      const bool cpu_tensor = kv.value().isTensor() && kv.value().toTensor().device() != device;
      moved.insert(kv.key(), cpu_tensor ? c10::IValue(kv.value().toTensor().to(device))
                                        : kv.value());
    }
    inputs[i] = c10::IValue(std::move(moved));
  }
}

//! check_inputs for inputs given as tensors (model_runner::run_tensors). Returns the inputs
//! moved to `device`, or nothing when they are all there already.
inline std::optional<std::vector<at::Tensor>> check_tensor_inputs(
    const std::string& model, const input_signature& sig, const std::vector<at::Tensor>& inputs,
    c10::Device device) {
  check_input_count(model, sig, inputs.size());
  bool needs_move = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!sig[i].is_tensor) {
      throw error(errc::bad_input, model,
                  concat(input_label(sig, i), " must be ",
                         sig[i].type ? sig[i].type->str() : std::string("a non-Tensor value"),
                         ", got a Tensor; use run() for inputs that are not tensors"));
    }
    needs_move |= check_tensor_input(model, sig, i, inputs[i], device);
  }
  if (!needs_move) return std::nullopt;
  std::vector<at::Tensor> moved;
  moved.reserve(inputs.size());
  for (const auto& t : inputs) moved.push_back(t.device() == device ? t : t.to(device));
  return moved;
}

//! The tensors of a model's output: a Tensor, or a tuple or list of them (nested too).
//! Throws unsupported naming what else was returned.
inline void flatten_tensors(const std::string& model, const c10::IValue& v,
                            std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) flatten_tensors(model, e, out);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) flatten_tensors(model, e, out);
  } else {
    throw error(errc::unsupported, model,
                concat("the model returned ", describe_ivalue(v),
                       ", which run() cannot return as tensors; use run_ivalue()"));
  }
}

}  // namespace torchloom::detail
