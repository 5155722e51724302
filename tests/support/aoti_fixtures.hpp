#pragma once
// Where the tests find the AOTInductor packages scripts/make_aoti_fixtures.py makes:
// TORCHLOOM_AOTI_FIXTURES, else the build tree's aoti_fixtures/. Without one, a case that
// needs it is skipped, saying how to make it.
#include "catch.hpp"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

namespace torchloom_test {

inline std::filesystem::path aoti_fixture_root() {
  if (const char* env = std::getenv("TORCHLOOM_AOTI_FIXTURES"); env != nullptr && *env != 0) {
    return env;
  }
  return TORCHLOOM_AOTI_FIXTURE_DIR;
}

//! The Triton-layout directory of fixture `name`, when the fixture script made it.
inline std::optional<std::filesystem::path> aoti_fixture(const std::string& name) {
  const std::filesystem::path dir = aoti_fixture_root() / name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(dir / "1" / "model.pt2", ec)) return std::nullopt;
  return dir;
}

}  // namespace torchloom_test

//! Declares `var`, the directory of AOTI fixture `name`, or skips the test case.
#define TORCHLOOM_REQUIRE_AOTI_FIXTURE(var, name)                                       \
  const auto var##_found = ::torchloom_test::aoti_fixture(name);                        \
  if (!var##_found) {                                                                   \
    TORCHLOOM_CATCH_SKIP("no AOTI fixture '" name "' in " +                             \
                         ::torchloom_test::aoti_fixture_root().string() +               \
                         "; run scripts/make_aoti_fixtures.py DIR and set "             \
                         "TORCHLOOM_AOTI_FIXTURES");                                    \
  }                                                                                     \
  const std::filesystem::path var = *var##_found
