#!/usr/bin/env bash
# The serving stage of the GPU machine: torchloom's Triton backend in a CUDA-enabled in-process
# Triton core, beside Triton's own PyTorch backend (upstream main, PT2 path included), within a
# time budget.
#
#   bash scripts/gpu-serving.sh BUILD OUT [BUDGET_S]     (from the repository root)
#
# BUILD: a build directory (an existing one, e.g. scripts/gpu.sh's build-gpu, is reconfigured
# with the kit and builds only the Triton targets; an empty one is configured as gpu.sh does).
# OUT: receives serving-log.txt (everything), bm_triton.json and serving/report.md (the T13,
# T15 and T16 tables). BUDGET_S (default 480): wall seconds for the whole stage; a step that
# would not fit is skipped and named on the last line.
#
# Steps (wall times on the 16-core H100 machine, estimated from the kit's and the peer's
# READMEs and gpu.sh's build; the first run there will tell):
#   1. the Triton kit with CUDA (TRITON_KIT_GPU=1) from the carried .deb files    ~30 s
#   2. Triton's PyTorch backend, main branch, against it and pip torch            60-85 s,
#      in the background from here on (TRITON_PEER_TORCH=pip)
#   3. configure BUILD with the kit and pip torch                                 10-30 s
#   4. build the backend, its tests, the serving tests and bm_triton             60-150 s
#   5. the backend's CTest cases (triton.*: the backend's own, side by side, faults,
#      [cuda] serving cases)                                                      60-120 s
#   6. bm_triton (T13, T15, T16) into OUT/bm_triton.json, then the report         90-150 s
#
# The kit and the peer travel with the checkout in ignored folders (the GPU machine has no
# ../shared); prepare them once beside the checkout:
#   echo /.tkit/ >>.git/info/exclude; echo /.tpeer/ >>.git/info/exclude
#   rm -rf .tkit .tpeer && cp -r ../shared/triton .tkit && cp -r ../shared/triton-peer .tpeer
# (and name .tkit and .tpeer in the device call's carry list).
# Environment: SERVING_KIT_DIR (default .tkit, or .tpeer/triton), SERVING_PEER_DIR (default
# .tpeer, or .tpeer/triton-peer), SERVING_KIT_PREFIX (BUILD/triton-kit-gpu),
# SERVING_PEER_PREFIX (BUILD/triton-peer), TORCHLOOM_AOTI_FIXTURES (default
# BUILD/aoti_fixtures: the mlp_cuda package of scripts/make_aoti_fixtures.py, which gpu.sh
# makes; without it the torch_aoti case skips).
# Run it after gpu.sh's benchmark loop when BUILD is gpu.sh's build-gpu: that loop runs every
# bench/bm_* it finds, bm_triton included once this script has built it.
# Exit status 1 when the kit, configure, the build, a test or the benchmark failed.
set -euo pipefail

