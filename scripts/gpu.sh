#!/usr/bin/env bash
# Builds and runs everything on the GPU machine: configure, build, the tests (ctest, [cuda]
# tests included), then every bench/bm_* benchmark and the Python peers, then the report.
#
#   OUT=/some/dir bash scripts/gpu.sh [all|build|test|bench]   (from the repository root;
#                                                                OUT defaults to ./out-gpu)
#
#   all    (the default) every phase in one call, as far as the time budget goes;
#   build  configure, build, and make the fixtures (in the background while the C++ builds);
#   test   ctest and the corrupted model files; builds first where needed; the summary is
#          kept in the build tree for the report;
#   bench  the serving stage's tests, the benchmarks, the peers and the report (the test
#          phase's summary included); builds first where needed.
# A machine lent for one call at a time runs the phases in calls back to back on the warm
# machine (the build tree and the fixtures stay between them), each well inside the call's
# limit; the last prints the one report.
#
# Everything goes to $OUT/gpu-log.txt; stdout stays short (machine, step times, test summary,
# failures) and ends with the report's Markdown table. $OUT receives: gpu-log.txt, the test
# phase's gpu-test-summary.txt and serving-tests.txt, report.md, latency.png and offload.png
# (when matplotlib is installed), and bench-json.tgz, the benchmarks' and peers' JSON files
# (bm_<name>.json; scripts/report.py makes the report again from them).
# The fixtures (AOTInductor packages, bm_graphs' ResNet-18 models, bm_offload's package, the
# real architectures of the [transformers] tests and T14's Llama decoders) are made by the
# scripts/make_*_fixture(s).py scripts into $BUILD while the C++ builds; each keeps a stamp
# and makes nothing when it is up to date.
# Where the Triton kits travel with the checkout (.tkit: ../shared/triton; .tpeer: that and
# ../shared/triton-peer), scripts/gpu-serving.sh builds the GPU Triton core, Triton's PyTorch
# backend and torchloom's backend, and runs the serving tests and benchmarks.
# Exit status: 1 when configure, build, the fixtures, a test or a benchmark failed. A test
# failure does not stop the benchmarks, so one run gives all there is to know.
#
#   GPU_SH_SANITIZE=1 bash scripts/gpu.sh    builds, then runs the CUDA tests under
#                                             compute-sanitizer (memcheck and synccheck)
#                                             instead of ctest and the benchmarks; exit
#                                             status 1 when a tool reports an error or a
#                                             test fails under it. Where one call's limit
#                                             is too short for all of it, two calls split
#                                             it: GPU_SH_SANITIZE=hazards (the [hazards]
#                                             cases: concurrency and failure), then
#                                             GPU_SH_SANITIZE=rest (every other CUDA test).
#   GPU_SH_BENCHES="bm_graphs bm_triton" bash scripts/gpu.sh bench
#                                             only those benchmark programs (bm_triton: the
#                                             serving stage's; bm_offload brings its Python
#                                             peers), for a second look at a few targets
#                                             within a short budget; the report says which
#                                             ran. Unset: all of them.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PHASE="${1:-all}"
case "$PHASE" in
  all | build | test | bench) ;;
  *)
    echo "usage: bash scripts/gpu.sh [all|build|test|bench]" >&2
    exit 2
    ;;
esac
OUT="${OUT:-$PWD/out-gpu}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu-log.txt"
: >"$LOG"
# Results of an earlier run in the same directory must not reach this run's report.
rm -f "$OUT"/bm_*.json "$OUT/report.md" "$OUT/latency.png" "$OUT/offload.png"
BUILD=build-gpu
JOBS="$(nproc)"
# The caller's limit is 10 minutes a call; stop starting work well before it.
BUDGET_S="${GPU_SH_BUDGET_S:-575}"
START=$SECONDS
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
TEST_SUMMARY="$BUILD/gpu-test-summary.txt"

