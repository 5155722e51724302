#!/usr/bin/env bash
# Installs the dependencies (Debian 12) and configures the build tree `build/` with warnings
# as errors. Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCHLOOM_WERROR=ON "$@"
