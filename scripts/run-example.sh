#!/usr/bin/env bash
# Sets up, builds the example CLI and runs it on the bundled model. Arguments go to the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/configure.sh >/dev/null
cmake --build build --target torchloom-run
exec build/examples/torchloom-run/torchloom-run "$@"