say() { printf '%s\n' "$*" | tee -a "$LOG"; }  # stdout and log
log() { printf '%s\n' "$*" >>"$LOG"; }         # log only
step() { say "== [$((SECONDS - START))s] $*"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }
# Shows the first N characters of stdin on stdout (and in the log). Reads all of it, so the
# writer never dies of SIGPIPE (which pipefail would turn into a failure).
show() {
  local text
  text=$(cat)
  if [[ -n $text ]]; then printf '%s\n' "${text:0:$1}" | tee -a "$LOG"; fi
}

# run_logged FILE CMD...: runs CMD with its output streamed to the log (so it survives a
# kill) and to FILE; returns CMD's status.
run_logged() {
  local file=$1
  shift
  log "\$ $*"
  local rc=0
  "$@" 2>&1 | tee "$file" >>"$LOG" || rc=$?
  return "$rc"
}

# finish STATUS MESSAGE: the closing line, for a run that stops before the report.
finish() {
  say "== result: $2 ($((SECONDS - START))s)"
  exit "$1"
}

# ---------------------------------------------------------------------------------------
step "machine (phase: $PHASE)"
if [[ -d /usr/local/cuda/bin && ":$PATH:" != *":/usr/local/cuda/bin:"* ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# torch's CMake config otherwise compiles and runs a probe to detect the architecture.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
say "gpu:   $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 \
  | paste -sd ';' || true)"
say "torch: $(python3 -c 'import torch
print(torch.__version__, "| CUDA", torch.version.cuda, "| available:",
      torch.cuda.is_available(), "| devices:", torch.cuda.device_count())' 2>&1 | tail -1 \
  || true)"
say "tools: $(cmake --version | head -1), $(g++ --version | head -1), ninja $(ninja --version), \
nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' || echo '?')"
if ! TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>>"$LOG")"
then
  finish 1 "cannot import torch with $(command -v python3)"
fi
log "torch CMake prefix: $TORCH_PREFIX"

# Where the serving stage is there: it starts building the GPU Triton core and Triton's
# PyTorch backend in the background now (the core is needed to configure the backend), and
# prints the prefix to configure with; nothing where the kits did not travel.
# A build (prepare_serving, after the fixtures have started) builds the kit; the other
# phases find it.
SERVING=""
prepare_serving() {
  [[ -f scripts/gpu-serving.sh ]] || return 0
  SERVING="$(bash scripts/gpu-serving.sh prepare "$BUILD" "$OUT" 2>>"$LOG" || true)"
  if [[ -n $SERVING ]]; then say "serving: Triton kit at $SERVING"; fi
}
if [[ -f scripts/gpu-serving.sh && $PHASE != build && $PHASE != all ]]; then
  SERVING="$(bash scripts/gpu-serving.sh prefix "$BUILD" 2>>"$LOG" || true)"
fi

# ---------------------------------------------------------------------------------------
configure() {
  step "configure ($BUILD)"
  # CMAKE_POLICY_VERSION_MINIMUM: CMake 4 refuses package configs that still ask for a
  # policy level below 3.5; this lifts them instead of failing.
  local prefix="$TORCH_PREFIX"
  if [[ -n $SERVING ]]; then prefix="$SERVING;$prefix"; fi
  # The Triton kit's sources (for Triton's stock minimal backend, T13's measure of what
  # Triton itself costs) where the kit travelled with the checkout.
  local kit_sources=() d
  for d in .tkit .tpeer/triton; do
    if [[ -f $d/triton-src.tar.gz ]]; then
      kit_sources=("-DTORCHLOOM_TRITON_KIT_SOURCES=$PWD/$d/triton-src.tar.gz")
      break
    fi
  done
  local rc=0
  run_logged "$SCRATCH/configure.txt" cmake -S . -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix" -DTORCHLOOM_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${kit_sources[@]}" \
    || rc=$?
  if ((rc != 0)); then
    say "configure failed (status $rc):"
    grep -E -A10 'CMake Error|Error:' "$SCRATCH/configure.txt" | show 6000 || true
    finish 1 "configure FAILED"
  fi
  if grep -q 'TORCHLOOM_HAS_CUDA=1' "$BUILD/build.ninja" 2>/dev/null; then
    say "torchloom::cuda: yes (CUDA toolkit and a CUDA build of torch found)"
  else
    say "torchloom::cuda: NO -- CUDA code is compiled out; [cuda] tests will skip"
  fi
}

# The fixtures: name, the script that makes them, and the environment variable the tests
# and benchmarks find them by. Each script keeps a stamp: up to date, it returns at once.
# transformer: the real architectures of the [transformers] tests (GPT-2, BERT, Llama, T5,
# MobileNet; one process each) beside the AOTI packages; llm: T14's Llama decoders beside
# bm_offload's package.
FIXTURE_NAMES=(aoti graph offload transformer llm)
declare -A FIXTURE_SCRIPT=([aoti]=make_aoti_fixtures.py [graph]=make_graph_fixtures.py
  [offload]=make_offload_fixture.py [transformer]=make_transformer_fixtures.py
  [llm]=make_transformer_fixtures.py)
declare -A FIXTURE_ARG=([transformer]=matrix [llm]=llm)
declare -A FIXTURE_VAR=([aoti]=TORCHLOOM_AOTI_FIXTURES [graph]=TORCHLOOM_GRAPH_FIXTURES
  [offload]=TORCHLOOM_OFFLOAD_FIXTURES)
declare -A FIXTURE_DIR=([aoti]=aoti_fixtures [graph]=graph_fixtures
  [offload]=offload_fixtures [transformer]=aoti_fixtures [llm]=offload_fixtures)
declare -A FIXTURE_PID=()
for f in "${!FIXTURE_VAR[@]}"; do export "${FIXTURE_VAR[$f]}=$PWD/$BUILD/${FIXTURE_DIR[$f]}"; done

# Starts the fixture scripts in the background: those that need nothing of the build at once
# (`early`, before configure), the AOTInductor one after the op library that one package calls
# (it exports with the library loaded).
start_fixtures() {
  local part=$1
  if [[ $part == early ]]; then fixtures_began=$SECONDS; fi
  mkdir -p "$BUILD"  # the early ones write into it before configure makes it
  local args=()
  if [[ $part == late ]]; then
    if run_logged "$SCRATCH/op-library.txt" ninja -C "$BUILD" -j"$JOBS" tl_test_ops; then
      args=(--op-library "$BUILD/tests/plugins/libtl_test_ops.so")
    else
      say "fixtures: the tl_test op library did not build; lookup_cpu is left out"
    fi
  fi
  for f in "${FIXTURE_NAMES[@]}"; do
    if [[ ($part == early && $f == aoti) || ($part == late && $f != aoti) ]]; then continue; fi
    local script="scripts/${FIXTURE_SCRIPT[$f]}"
    [[ -f $script ]] || continue
    local extra=()
    if [[ $f == aoti ]]; then extra=("${args[@]}"); fi
    if [[ -n ${FIXTURE_ARG[$f]:-} ]]; then extra=("${FIXTURE_ARG[$f]}"); fi
    # Some twenty packages compile beside the C++ build, each in its own process: inductor
    # compiles a package's kernels in that process (one compile thread), without a pool of
    # worker processes that each import torch again; the processes share the cores.
    # Its CPU time (the script's processes, inductor's compilers included) is the last line.
    {
      TIMEFORMAT="fixture cpu: %U s user, %S s system, %R s wall"
      time TORCHINDUCTOR_COMPILE_THREADS=1 timeout 480 python3 "$script" \
        "$PWD/$BUILD/${FIXTURE_DIR[$f]}" "${extra[@]}"
    } >"$SCRATCH/fixtures-$f.txt" 2>&1 &
    FIXTURE_PID[$f]=$!
  done
  step "fixtures started in the background ($part): ${!FIXTURE_PID[*]}"
}

# Waits for the fixture jobs and says how each went; 1 when one failed.
await_fixtures() {
  local failed=0
  for f in "${FIXTURE_NAMES[@]}"; do
    [[ -n ${FIXTURE_PID[$f]:-} ]] || continue
    local rc=0
    wait "${FIXTURE_PID[$f]}" || rc=$?
    cat "$SCRATCH/fixtures-$f.txt" >>"$LOG"
    if ((rc == 0)); then
      say "$f fixtures: ok (done $((SECONDS - fixtures_began))s after they started;" \
        "$(grep -o 'fixture cpu: .*' "$SCRATCH/fixtures-$f.txt" | tail -1 | cut -c14-))"
    else
      failed=1
      say "$f fixtures: FAILED (status $rc); the tests and benchmarks that need them skip:"
      tail -n 12 "$SCRATCH/fixtures-$f.txt" | cut -c1-240 | show 3000
    fi
  done
  return "$failed"
}

build() {
  step "build (ninja -j$JOBS)"
  local rc=0
  # -k 0: build all that can be built, so one call shows every compile error.
  run_logged "$SCRATCH/build.txt" ninja -C "$BUILD" -j"$JOBS" -k 0 || rc=$?
  if ((rc != 0)); then
    for pid in "${FIXTURE_PID[@]}"; do kill "$pid" 2>/dev/null || true; done
    say "build failed (status $rc); first errors:"
    grep -E -A6 'error:|FAILED:|undefined reference|ninja: build stopped' "$SCRATCH/build.txt" \
      | cut -c1-300 | show 7000 || true
    finish 1 "build FAILED"
  fi
  local steps
  steps=$(grep -c '^\[' "$SCRATCH/build.txt" || true)
  say "built ${steps:-0} steps"
  if ((${steps:-0} > 10)); then ninja_cpu_summary; fi
}

# Where the C++ build's time went: each step's seconds from ninja's log (this build's steps:
# the latest entry of each output), summed by target, largest first.
ninja_cpu_summary() {
  [[ -f $BUILD/.ninja_log ]] || return 0
  python3 - "$BUILD/.ninja_log" <<'PY' 2>>"$LOG" | show 1500 || true
import collections, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if not l.startswith("#")]
rows = [r for r in rows if len(r) >= 4]
if rows:
    last = {}
    for start, end, _, out, *rest in rows:  # the latest entry of each output
        last[out] = (int(start), int(end))
    by = collections.Counter()
    for out, (s, e) in last.items():
        parts = out.split("/CMakeFiles/")
        key = parts[1].split(".dir/")[0] if len(parts) > 1 else out.split("/")[0]
        by[key] += (e - s) / 1000
    total = sum(by.values())
    top = ", ".join(f"{k} {v:.0f}" for k, v in by.most_common(6))
    print(f"build steps: {total:.0f} s of compiler time in all (by target, s: {top})")
PY
}

