// libFuzzer target: the config.pbtxt parser (protobuf text format and Triton's fields).
// Any input may be refused with torchloom::error; anything else escaping, a crash, a hang or
// a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <torchloom/triton/config.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto config = torchloom::parse_triton_config(text, "fuzz/config.pbtxt");
    // What a runner reads next from a parsed config must be usable as is.
    for (const auto& input : config.inputs) {
      for (const auto d : input.dims) (void)d;
    }
  } catch (const torchloom::error& e) {
    if (e.code() != torchloom::errc::invalid_option && e.code() != torchloom::errc::unsupported) {
      __builtin_trap();
    }
  }
  return 0;
}
