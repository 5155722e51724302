#!/usr/bin/env bash
# Sets up, builds everything and runs every test through CTest. On a machine without a GPU
# the [cuda] tests are reported as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/configure.sh
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
