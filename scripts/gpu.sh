#!/usr/bin/env bash
# Builds and runs everything on the GPU machine in one call: configure, build, the tests
# (ctest, [cuda] tests included), then every bench/bm_* benchmark and the Python peer of
# bm_offload (scripts/offload_peer.py), then the report.
#
#   OUT=/some/dir bash scripts/gpu.sh        (from the repository root; OUT defaults to
#                                             ./out-gpu)
#
# Everything goes to $OUT/gpu-log.txt; stdout stays short (machine, step times, test summary,
# failures) and ends with the report's Markdown table. $OUT receives: gpu-log.txt,
# bm_<name>.json per benchmark, bm_offload_peer.json and bm_offload_peer_llama.json,
# report.md, and latency.png and offload.png (when matplotlib is installed).
# The AOTInductor packages the tests and bm_aoti load are made by scripts/make_aoti_fixtures.py
# into $BUILD/aoti_fixtures while the C++ builds, bm_graphs' ResNet-18 models by
# scripts/make_graph_fixtures.py into $BUILD/graph_fixtures, bm_offload's package by
# scripts/make_offload_fixture.py into $BUILD/offload_fixtures, and the real architectures
# by scripts/make_transformer_fixtures.py (the tests' Hugging Face and torchvision models
# into $BUILD/aoti_fixtures, T14's Llama decoders into $BUILD/offload_fixtures).
# Exit status: 1 when configure, build, the AOTI fixtures, a test or a benchmark failed. A test
# failure does not stop the benchmarks, so one call gives all there is to know.
#
#   GPU_SH_SANITIZE=1 bash scripts/gpu.sh    builds, then runs the CUDA tests under
#                                             compute-sanitizer (memcheck and synccheck)
#                                             instead of ctest and the benchmarks; exit
#                                             status 1 when a tool reports an error or a
#                                             test fails under it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/out-gpu}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu-log.txt"
: >"$LOG"
# Results of an earlier run in the same directory must not reach this run's report.
rm -f "$OUT"/bm_*.json "$OUT/report.md" "$OUT/latency.png" "$OUT/offload.png"
BUILD=build-gpu
JOBS="$(nproc)"
# The caller's limit is 10 minutes; stop starting work well before it.
BUDGET_S="${GPU_SH_BUDGET_S:-575}"
START=$SECONDS
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT

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

# await_job PID OUTPUT WHAT IF_FAILED: waits for a background job started to make fixtures,
# appends its OUTPUT to the log and says how it went (IF_FAILED: what then does not run, and
# the output's last lines); returns the job's status.
await_job() {
  local rc=0
  wait "$1" || rc=$?
  cat "$2" >>"$LOG"
  if ((rc == 0)); then
    say "$3: ok (done $((SECONDS - fixtures_began))s after the fixtures started)"
  else
    say "$3: FAILED (status $rc); $4:"
    tail -n 12 "$2" | cut -c1-240 | show 3000
  fi
  return "$rc"
}

# finish STATUS MESSAGE: the closing line, for a run that stops before the report.
finish() {
  say "== result: $2 ($((SECONDS - START))s)"
  exit "$1"
}

# ---------------------------------------------------------------------------------------
step "machine"
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

# ---------------------------------------------------------------------------------------
step "configure ($BUILD)"
# CMAKE_POLICY_VERSION_MINIMUM: CMake 4 refuses package configs that still ask for a
# policy level below 3.5; this lifts them instead of failing.
rc=0
run_logged "$SCRATCH/configure.txt" cmake -S . -B "$BUILD" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX" -DTORCHLOOM_WERROR=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 || rc=$?
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

# ---------------------------------------------------------------------------------------
# The AOTInductor packages the tests and bm_aoti load: compiled by torch in Python (about a
# minute each), in the background while the C++ builds. Cached in $BUILD/aoti_fixtures.
FIXTURES="$PWD/$BUILD/aoti_fixtures"
export TORCHLOOM_AOTI_FIXTURES="$FIXTURES"
step "aoti fixtures: started in the background ($FIXTURES)"
fixtures_began=$SECONDS
# The op library first: the package that calls a custom operator is exported with it loaded.
fixture_args=()
if run_logged "$SCRATCH/op-library.txt" ninja -C "$BUILD" -j"$JOBS" tl_test_ops; then
  fixture_args=(--op-library "$BUILD/tests/plugins/libtl_test_ops.so")
