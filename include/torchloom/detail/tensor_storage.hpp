#pragma once
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <string>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <unordered_set>
#include <vector>

// A TorchScript archive stores each tensor's size, stride and offset in data.pkl and its bytes
// in a separate record; torch's loader builds the tensor on a storage as large as the record
// without checking that the record holds what the tensor spans. A short record therefore
// loads and the first run reads past the storage. These checks run once at load.

namespace torchloom::detail {

//! The bytes a strided tensor spans in its storage, from its storage offset, or -1 when the
//! computation overflows or a stride or the offset is negative.
inline std::int64_t strided_bytes_needed(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  std::int64_t last = t.storage_offset();
  if (last < 0) return -1;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (strides[i] < 0) return -1;
    std::int64_t step = 0;
    if (__builtin_mul_overflow(sizes[i] - 1, strides[i], &step) ||
        __builtin_add_overflow(last, step, &last)) {
      return -1;
    }
  }
  std::int64_t bytes = 0;
  if (__builtin_add_overflow(last, std::int64_t{1}, &last) ||
      __builtin_mul_overflow(last, static_cast<std::int64_t>(t.element_size()), &bytes)) {
    return -1;
  }
  return bytes;
}

//! Throws load_failed naming `what` when `t` spans more bytes than its storage holds.
inline void check_tensor_storage(const std::string& model, const std::string& file,
                                 const std::string& what, const at::Tensor& t) {
  if (!t.defined() || t.layout() != c10::kStrided || !t.has_storage()) return;
  const std::int64_t needed = strided_bytes_needed(t);
  const auto held = t.storage().nbytes();
  if (needed < 0 || static_cast<std::uint64_t>(needed) > held) {
    throw error(errc::load_failed, model,
                concat("'", file, "': ", what, " (", t.scalar_type(), ", shape ", t.sizes(),
                       ", strides ", t.strides(), ", offset ", t.storage_offset(), ") needs ",
                       needed < 0 ? std::string("an impossible number of") : std::to_string(needed),
                       " bytes of storage, but its record holds ", held,
                       "; the file is corrupt or was altered"));
  }
}

// Every tensor reachable from `v`: attributes of objects, and elements of containers.
inline void check_ivalue_storages(const std::string& model, const std::string& file,
                                  const std::string& what, const c10::IValue& v,
                                  std::unordered_set<const void*>& seen, int depth) {
  if (depth > 64) return;  // the archive's own nesting; deeper structures are not tensors' homes
  if (v.isTensor()) {
    check_tensor_storage(model, file, what, v.toTensor());
  } else if (v.isTensorList()) {
    const auto list = v.toTensorVector();
    for (std::size_t i = 0; i < list.size(); ++i) {
      check_tensor_storage(model, file, concat(what, "[", i, "]"), list[i]);
    }
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    for (std::size_t i = 0; i < elems.size(); ++i) {
      check_ivalue_storages(model, file, concat(what, "[", i, "]"), elems[i], seen, depth + 1);
    }
  } else if (v.isList()) {
    const auto list = v.toListRef();
    for (std::size_t i = 0; i < list.size(); ++i) {
      check_ivalue_storages(model, file, concat(what, "[", i, "]"), list[i], seen, depth + 1);
    }
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) {
      check_ivalue_storages(model, file, concat(what, "[", kv.key().tagKind(), "]"), kv.value(),
                            seen, depth + 1);
    }
  } else if (v.isObject()) {
    const auto obj = v.toObject();
    if (!seen.insert(obj.get()).second) return;
    const auto type = obj->type();
    for (std::size_t i = 0; i < obj->slots().size() && i < type->numAttributes(); ++i) {
      const std::string name =
          what.empty() ? type->getAttributeName(i) : concat(what, ".", type->getAttributeName(i));
      check_ivalue_storages(model, file, name, obj->getSlot(i), seen, depth + 1);
    }
  }
}

//! Checks every parameter, buffer and other tensor attribute of `module` (submodules
//! included) and every tensor constant of its code: each must lie within its storage.
//! Throws load_failed naming the model, the file and the tensor.
inline void check_module_storages(const std::string& model, const std::string& file,
                                  const torch::jit::Module& module) {
  std::unordered_set<const void*> seen;
  check_ivalue_storages(model, file, "", module._ivalue(), seen, 0);
  for (const torch::jit::Function* f : module._ivalue()->compilation_unit()->get_functions()) {
    const auto* graph_function =
        torch::jit::tryToGraphFunction(*const_cast<torch::jit::Function*>(f));
    if (graph_function == nullptr) continue;
    std::vector<const torch::jit::Block*> blocks{graph_function->graph()->block()};
    while (!blocks.empty()) {
      const auto* block = blocks.back();
      blocks.pop_back();
      for (const torch::jit::Node* node : block->nodes()) {
        for (const auto* b : node->blocks()) blocks.push_back(b);
        if (node->kind() == c10::prim::Constant && node->hasAttribute(c10::attr::value) &&
            node->kindOf(c10::attr::value) == torch::jit::AttributeKind::t) {
          check_tensor_storage(model, file,
                               concat("a tensor constant of ", f->qualname().qualifiedName()),
                               node->t(c10::attr::value));
        }
      }
    }
  }
}

}  // namespace torchloom::detail
