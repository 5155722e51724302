#pragma once
//! torchloom's version, as numbers and as a string.
#define TORCHLOOM_VERSION_MAJOR 0
#define TORCHLOOM_VERSION_MINOR 1
#define TORCHLOOM_VERSION_PATCH 0

namespace torchloom {
//! The version of the headers in use, "major.minor.patch".
inline constexpr const char* version_string = "0.1.0";
}  // namespace torchloom
