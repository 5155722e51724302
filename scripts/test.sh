#!/usr/bin/env bash
# Sets up, builds everything and runs every test through CTest. On a machine without a GPU
# the [cuda] tests are reported as skipped. Where the Triton kit is beside the checkout
# (../shared/triton), it is built once into a cache (scripts/triton-kit.sh) and the Triton
# backend's tests run too; where Triton's PyTorch backend is (../shared/triton-peer), it is
# built into a cache as well (scripts/triton-peer.sh) and the side-by-side tests run against it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
kit_prefix="$(bash scripts/triton-kit.sh)"
configure_args=()
if [ -n "$kit_prefix" ]; then
  export CMAKE_PREFIX_PATH="$kit_prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  peer_prefix="$(bash scripts/triton-peer.sh "$kit_prefix")"
  if [ -n "$peer_prefix" ]; then
    configure_args+=("-DTORCHLOOM_TRITON_PEER_PREFIX=$peer_prefix")
  fi
fi
bash scripts/configure.sh "${configure_args[@]}"
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
