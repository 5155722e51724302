#pragma once
// One value of a pickle as torchloom's checks of a TorchScript archive's pickles see it (see
// torchloom/detail/pickle_machine.hpp): what it is, and only what the checks need of it, in
// 24 bytes (a model's data.pkl holds a few dozen values per tensor).
#include <cstdint>

namespace torchloom::detail {

//! One value on a pickle_machine's stack.
struct pickle_value {
  //! What the value is; `global` is what a GLOBAL pushes (torch: an index into its table of
  //! globals), `storage_type` what GLOBAL torch.<Type>Storage pushes, `tensor` what
  //! BINPERSID and torch's tensor rebuilders push.
  enum class kind : std::uint8_t {
    none,
    boolean,
    integer,
    real,
    text,
    tuple,
    list,
    dict,
    global,
    storage_type,
    tensor,
    other
  };
  std::int64_t number = 0;  //!< integer: value; global: index; tensor: storage or -1;
                            //!< list, dict: container id
  std::uint32_t first = 0;  //!< tuple: where its elements begin in the machine's arena;
                            //!< text, storage_type: where the string begins in the pickle
  std::uint32_t count = 0;  //!< tuple: how many elements; text, storage_type: the length
  std::uint16_t depth = 0;  //!< tuple, other: its nesting
  kind k = kind::none;
};

}  // namespace torchloom::detail
