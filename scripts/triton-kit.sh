#!/usr/bin/env bash
# Builds the Triton kit (an in-process Triton core and Triton's backend utilities) from
# ../shared/triton into a cache, once, and prints the prefix to hand to CMake
# (CMAKE_PREFIX_PATH). Prints nothing and exits 0 where the kit is not beside the checkout;
# the Triton backend and its tests are then left out of the build.
#   TORCHLOOM_TRITON_KIT_DIR     the kit (default: ../shared/triton from the repository root)
#   TORCHLOOM_TRITON_KIT_PREFIX  where it is installed (default: $HOME/.cache/triton-kit)
#   TORCHLOOM_TRITON=off         leave the backend out even where the kit is present
set -euo pipefail
cd "$(dirname "$0")/.."
kit="${TORCHLOOM_TRITON_KIT_DIR:-../shared/triton}"
prefix="${TORCHLOOM_TRITON_KIT_PREFIX:-$HOME/.cache/triton-kit}"
if [ "${TORCHLOOM_TRITON:-auto}" = off ] || [ ! -f "$kit/build.sh" ]; then
  exit 0
fi
# The first build takes 4-10 minutes on 2 cores; later calls only check its stamp.
bash "$kit/build.sh" "$prefix" >&2
echo "$prefix"
