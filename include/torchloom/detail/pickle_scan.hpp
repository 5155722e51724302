#pragma once
// A TorchScript archive's pickles (data.pkl, constants.pkl, the code's debug pickles) read as
// torch's unpickler reads them, before it does: the stack machine's checks
// (torchloom/detail/pickle_machine.hpp), and what torch makes of GLOBAL, REDUCE and
// BINPERSID: the storages a pickle declares, and the tensors it builds on them. torch 1.13
// takes a storage's type from a bare integer and its size from the pickle, never compared
// with its record, and lets a tensor span past its storage.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <torchloom/detail/pickle_machine.hpp>
#include <torchloom/detail/pickle_value.hpp>
#include <torchloom/detail/strings.hpp>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! A storage a pickle declares: BINPERSID of ('storage', torch.<Type>Storage, key, location,
//! numel).
struct pickle_storage {
  std::string key;
  std::string type;           //!< "Float" for torch.FloatStorage
  std::size_t item_size = 0;  //!< bytes per element; 0 for a type this scan does not know
  std::uint64_t numel = 0;
  std::string name;  //!< the key a tensor on it first appears under in a dict (an attribute)
};

//! What scan_pickle found.
struct pickle_scan {
  std::vector<pickle_storage> storages;  //!< in the order the pickle declares them
  std::string problem;   //!< what is malformed and at which byte; empty when well formed
  bool complete = true;  //!< false: stopped at an opcode it does not know (torch's to judge)
};

//! The bytes per element of torch.<type>Storage; 0 for a type not known here.
inline std::size_t storage_item_size(std::string_view type) {
  // clang-format off
  static constexpr std::pair<std::string_view, std::size_t> sizes[] = {
      {"Byte", 1}, {"Char", 1}, {"Short", 2}, {"Int", 4}, {"Long", 8}, {"Half", 2},
      {"Float", 4}, {"Double", 8}, {"ComplexHalf", 4}, {"ComplexFloat", 8},
      {"ComplexDouble", 16}, {"Bool", 1}, {"QInt8", 1}, {"QUInt8", 1}, {"QInt32", 4},
      {"BFloat16", 2}, {"QUInt4x2", 1}, {"QUInt2x4", 1}, {"Bits1x8", 1}, {"Bits2x4", 1},
      {"Bits4x2", 1}, {"Bits8", 1}, {"Bits16", 2}, {"Float8_e5m2", 1}, {"Float8_e4m3fn", 1},
      {"Float8_e5m2fnuz", 1}, {"Float8_e4m3fnuz", 1}, {"UInt16", 2}, {"UInt32", 4},
      {"UInt64", 8}, {"Float8_e8m0fnu", 1}, {"Float4_e2m1fn_x2", 1}};
  // clang-format on
  for (const auto& [name, size] : sizes) {
    if (name == type) return size;
  }
  return 0;
}

//! A pickle_machine that does with GLOBAL, REDUCE, BUILD and BINPERSID what torch's
//! unpickler does, as far as the checks need: see scan_pickle.
class torch_pickle_scanner final : public pickle_machine {
 public:
  using pickle_machine::pickle_machine;

  //! Scans the pickle; see scan_pickle.
  pickle_scan scan() {
    pickle_scan out;
    out.problem = run();
    out.complete = complete();
    if (out.problem.empty()) out.storages = std::move(storages_);
    return out;
  }

 private:
  void on_global(std::string_view module, std::string_view name) override {
    if (skip_globals_ > 0 && --skip_globals_ == 0) {
      // torch: the second GLOBAL after _rebuild_from_type_v2 names the tensor's type only.
      push_simple(kind::global, static_cast<std::int64_t>(globals_.size()) - 1);
      return;
    }
    constexpr std::string_view storage = "Storage";
    if (module == "torch" && name.size() > storage.size() &&
        name.substr(name.size() - storage.size()) == storage) {
      push_simple(kind::storage_type, 0, name.substr(0, name.size() - storage.size()));
      return;
    }
    if (module == "torch" && name.rfind("per_", 0) == 0) {  // a quantization scheme
      push_simple(kind::integer);
      return;
    }
    if (module == "torch._tensor" && name == "_rebuild_from_type_v2") skip_globals_ = 2;
    std::string qualified(module);
    qualified.append(".").append(name);
    globals_.push_back(std::move(qualified));
    push_simple(kind::global, static_cast<std::int64_t>(globals_.size()) - 1);
  }

