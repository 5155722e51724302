#!/usr/bin/env bash
# Installs the dependencies (Debian 12) and configures the build tree `build/` for everything
# (the tests, the benchmarks, the examples, the Triton backend where its kit is found) with
# warnings as errors. Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# Explicit, so that a build/ first configured by run-example.sh (the CLI alone) gets them.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCHLOOM_WERROR=ON \
  -DTORCHLOOM_BUILD_TESTS=ON -DTORCHLOOM_BUILD_BENCHMARKS=ON -DTORCHLOOM_BUILD_EXAMPLES=ON \
  -DTORCHLOOM_HEADER_TESTS=ON -DTORCHLOOM_TRITON_BACKEND=AUTO "$@"
