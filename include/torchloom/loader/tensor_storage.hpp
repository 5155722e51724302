#pragma once
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <unordered_set>
#include <vector>

// A TorchScript archive stores each tensor's storage size (in elements) in data.pkl and its
// bytes in a separate record. torch's loader reads the record into a buffer as large as the
// record and builds a storage of the declared size on it, without comparing the two: a
// short record loads, and the first run reads past the buffer. So torchloom loads through a
// reader that notes how many bytes went into each buffer (the zip reader extracts a stored
// record with one read into the record's buffer), and after the load compares every
// tensor's storage with what was read into it.

namespace torchloom::detail {

//! Reads a model file for torch's archive reader and notes, for every buffer it reads into,
//! how many bytes went there.
class recording_reader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  //! Opens `path`; throws torchloom::error (load_failed, "cannot open it: " and strerror, no
  //! model name: the loader adds it and the file) when it cannot.
  explicit recording_reader(const std::string& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0) {
      const int err = errno;
      if (fd_ >= 0) ::close(fd_);
      throw error(errc::load_failed, {}, concat("cannot open it: ", std::strerror(err)));
    }
    size_ = static_cast<std::size_t>(st.st_size);
  }
  recording_reader(const recording_reader&) = delete;
  recording_reader& operator=(const recording_reader&) = delete;
  ~recording_reader() override { ::close(fd_); }

  std::size_t size() const override { return size_; }

  std::size_t read(std::uint64_t pos, void* buf, std::size_t n, const char*) const override {
    std::size_t done = 0;
    while (done < n) {
      const ssize_t r =
          ::pread(fd_, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(pos + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      done += static_cast<std::size_t>(r);
    }
    std::lock_guard lock(mutex_);
    reads_[buf] = done;
    return done;
  }

  //! How many bytes the last read into `buf` delivered, if anything was read into it.
  std::optional<std::size_t> bytes_read_into(const void* buf) const {
    std::lock_guard lock(mutex_);
    const auto it = reads_.find(buf);
    if (it == reads_.end()) return std::nullopt;
    return it->second;
  }

 private:
  int fd_;
  std::size_t size_ = 0;
  mutable std::mutex mutex_;
  mutable std::map<const void*, std::size_t> reads_;
};

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

//! Throws load_failed naming `what` when `t`, or its storage, needs more bytes than the
//! archive's record delivered into the storage's buffer. Tensors whose buffer the reader
//! did not fill directly (not on the CPU, or a compressed record) are not checked.
inline void check_tensor_storage(const std::string& model, const std::string& file,
                                 const std::string& what, const at::Tensor& t,
                                 const recording_reader& reader) {
  if (!t.defined() || t.layout() != c10::kStrided || !t.has_storage() || !t.is_cpu()) return;
  // An empty record gives a null buffer that nothing was read into.
  const auto held = t.storage().data() == nullptr ? std::optional<std::size_t>(0)
                                                  : reader.bytes_read_into(t.storage().data());
  if (!held) return;
  std::int64_t needed = strided_bytes_needed(t);
  if (needed >= 0 && static_cast<std::uint64_t>(needed) < t.storage().nbytes()) {
    needed = static_cast<std::int64_t>(t.storage().nbytes());
  }
  if (needed < 0 || static_cast<std::uint64_t>(needed) > *held) {
    throw error(errc::load_failed, model,
                concat("'", file, "': ", what, " (", t.scalar_type(), ", shape ", t.sizes(),
                       ", strides ", t.strides(), ", offset ", t.storage_offset(), ") needs ",
                       needed < 0 ? std::string("an impossible number of") : std::to_string(needed),
                       " bytes of storage, but its record holds ", *held,
                       "; the file is corrupt or was altered"));
  }
}

// Every tensor reachable from `v`: attributes of objects, and elements of containers.
inline void check_ivalue_storages(const std::string& model, const std::string& file,
                                  const std::string& what, const c10::IValue& v,
                                  const recording_reader& reader,
                                  std::unordered_set<const void*>& seen, int depth) {
  if (depth > 64) return;  // the archive's own nesting; deeper structures are not tensors' homes
  if (v.isTensor()) {
    check_tensor_storage(model, file, what, v.toTensor(), reader);
  } else if (v.isTensorList()) {
    const auto list = v.toTensorVector();
    for (std::size_t i = 0; i < list.size(); ++i) {
      check_tensor_storage(model, file, concat(what, "[", i, "]"), list[i], reader);
    }
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    for (std::size_t i = 0; i < elems.size(); ++i) {
      check_ivalue_storages(model, file, concat(what, "[", i, "]"), elems[i], reader, seen,
                            depth + 1);
    }
  } else if (v.isList()) {
    const auto list = v.toListRef();
    for (std::size_t i = 0; i < list.size(); ++i) {
      check_ivalue_storages(model, file, concat(what, "[", i, "]"), list[i], reader, seen,
                            depth + 1);
    }
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) {
      check_ivalue_storages(model, file, concat(what, "[", kv.key().tagKind(), "]"), kv.value(),
                            reader, seen, depth + 1);
    }
  } else if (v.isObject()) {
    const auto obj = v.toObject();
    if (!seen.insert(obj.get()).second) return;
    const auto type = obj->type();
    for (std::size_t i = 0; i < obj->slots().size() && i < type->numAttributes(); ++i) {
      const std::string name =
          what.empty() ? type->getAttributeName(i) : concat(what, ".", type->getAttributeName(i));
      check_ivalue_storages(model, file, name, obj->getSlot(i), reader, seen, depth + 1);
    }
  }
}

//! Checks every parameter, buffer and other tensor attribute of `module` (submodules
//! included) and every tensor constant of its code: each must lie within its storage.
//! Throws load_failed naming the model, the file and the tensor.
inline void check_module_storages(const std::string& model, const std::string& file,
                                  const torch::jit::Module& module,
                                  const recording_reader& reader) {
  std::unordered_set<const void*> seen;
  check_ivalue_storages(model, file, "", module._ivalue(), reader, seen, 0);
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
                               node->t(c10::attr::value), reader);
        }
      }
    }
  }
}

}  // namespace torchloom::detail