else
  say "aoti fixtures: the tl_test op library did not build; lookup_cpu is left out"
fi
timeout 420 python3 scripts/make_aoti_fixtures.py "$FIXTURES" "${fixture_args[@]}" \
  >"$SCRATCH/fixtures.txt" 2>&1 &
fixtures_pid=$!
# The ResNet-18 models of bm_graphs (T12), likewise; without them those rows skip.
GRAPH_FIXTURES="$PWD/$BUILD/graph_fixtures"
export TORCHLOOM_GRAPH_FIXTURES="$GRAPH_FIXTURES"
step "graph fixtures: started in the background ($GRAPH_FIXTURES)"
timeout 420 python3 scripts/make_graph_fixtures.py "$GRAPH_FIXTURES" \
  >"$SCRATCH/graph-fixtures.txt" 2>&1 &
graph_fixtures_pid=$!
# bm_offload's AOTInductor package (16 x 8192 x 8192 bf16, 2 GiB, exported for streaming),
# likewise; without it bm_offload's large_aoti rows report why they did not run.
OFFLOAD_FIXTURES="$PWD/$BUILD/offload_fixtures"
export TORCHLOOM_OFFLOAD_FIXTURES="$OFFLOAD_FIXTURES"
step "offload fixture: started in the background ($OFFLOAD_FIXTURES)"
timeout 420 python3 scripts/make_offload_fixture.py "$OFFLOAD_FIXTURES" \
  >"$SCRATCH/offload-fixture.txt" 2>&1 &
offload_fixture_pid=$!
# The real architectures (GPT-2, BERT, Llama, T5, MobileNet; one process each), for the
# [transformers] tests, and T14's Llama decoders for bm_offload, likewise; without them those
# tests skip and the llama_aoti row reports why it did not run.
step "transformer fixtures: started in the background"
timeout 420 python3 scripts/make_transformer_fixtures.py "$FIXTURES" matrix \
  >"$SCRATCH/transformer-fixtures.txt" 2>&1 &
transformer_fixtures_pid=$!
timeout 420 python3 scripts/make_transformer_fixtures.py "$OFFLOAD_FIXTURES" llm \
  >"$SCRATCH/llm-fixtures.txt" 2>&1 &
llm_fixtures_pid=$!

# ---------------------------------------------------------------------------------------
step "build (ninja -j$JOBS)"
rc=0
# -k 0: build all that can be built, so one call shows every compile error.
run_logged "$SCRATCH/build.txt" ninja -C "$BUILD" -j"$JOBS" -k 0 || rc=$?
if ((rc != 0)); then
  kill "$fixtures_pid" "$graph_fixtures_pid" "$offload_fixture_pid" \
    "$transformer_fixtures_pid" "$llm_fixtures_pid" 2>/dev/null || true
  say "build failed (status $rc); first errors:"
  grep -E -A6 'error:|FAILED:|undefined reference|ninja: build stopped' "$SCRATCH/build.txt" \
    | cut -c1-300 | show 7000 || true
  finish 1 "build FAILED"
fi
say "built $(grep -c '^\[' "$SCRATCH/build.txt" || true) steps"

# ---------------------------------------------------------------------------------------
fixtures_rc=0
await_job "$fixtures_pid" "$SCRATCH/fixtures.txt" "aoti fixtures" \
  "the AOTI tests and benchmarks will skip" || fixtures_rc=$?
# Before the tests: some of them measure the device's free memory, which an export changes.
await_job "$offload_fixture_pid" "$SCRATCH/offload-fixture.txt" "offload fixture" \
  "bm_offload's large_aoti rows will not run" || true
await_job "$graph_fixtures_pid" "$SCRATCH/graph-fixtures.txt" "graph fixtures" \
  "bm_graphs' ResNet-18 rows will skip" || true
await_job "$transformer_fixtures_pid" "$SCRATCH/transformer-fixtures.txt" \
  "transformer fixtures" "the [transformers] tests will skip where a fixture is missing" \
  || fixtures_rc=$?
