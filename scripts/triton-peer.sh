#!/usr/bin/env bash
# Builds Triton's own PyTorch backend (release r26.02, TorchScript, Debian's LibTorch) from
# ../shared/triton-peer against the Triton kit, into a cache, once, and prints its prefix
# (PREFIX/backends/pytorch/libtriton_pytorch.so), which CMake takes as
# -DTORCHLOOM_TRITON_PEER_PREFIX=PREFIX for the side-by-side tests and bm_triton. Prints nothing
# and exits 0 where the peer's sources or the kit are missing: those tests then skip and say so.
#   scripts/triton-peer.sh [KIT_PREFIX]   the kit to build against (default: what
#                                         scripts/triton-kit.sh prints)
#   TORCHLOOM_TRITON_PEER_DIR     the peer's sources (default: ../shared/triton-peer)
#   TORCHLOOM_TRITON_PEER_PREFIX  where it is installed (default: $HOME/.cache/triton-peer)
#   TORCHLOOM_TRITON=off          build nothing (as scripts/triton-kit.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
peer="${TORCHLOOM_TRITON_PEER_DIR:-../shared/triton-peer}"
prefix="${TORCHLOOM_TRITON_PEER_PREFIX:-$HOME/.cache/triton-peer}"
if [ "${TORCHLOOM_TRITON:-auto}" = off ] || [ ! -f "$peer/build.sh" ]; then
  echo "triton-peer: no $peer/build.sh: the side-by-side tests will skip" >&2
  exit 0
fi
kit_prefix="${1:-$(bash scripts/triton-kit.sh)}"
if [ -z "$kit_prefix" ]; then
  echo "triton-peer: no Triton kit: the side-by-side tests will skip" >&2
  exit 0
fi
# The build takes 30-60 s on 2 cores (about 5 minutes while other builds run); later calls only
# check its stamp. It needs the same kit as the tests' core: backends check the core's API.
TRITON_KIT_PREFIX="$kit_prefix" bash "$peer/build.sh" "$prefix" >&2
echo "$prefix"
