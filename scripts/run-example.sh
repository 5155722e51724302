#!/usr/bin/env bash
# The first command: installs what the example CLI needs (Debian 12), builds the CLI and the
# bundled model in build/, and runs the CLI on the model. Arguments go to the CLI. One line
# per phase; apt-get's, CMake's and the compiler's output go to build/run-example.log.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
progress_start run-example build/run-example.log
: >"$progress_log"
echo "run-example: the output of each step goes to $progress_log"

TORCHLOOM_LOG="$progress_log" bash scripts/bootstrap.sh --cli

if [ -f build/CMakeCache.txt ]; then
  # Configured before (by this script or by scripts/configure.sh): keep its settings.
  phase "configuring build/ (CMake)" cmake -S . -B build
else
  # The CLI alone: no tests or benchmarks (they need Catch2 and Google Benchmark), no
  # Triton backend. scripts/configure.sh turns them on in the same build/ later.
  phase "configuring build/ for the CLI (CMake)" cmake -S . -B build -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DTORCHLOOM_WERROR=ON -DTORCHLOOM_BUILD_TESTS=OFF \
    -DTORCHLOOM_BUILD_BENCHMARKS=OFF -DTORCHLOOM_HEADER_TESTS=OFF \
    -DTORCHLOOM_TRITON_BACKEND=OFF
fi
phase "building the CLI and the bundled model (about 3 minutes of CPU time, once)" \
  cmake --build build --target torchloom-run torchloom_bundled_model
echo "run-example: running build/examples/torchloom-run/torchloom-run $*"
exec build/examples/torchloom-run/torchloom-run "$@"