# ---------------------------------------------------------------------------------------
# sanitize FILTER [VAR=VALUE...] -- [compute-sanitizer options...]: the tests FILTER picks,
# under compute-sanitizer with those options and the environment VARs; says the tool's error
# summary and the tests' own.
sanitize_failed=0
sanitize() {
  local filter=$1
  shift
  local vars=()
  while (($# > 0)) && [[ $1 != -- ]]; do
    vars+=("$1")
    shift
  done
  shift
  local t
  t=$(min 240 $(($(left) - 15)))
  if ((t < 30)); then
    say "$* $filter: no time left"
    sanitize_failed=1
    return
  fi
  local file="$SCRATCH/sanitize.txt" rc=0 began=$SECONDS
  run_logged "$file" timeout "$t" env "${vars[@]}" "$SANITIZER" "$@" --error-exitcode 3 \
    "$BUILD/tests/torchloom_tests" "$filter" || rc=$?
  local summary
  summary=$(grep -E 'ERROR SUMMARY|All tests passed|test cases' "$file" | tail -n 2 | tr '\n' ' ')
  say "${vars[*]} $* '$filter': status $rc in $((SECONDS - began))s; ${summary:-no summary (see gpu-log.txt)}"
  if ((rc != 0)); then sanitize_failed=1; fi
}

SANITIZE_PART="${GPU_SH_SANITIZE:-0}"
if [[ $SANITIZE_PART != 0 ]]; then
  case "$SANITIZE_PART" in
    1 | all | hazards | rest) ;;
    *) finish 1 "GPU_SH_SANITIZE: 1 (all), hazards or rest, not '$SANITIZE_PART'" ;;
  esac
  start_fixtures early
  prepare_serving
  configure
  start_fixtures late
  build
  await_fixtures || true
  step "compute-sanitizer ($SANITIZE_PART)"
  SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [[ ! -x $SANITIZER ]]; then finish 1 "compute-sanitizer not found"; fi
  # The stream and residency tests with torch's caching allocator off, so that freed memory is
  # really freed; the graph tests with it on (a graph keeps its memory in its private pool;
  # without the allocator graphed<S> runs eagerly). The tests whose capture fails by design
  # run apart, without reports of the API errors that failure is. [hazards]: the concurrency
  # and failure cases, first, under both tools; the [async] ones check that a call returns
  # while the GPU still runs what it queued, which the allocator off cannot show (its
  # cudaFree waits for the device), so they run with it on only.
  # The [transformers] cases (real architectures: minutes under the tool) are left out.
  if [[ $SANITIZE_PART != rest ]]; then
    sanitize "[hazards]~[graphs]~[async]" PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- --tool memcheck
    sanitize "[hazards]~[capture-fails]" -- --tool memcheck
    sanitize "[hazards]~[capture-fails]" -- --tool synccheck
    sanitize "[capture-fails]" -- --tool memcheck --report-api-errors no
  fi
  if [[ $SANITIZE_PART != hazards ]]; then
    sanitize "[stream][cuda]~[graphs]~[hazards],[streamed][cuda]~[transformers],[mapped][cuda]~[transformers]" \
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- --tool memcheck
    sanitize "[stream][cuda]~[graphs]~[hazards]" -- --tool synccheck
    sanitize "[graphs][cuda]~[capture-fails]~[hazards]" -- --tool memcheck
    sanitize "[graphs][cuda]~[capture-fails]~[hazards]" -- --tool synccheck
  fi
  if ((sanitize_failed != 0)); then finish 1 "compute-sanitizer reported errors or failures"; fi
  finish 0 "compute-sanitizer clean"
