// libFuzzer target: the AOTInductor input metadata parser ("x:float32[-1,64];ids:int64[-1]")
// and the pytree call-spec leaf counter. parse_declared_inputs may refuse an input with
// torchloom::error (load_failed), as documented; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <torchloom/loader/aoti_metadata.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto inputs = torchloom::detail::parse_declared_inputs(text);
    for (const auto& in : inputs) {
      if (in.name.empty()) __builtin_trap();  // an entry without a name must be refused
      if (in.shape) {
        for (const auto d : *in.shape) {
          if (d < -1) __builtin_trap();  // only -1 stands for a free dimension
        }
      }
    }
  } catch (const torchloom::error& e) {
    if (e.code() != torchloom::errc::load_failed) __builtin_trap();
  }
  (void)torchloom::detail::count_pytree_leaves(text);
  return 0;
}
