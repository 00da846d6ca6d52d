#!/usr/bin/env bash
# Issue-5 peer comparison: tboost vs llama.cpp (llama-cpp-python) vs PyTorch eager on the same
# random-weight checkpoints, same threads, batch 1, weights read into memory; the runs of the
# peers alternate (rounds x peers), each run doing --reps repetitions after a warm-up.
# Writes one JSON line per run to OUT (default bench/peers/model_runs.jsonl).
#
# Usage: bench/peers/run_model_peers.sh VENV CKPT_DIR [OUT] [ROUNDS] [REPS] [MODELS...]
#   VENV      python venv with torch, transformers, llama-cpp-python, gguf
#   CKPT_DIR  holds <model>-<dtype> checkpoints from scripts/make_random_checkpoint.py
#   MODELS    e.g. llama-110m llama-1b gpt2-small (default: all three)
# DTYPES (environment): default "f32 bf16". DEPTH (environment): tokens in the KV cache before
# each pp and tg run (tboost bench -d, llama-bench's -d); default 0. PyTorch and ONNX Runtime
# have no depth runs and are skipped when it is set. PEERS (environment) picks the peers: default "tboost llama_cpp torch ort" (ort: f32 only,
# ONNX Runtime's CPU provider has no bf16 MatMul; its venv also needs onnxruntime, onnx).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=$1 CKPT=$2 OUT=${3:-bench/peers/model_runs.jsonl} ROUNDS=${4:-2} REPS=${5:-3}
shift $(( $# < 5 ? $# : 5 ))
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(llama-110m llama-1b gpt2-small)
PY=$VENV/bin/python
PEERS=${PEERS:-tboost llama_cpp torch ort}
DEPTH=${DEPTH:-0}
want() { [[ " $PEERS " == *" $1 "* ]]; }
TB=./build/release/tools/tboost/tboost
export HF_HUB_OFFLINE=1
for model in "${MODELS[@]}"; do
  for dt in ${DTYPES:-f32 bf16}; do
    dir=$CKPT/$model-$dt
    [ -d "$dir" ] || { echo "skip $dir (missing)" >&2; continue; }
    type=$( [ $dt = f32 ] && echo F32 || echo BF16 )
    for round in $(seq "$ROUNDS"); do
      echo "== $model $dt round $round" >&2
      tag="import json,sys; d=json.loads(sys.stdin.readlines()[-1]); d.update(model='$model', dtype='$dt', round=$round); print(json.dumps(d))"
      if want tboost; then
        $TB bench --model "$dir" --dtype $dt -t 2 -p 512 -n 128 -d "$DEPTH" -r "$REPS" --json |
          $PY -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(peer='tboost', model='$model', round=$round); print(json.dumps(d))" >> "$OUT"
      fi
      if want llama_cpp; then
        $PY bench/peers/llama_cpp_bench.py "$dir" --type $type --reps "$REPS" --model "$model" --threads 2 --depth "$DEPTH" |
          $PY -c "$tag" >> "$OUT"
      fi
      if want torch && [ "$DEPTH" = 0 ]; then
        $PY bench/peers/torch_bench.py "$dir" --dtype $dt --reps "$REPS" --threads 2 |
          $PY -c "$tag" >> "$OUT"
      fi
      if want ort && [ $dt = f32 ] && [ "$DEPTH" = 0 ]; then
        $PY -W ignore bench/peers/ort_bench.py "$dir" --reps "$REPS" --model "$model" --threads 2 --check |
          $PY -c "$tag" >> "$OUT"
      fi
    done
  done
done