fi

# ---------------------------------------------------------------------------------------
# The test phase: its verdict goes to $TEST_SUMMARY, which the bench phase's report shows.
test_rc=0
fixtures_rc=0
build_all() {
  start_fixtures early
  prepare_serving
  configure
  start_fixtures late
  build
  await_fixtures || fixtures_rc=$?
  if ((fixtures_rc != 0)); then echo "fixtures FAILED" >"$BUILD/gpu-fixtures-failed"; fi
  if ((fixtures_rc == 0)); then rm -f "$BUILD/gpu-fixtures-failed"; fi
}

run_tests() {
  if [[ $PHASE == test ]]; then
    if [[ ! -f $BUILD/build.ninja ]]; then configure; fi
    build
    if [[ -f $BUILD/gpu-fixtures-failed ]]; then fixtures_rc=1; fi
  fi
  step "test (ctest -j12)"
  local t
  t=$(min 300 $(($(left) - 60)))
  if ((t < 60)); then
    say "no time left for the tests"
    test_rc=1
  else
    # The Triton backend's tests run in the serving stage, with Triton's PyTorch backend.
    local exclude=()
    if [[ -n $SERVING ]]; then exclude=(-E '^triton\.'); fi
    run_logged "$SCRATCH/ctest.txt" timeout "$t" \
      ctest --test-dir "$BUILD" --output-on-failure -j12 --timeout 150 "${exclude[@]}" \
      || test_rc=$?
    if ((test_rc == 124)); then say "ctest stopped after ${t}s"; fi
    {
      grep -E 'tests passed|Total Test time|No tests were found' "$SCRATCH/ctest.txt" || true
      sed -n '/The following tests did not run/,/^$/p' "$SCRATCH/ctest.txt"
      sed -n '/The following tests FAILED/,$p' "$SCRATCH/ctest.txt" | grep -v '^Errors while' \
        || true
    } | cut -c1-200 | show 3000
    if ((test_rc != 0)); then
      say "-- failing test output (first lines; all of it is in gpu-log.txt):"
      local failure='FAILED:|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Subprocess aborted'
      failure+='|Child aborted|unexpected exception|SEGFAULT|Segmentation fault'
      grep -E -A5 "$failure" "$SCRATCH/ctest.txt" | cut -c1-240 | show 5000 || true
    fi
  fi
  # The 3,000 corrupted model files of the long mode, once with this machine's torch: each
  # loaded (and run) in a child process; none may crash, hang or take over 1 GiB.
  if [[ -x $BUILD/tests/torchloom_corrupt_models && -d tests/data/corrupt ]]; then
    step "corrupt models, seeds 0-2999"
    local rc=0
    run_logged "$SCRATCH/corrupt.txt" timeout "$(min 120 $(($(left) - 200)))" \
      "$BUILD/tests/torchloom_corrupt_models" 0 3000 --jobs 12 --bases tests/data/corrupt \
      || rc=$?
    grep -E '^corrupt models:' "$SCRATCH/corrupt.txt" | tail -1 | show 500
    if ((rc != 0)); then
      say "corrupt models: FAILED (status $rc)"
      test_rc=1
    fi
  fi
  {
    echo "tests (phase test, $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - START))s):"
    grep -E 'tests passed|tests failed' "$SCRATCH/ctest.txt" 2>/dev/null | tail -1 || true
    sed -n '/The following tests FAILED/,$p' "$SCRATCH/ctest.txt" 2>/dev/null \
      | grep -v '^Errors while' | head -20 || true
    grep -E '^corrupt models:' "$SCRATCH/corrupt.txt" 2>/dev/null | tail -1 || true
    if ((fixtures_rc != 0)); then echo "fixtures: a fixture script FAILED (see gpu-log.txt)"; fi
    echo "ctest status: $test_rc"
  } >"$TEST_SUMMARY"
  cp "$TEST_SUMMARY" "$OUT/"
}

