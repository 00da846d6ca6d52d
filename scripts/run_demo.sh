#!/usr/bin/env bash
# Installs what is missing, builds the release preset, and runs the main job: the op
# benchmark table (fused vs unfused, ours vs oneDNN / copy). Extra arguments go to
# `tboost bench-ops` (e.g. --json, --filter rmsnorm, --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake --preset release -DTBOOST_BUILD_TESTS=ON -DTBOOST_BUILD_BENCH=ON >/dev/null
cmake --build --preset release --target tboost_cli   # only the CLI: the demo needs no tests
exec ./build/release/tools/tboost/tboost bench-ops "$@"