await_job "$llm_fixtures_pid" "$SCRATCH/llm-fixtures.txt" "llm fixtures" \
  "bm_offload's llama_aoti row (T14) will not run" || fixtures_rc=$?

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
  local file="$SCRATCH/sanitize.txt" rc=0
  run_logged "$file" timeout "$t" env "${vars[@]}" "$SANITIZER" "$@" --error-exitcode 3 \
    "$BUILD/tests/torchloom_tests" "$filter" || rc=$?
  local summary
  summary=$(grep -E 'ERROR SUMMARY|All tests passed|test cases' "$file" | tail -n 2 | tr '\n' ' ')
  say "${vars[*]} $* '$filter': status $rc; ${summary:-no summary (see gpu-log.txt)}"
  if ((rc != 0)); then sanitize_failed=1; fi
}

if [[ ${GPU_SH_SANITIZE:-0} == 1 ]]; then
  step "compute-sanitizer"
  SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [[ ! -x $SANITIZER ]]; then finish 1 "compute-sanitizer not found"; fi
  # The stream and residency tests with torch's caching allocator off, so that freed memory is
  # really freed; the graph tests with it on (a graph keeps its memory in its private pool;
  # without the allocator graphed<S> runs eagerly). The test whose capture fails by design
  # runs apart, without reports of the API errors that failure is.
  # The [transformers] cases (real architectures, minutes under the tool) are left out.
  sanitize "[stream][cuda]~[graphs],[streamed][cuda]~[transformers],[mapped][cuda]~[transformers]" \
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- --tool memcheck
  sanitize "[stream][cuda]~[graphs]" -- --tool synccheck
  sanitize "[graphs][cuda]~[capture-fails]" -- --tool memcheck
  sanitize "[capture-fails]" -- --tool memcheck --report-api-errors no
  sanitize "[graphs][cuda]" -- --tool synccheck
  if ((sanitize_failed != 0)); then finish 1 "compute-sanitizer reported errors or failures"; fi
  finish 0 "compute-sanitizer clean"
fi

# ---------------------------------------------------------------------------------------
step "test (ctest -j12)"
test_rc=0
t=$(min 300 $(($(left) - 120)))
if ((t < 60)); then
  say "no time left for the tests"
  test_rc=1
else
  run_logged "$SCRATCH/ctest.txt" timeout "$t" \
    ctest --test-dir "$BUILD" --output-on-failure -j12 --timeout 120 || test_rc=$?
  if ((test_rc == 124)); then say "ctest stopped after ${t}s"; fi
  {
    grep -E 'tests passed|Total Test time|No tests were found' "$SCRATCH/ctest.txt" || true
    sed -n '/The following tests did not run/,/^$/p' "$SCRATCH/ctest.txt"
    sed -n '/The following tests FAILED/,$p' "$SCRATCH/ctest.txt" | grep -v '^Errors while' \
      || true
  } | cut -c1-200 | show 3000
  if ((test_rc != 0)); then
    say "-- failing test output (first lines; all of it is in gpu-log.txt):"
    failure='FAILED:|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Subprocess aborted'
    failure+='|Child aborted|unexpected exception|SEGFAULT|Segmentation fault'
    grep -E -A5 "$failure" "$SCRATCH/ctest.txt" | cut -c1-240 | show 5000 || true
  fi
fi

# ---------------------------------------------------------------------------------------
step "benchmarks"
bench_total=0
bench_failed=0
shopt -s nullglob
# The short ones first: when time runs out, the fewest results are lost.
benches=()
for name in bm_streams bm_graphs bm_overhead bm_offload bm_isolation bm_aoti bm_triton; do
  [[ -x "$BUILD/bench/$name" ]] && benches+=("$BUILD/bench/$name")
done
for exe in "$BUILD"/bench/bm_*; do
  [[ " ${benches[*]} " == *" $exe "* ]] || benches+=("$exe")