  // _rebuild_tensor_v2's (storage, offset, sizes, strides, ...): within the storage.
  void check_tensor(const pickle_value& args) const {
    const auto a = elements(args);
    if (a.size() < 4) return;  // torch refuses it
    if (a[0].k != kind::tensor || a[0].number < 0 || a[1].k != kind::integer ||
        a[2].k != kind::tuple || a[3].k != kind::tuple) {
      return;  // torch refuses it
    }
    const auto sizes = elements(a[2]);
    const auto strides = elements(a[3]);
    const auto& s = storages_[static_cast<std::size_t>(a[0].number)];
    if (sizes.size() != strides.size()) {
      fail(concat("a tensor of storage '", s.key, "' has ", sizes.size(), " sizes and ",
                  strides.size(), " strides"));
    }
    if (a[1].number < 0) {
      fail(concat("a tensor of storage '", s.key, "' starts at offset ", a[1].number));
    }
    std::int64_t last = a[1].number;  // the last element's index, -1 on overflow
    bool empty = false;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i].k != kind::integer || strides[i].k != kind::integer) return;
      if (sizes[i].number < 0 || strides[i].number < 0) {
        fail(concat("a tensor of storage '", s.key, "' has size ", sizes[i].number, " and stride ",
                    strides[i].number, " in dimension ", i));
      }
      std::int64_t step = 0;
      empty = empty || sizes[i].number == 0;
      if (last < 0 ||
          __builtin_mul_overflow(std::max<std::int64_t>(sizes[i].number - 1, 0), strides[i].number,
                                 &step) ||
          __builtin_add_overflow(last, step, &last)) {
        last = -1;
      }
    }
    if (!empty && (last < 0 || static_cast<std::uint64_t>(last) >= s.numel)) {
      std::string shape;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        shape += (i == 0 ? "" : ", ") + std::to_string(sizes[i].number);
      }
      fail(concat("a tensor of shape [", shape, "] at offset ", a[1].number, " needs ",
                  last < 0 ? std::string("more") : std::to_string(last + 1),
                  " elements of storage '", s.key, "', which declares ", s.numel));
    }
  }

  // BINPERSID's ('storage', type, key, location, numel).
  void on_persistent_id(const pickle_value& id) override {
    const auto a = elements(id);
    if (a.size() < 5 || a[0].k != kind::text || text_of(a[0]) != "storage") {
      fail("BINPERSID of something other than ('storage', type, key, location, size)");
    }
    if (a[1].k != kind::storage_type) fail("BINPERSID's storage type is not torch.<Type>Storage");
    if (a[2].k != kind::text || a[3].k != kind::text || a[4].k != kind::integer) {
      fail("BINPERSID's key, location or size is of the wrong kind");
    }
    pickle_storage s;
    s.key = std::string(text_of(a[2]));
    s.type = std::string(text_of(a[1]));
    s.item_size = storage_item_size(s.type);
    if (a[4].number < 0) fail(concat("storage '", s.key, "' declares ", a[4].number, " elements"));
    s.numel = static_cast<std::uint64_t>(a[4].number);
    std::uint64_t bytes = 0;
    if (__builtin_mul_overflow(s.numel, std::uint64_t{s.item_size}, &bytes) ||
        bytes > (std::uint64_t{1} << 62)) {
      fail(concat("storage '", s.key, "' declares ", s.numel, " elements of ", s.type));
    }
    push_simple(kind::tensor, static_cast<std::int64_t>(storages_.size()));
    storages_.push_back(std::move(s));
  }

  void on_dict_item(const pickle_value& key, const pickle_value& value) override {
    if (key.k != kind::text || value.k != kind::tensor || value.number < 0) return;
    auto& s = storages_[static_cast<std::size_t>(value.number)];
    if (s.name.empty()) s.name = std::string(text_of(key));
  }

  // REDUCE or BUILD: what torch's function for the global makes of the argument.
  pickle_value on_call(const pickle_value& callee, const pickle_value& arg) override {
    const auto index = static_cast<std::size_t>(callee.number);
    if (callee.k != kind::global || callee.number < 0 || index >= globals_.size()) {
      fail("REDUCE or BUILD of something that no GLOBAL named");
    }
    const std::string& f = globals_[index];
    const auto a = elements(arg);
    pickle_value out;
    if (f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_qtensor") {
      check_tensor(arg);
      out.k = kind::tensor;
      out.number = !a.empty() && a[0].k == kind::tensor ? a[0].number : -1;
    } else if (f == "torch._tensor._rebuild_from_type_v2") {
      if (index + 1 >= globals_.size()) fail("_rebuild_from_type_v2 names no rebuild function");
      if (globals_[index + 1] == "torch._utils._rebuild_tensor_v2" && a.size() > 2) {
        check_tensor(a[2]);
      }
      out.k = kind::tensor;
      out.number = -1;
    } else if (f == "__main__.IntList") {
      out = arg;
    } else if (f == "torch.jit._pickle.restore_type_tag" ||
               (f.rfind("torch.jit._pickle.build_", 0) == 0 &&
                f != "torch.jit._pickle.build_tensor_from_id")) {
      if (!a.empty()) out = a[0];  // the list or the value, as it was
    } else if (f == "collections.OrderedDict") {
      out.k = kind::none;
    } else if (f == "torch._utils._rebuild_sparse_tensor" || f == "__main__.TensorID" ||
               f == "torch.jit._pickle.build_tensor_from_id") {
      out.k = kind::tensor;
      out.number = -1;
    } else {
      out.k = kind::other;  // an object of the archive's classes, a complex, a device
      out.depth = next_depth(arg);
      check_nesting(out.depth);
    }
    return out;
  }

  std::vector<pickle_storage> storages_;
  std::vector<std::string> globals_;  // torch's table of globals, in its order
  int skip_globals_ = 0;
};

//! Follows the pickle `bytes` as torch's unpickler would (protocol 2, the opcodes torch
//! reads), and reports the storages it declares or the first thing that is malformed: an
//! opcode that finds too few values or no mark, an operand or string past the end, a memo
//! index past the opcodes read, nesting past max_pickle_nesting, no STOP with one value; a
//! storage whose type is not torch.<Type>Storage or whose size is negative; a tensor
//! outside its storage. Does not throw but std::bad_alloc.
inline pickle_scan scan_pickle(std::string_view bytes) {
  return torch_pickle_scanner(bytes).scan();
}

}  // namespace torchloom::detail
