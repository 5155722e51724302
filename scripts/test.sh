#!/usr/bin/env bash
# Sets up, builds everything and runs every test through CTest. On a machine without a GPU
# the [cuda] tests are reported as skipped. Where the Triton kit is beside the checkout
# (../shared/triton), it is built once into a cache (scripts/triton-kit.sh) and the Triton
# backend's tests run too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
kit_prefix="$(bash scripts/triton-kit.sh)"
if [ -n "$kit_prefix" ]; then
  export CMAKE_PREFIX_PATH="$kit_prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
fi
bash scripts/configure.sh
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