# The serving stage's tests (the backend in the GPU Triton core, beside Triton's PyTorch
# backend) open the bench phase, which the serving benchmarks end: the test phase then fits
# one call with the build. Their verdict is added to the test phase's summary.
run_serving_tests() {
  [[ -n $SERVING ]] || return 0
  step "serving tests (scripts/gpu-serving.sh test)"
  local rc=0
  run_logged "$SCRATCH/serving-test.txt" timeout "$(min 200 $(($(left) - 20)))" \
    bash scripts/gpu-serving.sh test "$BUILD" "$OUT" || rc=$?
  tail -n 15 "$SCRATCH/serving-test.txt" | cut -c1-200 | show 3000
  local line
  line=$(grep -E 'tests passed|tests failed' "$SCRATCH/serving-test.txt" | tail -1 || true)
  if ((rc != 0)); then line="serving tests FAILED (status $rc): ${line:-see gpu-log.txt}"; fi
  if [[ -f $TEST_SUMMARY ]]; then
    sed -i '/^serving tests/d' "$TEST_SUMMARY"
    echo "serving tests: ${line:-none ran}" >>"$TEST_SUMMARY"
    cp "$TEST_SUMMARY" "$OUT/"
  fi
  if ((rc != 0)); then serving_test_rc=1; fi
}
serving_test_rc=0