if (($# < 2)); then
  sed -n '2,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BUILD=$1
OUT=$2
BUDGET_S=${3:-480}
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
[[ $BUILD == /* ]] || BUILD="$ROOT/$BUILD"
mkdir -p "$BUILD"
LOG="$OUT/serving-log.txt"
: >"$LOG"
rm -f "$OUT/bm_triton.json"
START=$SECONDS
JOBS="$(nproc)"
SCRATCH="$(mktemp -d)"
peer_pid=""
cleanup() {
  if [[ -n $peer_pid ]]; then kill "$peer_pid" 2>/dev/null || true; fi
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

say() { printf '%s\n' "$*" | tee -a "$LOG"; }
log() { printf '%s\n' "$*" >>"$LOG"; }
step() { say "== [serving $((SECONDS - START))s] $*"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }
skipped=()
failed=()
# run_logged FILE CMD...: CMD's output to the log and to FILE; returns CMD's status.
run_logged() {
  local file=$1
  shift
  log "\$ $*"
  local rc=0
  "$@" >"$file" 2>&1 || rc=$?
  cat "$file" >>"$LOG"
  return "$rc"
}
finish() {
  local verdict="ok"
  if ((${#failed[@]} > 0)); then verdict="FAILED: ${failed[*]}"; fi
  local skip="nothing"
  if ((${#skipped[@]} > 0)); then skip="${skipped[*]}"; fi
  say "== serving result: $verdict; skipped: $skip ($((SECONDS - START))s of ${BUDGET_S}s)"
  if ((${#failed[@]} > 0)); then exit 1; fi
  exit 0
}

KIT_DIR=${SERVING_KIT_DIR:-$ROOT/.tkit}
PEER_DIR=${SERVING_PEER_DIR:-$ROOT/.tpeer}
# The peer's README carries both as .tpeer/triton and .tpeer/triton-peer: take that too.
[[ -f $KIT_DIR/build.sh || ! -f $ROOT/.tpeer/triton/build.sh ]] || KIT_DIR=$ROOT/.tpeer/triton
[[ -f $PEER_DIR/build.sh || ! -f $PEER_DIR/triton-peer/build.sh ]] || PEER_DIR=$PEER_DIR/triton-peer
KIT_PREFIX=${SERVING_KIT_PREFIX:-$BUILD/triton-kit-gpu}
PEER_PREFIX=${SERVING_PEER_PREFIX:-$BUILD/triton-peer}

# ---------------------------------------------------------------------------------------
step "machine"
if [[ -d /usr/local/cuda/bin && ":$PATH:" != *":/usr/local/cuda/bin:"* ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | paste -sd ';' \
  || true)"
if ! TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>>"$LOG")"
then
  failed+=("torch")
  say "cannot import torch with $(command -v python3)"
  finish
fi

# ---------------------------------------------------------------------------------------
step "Triton kit with CUDA ($KIT_DIR -> $KIT_PREFIX)"
if [[ ! -f $KIT_DIR/build.sh ]]; then
  failed+=("kit")
  say "no $KIT_DIR/build.sh: copy ../shared/triton there before the run (see the header)"
  finish
fi
if ! run_logged "$SCRATCH/kit.txt" env TRITON_KIT_DEPS_DIR="$KIT_DIR/debs" TRITON_KIT_GPU=1 \
  TRITON_KIT_JOBS="$JOBS" bash "$KIT_DIR/build.sh" "$KIT_PREFIX"; then
  failed+=("kit")
  tail -n 20 "$SCRATCH/kit.txt" | cut -c1-240 | tee -a "$LOG"
  say "kit build FAILED"
  finish
fi
say "kit: $(tail -n 1 "$SCRATCH/kit.txt" | cut -c1-200)"

# ---------------------------------------------------------------------------------------
peer_began=$SECONDS
if [[ -f $PEER_DIR/build.sh ]]; then
  step "Triton's PyTorch backend (main, pip torch): started in the background ($PEER_PREFIX)"
  TRITON_PEER_TORCH=pip TRITON_KIT_PREFIX="$KIT_PREFIX" TRITON_PEER_JOBS="$JOBS" \
    timeout "$(min 300 "$(left)")" bash "$PEER_DIR/build.sh" "$PEER_PREFIX" \
    >"$SCRATCH/peer.txt" 2>&1 &
  peer_pid=$!
else
  skipped+=("peer (no $PEER_DIR/build.sh)")
  say "no $PEER_DIR/build.sh: the side-by-side cases and T15 will skip"
fi

# ---------------------------------------------------------------------------------------
step "configure $BUILD"
if ! run_logged "$SCRATCH/configure.txt" cmake -S . -B "$BUILD" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$KIT_PREFIX;$TORCH_PREFIX" \
  "-DTritonKit_DIR=$KIT_PREFIX/lib/cmake/TritonKit" -DTORCHLOOM_TRITON_BACKEND=ON \
  "-DTORCHLOOM_TRITON_PEER_PREFIX=$PEER_PREFIX" -DTORCHLOOM_WERROR=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5; then
  failed+=("configure")
  { grep -E -A10 'CMake Error|Error:' "$SCRATCH/configure.txt" || true; } | head -n 40 |
    cut -c1-240 >>"$LOG"
  say "configure FAILED (the errors are in serving-log.txt)"
  finish
fi
grep -q 'TORCHLOOM_HAS_CUDA=1' "$BUILD/build.ninja" ||
  say "WARNING: torchloom::cuda not found: the [cuda] cases skip"

# ---------------------------------------------------------------------------------------
targets=(triton_torchloom torchloom_triton_tests torchloom_triton_serving_tests bm_triton)
grep -q 'triton_minimal' "$BUILD/build.ninja" && targets+=(triton_minimal)
step "build (${targets[*]})"
if ! run_logged "$SCRATCH/build.txt" timeout "$(min 400 "$(left)")" \
  ninja -C "$BUILD" -j"$JOBS" -k 0 "${targets[@]}"; then
  failed+=("build")
  { grep -E -A6 'error:|FAILED:|undefined reference' "$SCRATCH/build.txt" || true; } |
    head -n 60 | cut -c1-300 | tee -a "$LOG"
  say "build FAILED (first errors above)"
  finish
fi

# ---------------------------------------------------------------------------------------
if [[ -n $peer_pid ]]; then
  rc=0
  wait "$peer_pid" || rc=$?
  peer_pid=""
  cat "$SCRATCH/peer.txt" >>"$LOG"
  if ((rc == 0)); then
    say "peer: ok ($((SECONDS - peer_began))s after it started): $PEER_PREFIX/backends/pytorch"
    export TORCHLOOM_TRITON_PEER="$PEER_PREFIX"
  else
    skipped+=("peer (build failed, status $rc)")
    say "peer build FAILED (status $rc): the side-by-side cases and T15 skip; last lines:"
    tail -n 12 "$SCRATCH/peer.txt" | cut -c1-240 | tee -a "$LOG"
  fi
fi
export TORCHLOOM_AOTI_FIXTURES="${TORCHLOOM_AOTI_FIXTURES:-$BUILD/aoti_fixtures}"
if [[ ! -f $TORCHLOOM_AOTI_FIXTURES/mlp_cuda/1/model.pt2 ]]; then
  skipped+=("torch_aoti side by side (no $TORCHLOOM_AOTI_FIXTURES/mlp_cuda)")
  say "no AOTI fixture mlp_cuda in $TORCHLOOM_AOTI_FIXTURES: the torch_aoti case skips"
fi

# ---------------------------------------------------------------------------------------
t=$(min 240 $(($(left) - 100)))
if ((t < 45)); then
  skipped+=("tests (no time left)")
  say "tests: not run, $(left)s left"
else
  step "tests (ctest -R '^triton\\.', ${t}s at most)"
  rc=0
  run_logged "$SCRATCH/ctest.txt" timeout "$t" ctest --test-dir "$BUILD" -R '^triton\.' \
    -V --timeout 200 || rc=$?
  { grep -E 'Test +#|tests passed|Total Test time' "$SCRATCH/ctest.txt" || true; } |
    cut -c1-160 | tee -a "$LOG"
  # The figures the fault cases judge (memory growth over the reload cycles).
  { grep -E -A1 'grew by' "$SCRATCH/ctest.txt" || true; } | cut -c1-200 | tee -a "$LOG"
  if ((rc != 0)); then
    failed+=("tests")
    { grep -E -B2 -A8 'FAILED:|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout' \
      "$SCRATCH/ctest.txt" || true; } | head -n 80 | cut -c1-240 | tee -a "$LOG"
  fi
fi

# ---------------------------------------------------------------------------------------
t=$(min 300 $(($(left) - 15)))
if ((t < 60)); then
  skipped+=("bm_triton (no time left)")
  say "bm_triton: not run, $(left)s left"
else
  step "bm_triton (${t}s at most)"
  rc=0
  run_logged "$SCRATCH/bench.txt" timeout "$t" "$BUILD/bench/bm_triton" \
    --benchmark_format=console --benchmark_out="$OUT/bm_triton.json" \
    --benchmark_out_format=json --benchmark_enable_random_interleaving=true || rc=$?
  if ((rc != 0)); then
    failed+=("bm_triton (status $rc)")
    tail -n 15 "$SCRATCH/bench.txt" | cut -c1-200 | tee -a "$LOG"
  fi
  { grep -E 'ERROR OCCURRED' "$SCRATCH/bench.txt" || true; } | cut -c1-240 | tee -a "$LOG"
  if [[ -s $OUT/bm_triton.json ]]; then
    python3 scripts/report.py --out "$OUT/serving" "$OUT/bm_triton.json" 2>&1 | tee -a "$LOG" ||
      failed+=("report")
  fi
fi
finish
