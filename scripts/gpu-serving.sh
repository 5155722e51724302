#!/usr/bin/env bash
# The serving stage of the GPU machine: torchloom's Triton backend in a CUDA-enabled in-process
# Triton core, beside Triton's own PyTorch backend (upstream main, PT2 path included).
#
#   bash scripts/gpu-serving.sh prepare BUILD OUT   the Triton kit with CUDA into
#         BUILD/triton-kit-gpu (about 30 s), then Triton's PyTorch backend into BUILD/triton-peer
#         in the background (60-85 s; log and status in BUILD/serving/); prints the kit's prefix
#         for CMAKE_PREFIX_PATH, or nothing where the kit did not travel (exit 0 either way,
#         1 when the kit fails to build)
#   bash scripts/gpu-serving.sh prefix BUILD        prints that prefix where the kit is built
#   bash scripts/gpu-serving.sh test BUILD OUT      waits for the PyTorch backend, builds the
#         serving targets (nothing to do after a full build), runs the triton.* CTest cases
#         (the backend's own, side by side, faults, the [cuda] serving cases; 60-120 s) with
#         it; the summary and the memory figures of the reload cycles go to stdout and to
#         OUT/serving-tests.txt
#   bash scripts/gpu-serving.sh bench BUILD OUT     waits for it, runs bm_triton (T13, T15, T16;
#         60-120 s) into OUT/bm_triton.json
#   bash scripts/gpu-serving.sh all BUILD OUT [BUDGET_S]   all of it alone within BUDGET_S
#         (default 480): prepare, configure BUILD with the kit and pip torch, build the serving
#         targets (60-150 s), test, bench, and OUT/serving/report.md; a step that would not fit
#         is skipped and named on the last line
# (run from the repository root; times are estimates for the 16-core H100 machine.)
#
# The kit and the PyTorch backend travel with the checkout in ignored folders (the GPU machine
# has no ../shared); prepare them beside the checkout and name .tkit and .tpeer in the device
# call's carry list:
#   echo /.tkit/ >>.git/info/exclude; echo /.tpeer/ >>.git/info/exclude
#   rm -rf .tkit .tpeer && cp -r ../shared/triton .tkit && cp -r ../shared/triton-peer .tpeer
# Environment: SERVING_KIT_DIR (default .tkit, or .tpeer/triton), SERVING_PEER_DIR (default
# .tpeer, or .tpeer/triton-peer), TORCHLOOM_AOTI_FIXTURES (default BUILD/aoti_fixtures: the
# mlp_cuda package of scripts/make_aoti_fixtures.py, which gpu.sh makes; without it the
# torch_aoti case skips), SERVING_WAIT_S (how long test and bench wait for the PyTorch
# backend's build: default 60, 150 in all), SERVING_TEST_S and SERVING_BENCH_S (the time test
# and bench keep to, default 190 each).
# Exit status 1 when the kit, configure, the build, a test or the benchmark failed.
set -euo pipefail