# ---------------------------------------------------------------------------------------
# The bench phase.
# Whether benchmark program $1 is to run: GPU_SH_BENCHES names them, else all run.
selected() { [[ -z ${GPU_SH_BENCHES:-} || " $GPU_SH_BENCHES " == *" $1 "* ]]; }
bench_total=0
bench_failed=0
run_benchmarks() {
  step "benchmarks"
  shopt -s nullglob
  # The short ones first: when time runs out, the fewest results are lost.
  local benches=() exe
  for name in bm_streams bm_graphs bm_overhead bm_aoti bm_offload bm_isolation bm_triton; do
    [[ -x "$BUILD/bench/$name" ]] && benches+=("$BUILD/bench/$name")
  done
  for exe in "$BUILD"/bench/bm_*; do
    [[ " ${benches[*]} " == *" $exe "* ]] || benches+=("$exe")
  done
  if [[ -n ${GPU_SH_BENCHES:-} ]]; then say "benchmarks: only $GPU_SH_BENCHES (GPU_SH_BENCHES)"; fi
  # bm_triton runs in the serving stage, beside Triton's PyTorch backend.
  if [[ -n $SERVING ]]; then
    local kept=()
    for exe in "${benches[@]}"; do [[ $(basename "$exe") == bm_triton ]] || kept+=("$exe"); done
    benches=("${kept[@]}")
  fi
  for exe in "${benches[@]}"; do
    [[ -f $exe && -x $exe ]] || continue
    local name
    name=$(basename "$exe")
    selected "$name" || continue
    bench_total=$((bench_total + 1))
    local t
    t=$(min 200 $(($(left) - 20)))
    if ((t < 30)); then
      say "$name: not run, no time left"
      bench_failed=$((bench_failed + 1))
      continue
    fi
    local began=$SECONDS rc=0
    # Random interleaving runs the repetitions of all benchmarks in a shuffled order, so a
    # raw call and its runner share the machine's drift instead of running minutes apart.
    run_logged "$SCRATCH/$name.txt" timeout "$t" "$exe" --benchmark_format=console \
      --benchmark_out="$OUT/$name.json" --benchmark_out_format=json \
      --benchmark_enable_random_interleaving=true || rc=$?
    if ((rc == 0)); then
      local skipped
      skipped=$(grep -c 'ERROR OCCURRED' "$SCRATCH/$name.txt" || true)
      local note=""
      if ((${skipped:-0} > 0)); then note=", $skipped runs skipped with an error"; fi
      say "$name: ok ($((SECONDS - began))s$note)"
    else
      bench_failed=$((bench_failed + 1))
      say "$name: FAILED (status $rc after $((SECONDS - began))s); last lines:"
      tail -n 15 "$SCRATCH/$name.txt" | cut -c1-200 | show 3000
    fi
  done
  shopt -u nullglob
  if ((bench_total == 0)); then say "no benchmarks found in $BUILD/bench"; fi

  # The Python peers: accelerate's cpu_offload on bm_offload's layers (T5) and on the
  # transformer that does not fit (T14, --model llama), each into a JSON file beside the
  # benchmarks'. A missing accelerate or CUDA is an entry the report shows as skipped (status
  # 0); a nonzero status is a failed benchmark.
  local peer
  for peer in offload_peer offload_peer_llama; do
    selected bm_offload || continue
    local args=(--out "$OUT/bm_${peer}.json")
    if [[ $peer == offload_peer_llama ]]; then args+=(--model llama); fi
    t=$(min 150 $(($(left) - 20)))
    if ((t < 60)); then
      say "$peer: not run, $(left)s left (the report shows its targets as not measured)"
      continue
    fi
    bench_total=$((bench_total + 1))
    local began=$SECONDS rc=0
    run_logged "$SCRATCH/$peer.txt" timeout "$t" python3 scripts/offload_peer.py "${args[@]}" \
      || rc=$?
    if ((rc == 0)); then
      say "$peer: ok ($((SECONDS - began))s): $(tail -n 1 "$SCRATCH/$peer.txt" | cut -c1-300)"
    else
      bench_failed=$((bench_failed + 1))
      say "$peer: FAILED (status $rc after $((SECONDS - began))s); last lines:"
      tail -n 15 "$SCRATCH/$peer.txt" | cut -c1-200 | show 3000
    fi
  done

  if [[ -n $SERVING ]] && selected bm_triton; then
    step "serving benchmarks (scripts/gpu-serving.sh bench)"
    local rc=0
    run_logged "$SCRATCH/serving-bench.txt" timeout "$(min 200 $(($(left) - 20)))" \
      bash scripts/gpu-serving.sh bench "$BUILD" "$OUT" || rc=$?
    tail -n 10 "$SCRATCH/serving-bench.txt" | cut -c1-200 | show 2000
    bench_total=$((bench_total + 1))
    if ((rc != 0)); then bench_failed=$((bench_failed + 1)); fi
  fi
}

