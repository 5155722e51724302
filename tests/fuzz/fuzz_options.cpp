// libFuzzer target: option parsing from a key/value map (runner_options), as config.pbtxt
// parameters, spec.set() and the CLI's --set give them. The input is "KEY=VALUE" lines.
// A key or value may be refused with torchloom::error: invalid_option, or unsupported for a
// key of Triton's Python runtime (NUM_THREADS); anything else is a finding, and so is an accepted option whose printed value does not parse back.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <torchloom/options.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> values;
  while (!text.empty()) {
    const auto end = text.find('\n');
    const auto line = text.substr(0, end);
    const auto eq = line.find('=');
    if (eq != std::string_view::npos) {
      values[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
    }
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  torchloom::runner_options options;
  try {
    options = torchloom::parse_options(values, {}, "fuzz");
  } catch (const torchloom::error& e) {
    if (e.code() != torchloom::errc::invalid_option && e.code() != torchloom::errc::unsupported) {
      __builtin_trap();
    }
    return 0;
  }
  // What was accepted prints, and the printed value parses back to the same text.
  (void)torchloom::to_string(options);
  for (const auto& key : torchloom::option_keys()) {
    const std::string printed = torchloom::get_option(options, key);
    if (printed == "(unset)") continue;
    torchloom::runner_options again;
    try {
      torchloom::set_option(again, key, printed, "fuzz");
    } catch (const torchloom::error&) {
      __builtin_trap();
    }
    if (torchloom::get_option(again, key) != printed) __builtin_trap();
  }
  return 0;
}