usage() {
  sed -n '2,23s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 2
}
(($# >= 2)) || usage
CMD=$1
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BUILD=$2
[[ $BUILD == /* ]] || BUILD="$ROOT/$BUILD"
OUT=${3:-}
case "$CMD" in
  prepare | test | bench | all) [[ -n $OUT ]] || usage ;;
  prefix) ;;
  *) usage ;;
esac
if [[ -n $OUT ]]; then
  mkdir -p "$OUT"
  OUT="$(cd "$OUT" && pwd)"
fi
STATE="$BUILD/serving"
KIT_PREFIX="$BUILD/triton-kit-gpu"
PEER_PREFIX="$BUILD/triton-peer"
KIT_DIR=${SERVING_KIT_DIR:-$ROOT/.tkit}
[[ -f $KIT_DIR/build.sh || ! -f $ROOT/.tpeer/triton/build.sh ]] || KIT_DIR=$ROOT/.tpeer/triton
PEER_DIR=${SERVING_PEER_DIR:-$ROOT/.tpeer}
[[ -f $PEER_DIR/build.sh || ! -f $PEER_DIR/triton-peer/build.sh ]] || PEER_DIR=$PEER_DIR/triton-peer
JOBS="$(nproc)"
START=$SECONDS
BUDGET_S=${4:-480}
SERVING_TARGETS=(triton_torchloom torchloom_triton_tests torchloom_triton_serving_tests bm_triton)

note() { printf '[serving %3ds] %s\n' $((SECONDS - START)) "$*"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }
if [[ -d /usr/local/cuda/bin && ":$PATH:" != *":/usr/local/cuda/bin:"* ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export TORCHLOOM_AOTI_FIXTURES="${TORCHLOOM_AOTI_FIXTURES:-$BUILD/aoti_fixtures}"

kit_built() { [[ -f $KIT_PREFIX/lib/cmake/TritonKit/TritonKitConfig.cmake ]]; }

# The kit with CUDA (synchronous: configuring the backend needs it). Its output to stderr.
build_kit() {
  if [[ ! -f $KIT_DIR/build.sh ]]; then
    note "no $KIT_DIR/build.sh: the Triton kit did not travel; the serving stage is left out" >&2
    return 2
  fi
  note "Triton kit with CUDA: $KIT_DIR -> $KIT_PREFIX" >&2
  mkdir -p "$BUILD"
  TRITON_KIT_DEPS_DIR="$KIT_DIR/debs" TRITON_KIT_GPU=1 TRITON_KIT_JOBS="$JOBS" \
    bash "$KIT_DIR/build.sh" "$KIT_PREFIX" >&2
}

# Triton's PyTorch backend (main, pip torch), detached: its output and exit status go to
# STATE/peer.log and STATE/peer.status, so that a caller capturing stdout does not wait for it.
start_peer() {
  mkdir -p "$STATE"
  rm -f "$STATE/peer.status"
  if [[ ! -f $PEER_DIR/build.sh ]]; then
    note "no $PEER_DIR/build.sh: Triton's PyTorch backend did not travel" >&2
    echo "absent" >"$STATE/peer.status"
    return 0
  fi
  note "Triton's PyTorch backend (main, pip torch) in the background: $PEER_PREFIX" >&2
  setsid bash -c 'TRITON_PEER_TORCH=pip TRITON_KIT_PREFIX="$1" TRITON_PEER_JOBS="$2" \
      timeout 400 bash "$3/build.sh" "$4"; echo $? >"$5.tmp"; mv "$5.tmp" "$5"' \
    peer "$KIT_PREFIX" "$JOBS" "$PEER_DIR" "$PEER_PREFIX" "$STATE/peer.status" \
    >"$STATE/peer.log" 2>&1 </dev/null &
}

# Waits up to $1 seconds for the PyTorch backend's build; exports TORCHLOOM_TRITON_PEER when
# it built. Says how it went on stdout.
await_peer() {
  local wait_s=$1 waited=0
  if [[ ! -f $STATE/peer.status && ! -f $STATE/peer.log ]]; then
    note "Triton's PyTorch backend was not started (no prepare): its cases skip"
    return 0
  fi
  while [[ ! -f $STATE/peer.status ]] && ((waited < wait_s)); do
    sleep 1
    waited=$((waited + 1))
  done
  local status
  status=$(cat "$STATE/peer.status" 2>/dev/null || echo "still building after ${wait_s}s")
  if [[ $status == 0 ]]; then
    export TORCHLOOM_TRITON_PEER="$PEER_PREFIX"
    note "Triton's PyTorch backend: ok ($PEER_PREFIX/backends/pytorch)"
  else
    note "Triton's PyTorch backend: not built ($status): the side-by-side cases and T15 skip"
    if [[ -f $STATE/peer.log ]]; then tail -n 8 "$STATE/peer.log" | cut -c1-200; fi
  fi
}

build_targets() {
  local targets=("${SERVING_TARGETS[@]}")
  grep -q 'triton_minimal' "$BUILD/build.ninja" && targets+=(triton_minimal)
  note "build ${targets[*]}"
  local rc=0
  ninja -C "$BUILD" -j"$JOBS" -k 0 "${targets[@]}" >"$STATE/build.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    note "build FAILED (status $rc); first errors:"
    { grep -E -A6 'error:|FAILED:|undefined reference' "$STATE/build.log" || true; } |
      head -n 60 | cut -c1-300
  fi
  return "$rc"
}

# The triton.* CTest cases with the PyTorch backend; summary on stdout and in
# OUT/serving-tests.txt.
run_tests() {
  local t=$1 rc=0
  note "ctest -R '^triton\\.' (${t}s at most)"
  timeout "$t" ctest --test-dir "$BUILD" -R '^triton\.' -V --timeout 150 \
    >"$STATE/ctest.log" 2>&1 || rc=$?
  {
    grep -E '^ *[0-9]+/[0-9]+ Test +#|tests passed|Total Test time' "$STATE/ctest.log" || true
    # The figures the reload cycles are judged on.
    grep -E -A1 'grew by' "$STATE/ctest.log" | grep -v '^--$' || true
    if ((rc != 0)); then
      echo "-- failures (all output in $STATE/ctest.log):"
      grep -E -B2 -A8 'FAILED:|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|SEGFAULT' \
        "$STATE/ctest.log" | head -n 80 || true
    fi
    echo "serving ctest status: $rc"
  } | cut -c1-220 | tee "$OUT/serving-tests.txt"
  return "$rc"
}

run_bench() {
  local t=$1 rc=0
  note "bm_triton (${t}s at most) -> $OUT/bm_triton.json"
  timeout "$t" "$BUILD/bench/bm_triton" --benchmark_format=console \
    --benchmark_out="$OUT/bm_triton.json" --benchmark_out_format=json \
    --benchmark_enable_random_interleaving=true >"$STATE/bench.log" 2>&1 || rc=$?
  { grep -E 'ERROR OCCURRED' "$STATE/bench.log" || true; } | cut -c1-220
  if ((rc != 0)); then
    note "bm_triton FAILED (status $rc); last lines:"
    tail -n 15 "$STATE/bench.log" | cut -c1-200
  fi
  return "$rc"
}

case "$CMD" in
  prefix)
    if kit_built; then echo "$KIT_PREFIX"; fi
    ;;
  prepare)
    rc=0
    build_kit || rc=$?
    if ((rc == 2)); then exit 0; fi
    if ((rc != 0)); then exit 1; fi
    start_peer
    echo "$KIT_PREFIX"
    ;;
  test)
    # Within SERVING_TEST_S (default 190: gpu.sh gives this call 200 s at most).
    BUDGET_S=${SERVING_TEST_S:-190}
    mkdir -p "$STATE"
    await_peer "$(min "${SERVING_WAIT_S:-60}" $(($(left) / 3)))"
    build_targets || exit 1
    run_tests $(($(left) - 5))
    ;;
  bench)
    BUDGET_S=${SERVING_BENCH_S:-190}
    mkdir -p "$STATE"
    await_peer "$(min "${SERVING_WAIT_S:-60}" $(($(left) / 3)))"
    [[ -x $BUILD/bench/bm_triton ]] || build_targets || exit 1
    run_bench $(($(left) - 5))
    ;;
  all)
    mkdir -p "$STATE"
    failed=()
    skipped=()
    finish() {
      local verdict="ok" skip="nothing"
      if ((${#failed[@]} > 0)); then verdict="FAILED: ${failed[*]}"; fi
      if ((${#skipped[@]} > 0)); then skip="${skipped[*]}"; fi
      note "serving result: $verdict; skipped: $skip ($((SECONDS - START))s of ${BUDGET_S}s)"
      if ((${#failed[@]} > 0)); then exit 1; fi
      exit 0
    }
    if ! TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"; then
      failed+=("torch (cannot import it with $(command -v python3))")
      finish
    fi
    rc=0
    build_kit >"$STATE/kit.log" 2>&1 || rc=$?
    tail -n 3 "$STATE/kit.log" | cut -c1-200
    if ((rc != 0)) || ! kit_built; then
      failed+=("kit")
      finish
    fi
    start_peer 2>&1
    note "configure $BUILD with the kit and pip torch"
    if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      "-DCMAKE_PREFIX_PATH=$KIT_PREFIX;$TORCH_PREFIX" -DTORCHLOOM_TRITON_BACKEND=ON \
      "-DTritonKit_DIR=$KIT_PREFIX/lib/cmake/TritonKit" -DTORCHLOOM_WERROR=ON \
      "-DTORCHLOOM_TRITON_KIT_SOURCES=$KIT_DIR/triton-src.tar.gz" \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      >"$STATE/configure.log" 2>&1; then
      { grep -E -A10 'CMake Error|Error:' "$STATE/configure.log" || true; } | head -n 40
      failed+=("configure")
      finish
    fi
    if ! build_targets; then
      failed+=("build")
      finish
    fi
    await_peer "$(min "${SERVING_WAIT_S:-150}" $(($(left) / 3)))"
    if [[ ! -f $TORCHLOOM_AOTI_FIXTURES/mlp_cuda/1/model.pt2 ]]; then
      skipped+=("torch_aoti side by side (no $TORCHLOOM_AOTI_FIXTURES/mlp_cuda)")
    fi
    t=$(min 240 $(($(left) - 100)))
    if ((t < 45)); then
      skipped+=("tests (no time left)")
    elif ! run_tests "$t"; then
      failed+=("tests")
    fi
    t=$(min 300 $(($(left) - 15)))
    if ((t < 60)); then
      skipped+=("bm_triton (no time left)")
    else
      run_bench "$t" || failed+=("bm_triton")
      if [[ -s $OUT/bm_triton.json ]]; then
        python3 scripts/report.py --out "$OUT/serving" "$OUT/bm_triton.json" || failed+=("report")
      fi
    fi
    finish
    ;;
esac