report() {
  step "report"
  local status=0
  local verdict="build ok"
  if [[ -f $TEST_SUMMARY ]]; then
    verdict+="; $(grep -E 'tests passed|tests failed' "$TEST_SUMMARY" | tail -1 | sed 's/^ *//')"
    if ! grep -q 'ctest status: 0' "$TEST_SUMMARY"; then status=1; fi
    if grep -q 'FAILED' "$TEST_SUMMARY"; then status=1; fi
  else
    verdict+="; tests not run (no test phase in this build tree)"
  fi
  if ((serving_test_rc != 0)); then
    status=1
    verdict+="; serving tests FAILED"
  fi
  if ((bench_failed != 0)); then
    status=1
    verdict+="; benchmarks: $bench_failed of $bench_total FAILED"
  else
    verdict+="; benchmarks: $bench_total ok"
  fi
  say "== result: $verdict ($((SECONDS - START))s)"
  if [[ -f $TEST_SUMMARY ]]; then show 3000 <"$TEST_SUMMARY"; fi
  say ""
  local jsons=() j
  for j in "$OUT"/bm_*.json; do [[ -s $j ]] && jsons+=("$j"); done
  if ((${#jsons[@]} == 0)); then
    say "(no benchmark results to report)"
    exit 1
  fi
  local rc=0
  # The plots' titles name the GPU and torch's version.
  local gpu_name torch_version
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
  torch_version="$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
  python3 scripts/report.py --out "$OUT" --gpu "${gpu_name:-unknown GPU}" \
    --torch "${torch_version:-unknown}" "${jsons[@]}" 2>&1 | tee -a "$LOG" || rc=$?
  if ((rc != 0)); then status=1; fi
  # The results in one file: a caller that takes back only a few files gets them all.
  (cd "$OUT" && tar czf bench-json.tgz bm_*.json && rm -f bm_*.json) || true
  exit "$status"
}

case "$PHASE" in
  build)
    build_all
    finish "$fixtures_rc" "built; fixtures $( ((fixtures_rc == 0)) && echo ok || echo FAILED)"
    ;;
  test)
    run_tests
    status=0
    if ((fixtures_rc != 0 || test_rc != 0)); then status=1; fi
    finish "$status" "$(grep -E 'tests passed|tests failed' "$TEST_SUMMARY" | tail -1 \
      | sed 's/^ *//'); fixtures $( ((fixtures_rc == 0)) && echo ok || echo FAILED)"
    ;;
  bench)
    if [[ ! -f $BUILD/build.ninja ]]; then configure; fi
    build
    run_serving_tests
    run_benchmarks
    report
    ;;
  all)
    build_all
    run_tests
    run_serving_tests
    run_benchmarks
    report
    ;;
esac
