#!/usr/bin/env bash
# Installs what torchloom needs on Debian 12, once; does nothing where it is all there.
#   bootstrap.sh          everything: the library, the CLI, the tests (Catch2) and the
#                         benchmarks (Google Benchmark)
#   bootstrap.sh --cli    only what the library and the example CLI need
# apt-get's output goes to a log (TORCHLOOM_LOG, default build/bootstrap.log): one line here
# while it works, and the log's tail if it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh

packages=(cmake ninja-build g++ libtorch-dev libboost1.81-dev)
case "${1:-}" in
  --cli) ;;
  "") packages+=(catch2 libbenchmark-dev) ;;
  *) echo "usage: bootstrap.sh [--cli]" >&2; exit 2 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
progress_start bootstrap "${TORCHLOOM_LOG:-build/bootstrap.log}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
  sudo -v  # asks for a password here, before the output goes to the log
fi
echo "bootstrap: installing ${missing[*]} and what they depend on with apt-get; its output: $progress_log"
phase "apt-get update" "${sudo[@]}" apt-get update
phase "apt-get install (LibTorch and Boost are most of it: a few minutes)" \
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