done
for exe in "${benches[@]}"; do
  [[ -f $exe && -x $exe ]] || continue
  name=$(basename "$exe")
  bench_total=$((bench_total + 1))
  t=$(min 240 $(($(left) - 20)))
  if ((t < 30)); then
    say "$name: not run, no time left"
    bench_failed=$((bench_failed + 1))
    continue
  fi
  began=$SECONDS
  rc=0
  # Random interleaving runs the repetitions of all benchmarks in a shuffled order, so a
  # raw call and its runner share the machine's drift instead of running minutes apart.
  run_logged "$SCRATCH/$name.txt" timeout "$t" "$exe" --benchmark_format=console \
    --benchmark_out="$OUT/$name.json" --benchmark_out_format=json \
    --benchmark_enable_random_interleaving=true || rc=$?
  if ((rc == 0)); then
    skipped=$(grep -c 'ERROR OCCURRED' "$SCRATCH/$name.txt" || true)
    note=""
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

# The Python peer of bm_offload (T5): accelerate's cpu_offload on the same layers, into
# bm_offload_peer.json beside bm_offload.json. A missing accelerate or CUDA is an entry the
# report shows as skipped (status 0); a nonzero status is a failed benchmark.
t=$(min 150 $(($(left) - 20)))
if ((t < 60)); then
  say "offload_peer.py: not run, $(left)s left (the report shows T5 as not measured)"
else
  bench_total=$((bench_total + 1))
  began=$SECONDS
  rc=0
  run_logged "$SCRATCH/offload_peer.txt" timeout "$t" python3 scripts/offload_peer.py \
    --out "$OUT/bm_offload_peer.json" || rc=$?
  if ((rc == 0)); then
    say "offload_peer.py: ok ($((SECONDS - began))s): $(tail -n 1 "$SCRATCH/offload_peer.txt" \
      | cut -c1-300)"
  else
    bench_failed=$((bench_failed + 1))
    say "offload_peer.py: FAILED (status $rc after $((SECONDS - began))s); last lines:"
    tail -n 15 "$SCRATCH/offload_peer.txt" | cut -c1-200 | show 3000
  fi
fi

# T14's peer: accelerate's cpu_offload on the Llama decoder of bm_offload's llama_aoti row.
t=$(min 150 $(($(left) - 20)))
if ((t < 60)); then
  say "offload_peer.py --model llama: not run, $(left)s left (the report shows T14's ratio as \
not measured)"
else
  bench_total=$((bench_total + 1))
  began=$SECONDS
  rc=0
  run_logged "$SCRATCH/offload_peer_llama.txt" timeout "$t" python3 scripts/offload_peer.py \
    --model llama --out "$OUT/bm_offload_peer_llama.json" || rc=$?
  if ((rc == 0)); then
    say "offload_peer.py --model llama: ok ($((SECONDS - began))s): \
$(tail -n 1 "$SCRATCH/offload_peer_llama.txt" | cut -c1-300)"
  else
    bench_failed=$((bench_failed + 1))
    say "offload_peer.py --model llama: FAILED (status $rc after $((SECONDS - began))s); \
last lines:"
    tail -n 15 "$SCRATCH/offload_peer_llama.txt" | cut -c1-200 | show 3000
  fi
fi

# ---------------------------------------------------------------------------------------
status=0
verdict="build ok"
if ((fixtures_rc != 0)); then
  status=1
  verdict+="; fixtures FAILED (aoti, transformer or llm)"
fi
if ((test_rc != 0)); then
  status=1
  verdict+="; tests FAILED (ctest status $test_rc)"
else
  verdict+="; tests ok"
fi
if ((bench_failed != 0)); then
  status=1
  verdict+="; benchmarks: $bench_failed of $bench_total FAILED"
else
  verdict+="; benchmarks: $bench_total ok"
fi
step "report"
say "== result: $verdict ($((SECONDS - START))s)"
say ""
jsons=()
for j in "$OUT"/bm_*.json; do [[ -s $j ]] && jsons+=("$j"); done
if ((${#jsons[@]} == 0)); then
  say "(no benchmark results to report)"
  exit 1
fi
rc=0
# The plots' titles name the GPU and torch's version.
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
torch_version="$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
python3 scripts/report.py --out "$OUT" --gpu "${gpu_name:-unknown GPU}" \
  --torch "${torch_version:-unknown}" "${jsons[@]}" 2>&1 | tee -a "$LOG" || rc=$?
if ((rc != 0)); then status=1; fi
exit "$status"
