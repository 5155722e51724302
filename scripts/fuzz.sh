#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: config.pbtxt, AOTInductor input metadata, option
# values) with clang, AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for
# SECONDS (default 60) on its seed corpus and dictionary. Exits non-zero on any finding
# (crash, sanitizer report, leak, timeout of one input); the reproducer is left in
# build-fuzz/findings/. Usage: ./scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pbtxt aoti_metadata options)

# clang and its libFuzzer runtime (Debian 12: clang-14 and libclang-rt-14-dev).
if ! command -v clang++ >/dev/null || [ ! -x /usr/bin/time ] || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq clang libclang-rt-14-dev
fi
bash scripts/bootstrap.sh   # LibTorch, Boost 1.81 (the parsers include them), CMake, ninja

build=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTORCHLOOM_BUILD_FUZZERS=ON -DTORCHLOOM_BUILD_TESTS=OFF -DTORCHLOOM_BUILD_BENCHMARKS=OFF \
  -DTORCHLOOM_BUILD_EXAMPLES=OFF -DTORCHLOOM_HEADER_TESTS=OFF >/dev/null
cmake --build "$build" --target $(printf 'fuzz_%s ' "${targets[@]}")

mkdir -p "$build/findings"
status=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"   # grows as the fuzzer finds new coverage; the seeds stay in git
  mkdir -p "$corpus"
  echo "== fuzz_$t: ${seconds} s =="
  log="$build/fuzz_$t.log"
  if ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1" \
     UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
     /usr/bin/time -f "%U %S" -o "$build/fuzz_$t.cpu" \
     "$build/tests/fuzz/fuzz_$t" "$corpus" "tests/fuzz/corpus/$t" \
       -dict="tests/fuzz/dict/$t.dict" -max_total_time="$seconds" -max_len=4096 \
       -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$build/findings/$t-" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
    cpu=$(awk '{printf "%d", $1 + $2 + 0.5}' "$build/fuzz_$t.cpu")
    [ "$cpu" -gt 0 ] || cpu=1
    echo "fuzz_$t: no finding; $runs inputs in ${seconds} s: $((runs / seconds)) per second" \
      "($((runs / cpu)) per CPU second: $cpu s of CPU time)"
  else
    status=1
    tail -n 60 "$log"
    echo "fuzz_$t: FINDING (reproducer in $build/findings/; log $log)"
  fi
done
exit $status
