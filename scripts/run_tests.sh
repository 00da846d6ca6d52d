#!/usr/bin/env bash
# Installs what is missing, builds and runs the whole test suite: the release build, the
# same tests under AddressSanitizer + UBSan, a smoke run of the benchmark CLI, and an
# engine-style consumer built against the installed package (find_package(tboost)).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
JOBS="${TBOOST_JOBS:-2}"

echo "== release build + tests"
cmake --preset release -DTBOOST_BUILD_TESTS=ON -DTBOOST_BUILD_BENCH=ON >/dev/null
cmake --build --preset release -j "$JOBS"
ctest --preset release -j 1

echo "== bench CLI smoke run"
./build/release/tools/tboost/tboost bench-ops --quick --filter 'limits|rmsnorm_f32' --json >/dev/null
./build/release/tools/tboost/tboost bench-ops --quick --json \
  --filter 'attention_prefill_causal_bf16_vs_f32\[H=12|decode_attention_f32cache\[H=32,Hkv=8' >/dev/null
./build/release/tools/tboost/tboost bench-ops --quick --json \
  --filter 'layer_llama|graph_exec_two_stage\[C=256' >/dev/null

echo "== tboost optimize smoke runs (op-by-op layer; a tiny ONNX export against onnxruntime)"
./build/release/tools/tboost/tboost optimize --layer gpt2 --hidden 64 --heads 4 --ffn 96 --seq 33 \
  --budget 0.1 --json >/dev/null
./build/release/tools/tboost/tboost optimize tests/data/onnx/gpt2_tiny/model.onnx --seq 16 \
  --inputs tests/data/onnx/gpt2_tiny --reference tests/data/onnx/gpt2_tiny/ort_logits.npy --budget 0.1

echo "== install + consumer example"
rm -rf build/install build/consumer
cmake --install build/release --prefix build/install >/dev/null
cmake -S examples/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer
./build/consumer/consumer

echo "== AddressSanitizer + UBSan build + tests"
cmake --preset asan -DTBOOST_BUILD_TESTS=ON >/dev/null
cmake --build --preset asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --preset asan -j 1
