#!/usr/bin/env bash
# Training-step benchmarks of tboost and PyTorch on the same shapes, appended as JSON lines to
# bench/peers/train_runs.jsonl (bench/RESULTS.md quotes them). Run on an idle machine.
#   PEERS="tboost torch"  DTYPES="f32 bf16"  MODELS="gpt2-small llama-110m"  MEMORY=1
# torch needs VENV (default /work/venv-onnx) with torch + transformers and the random checkpoints
# of scripts/make_random_checkpoint.py in CKPT (default /work/ckpt/<model>-f32). PyTorch's bf16
# autocast on a CPU without bf16 matmul instructions takes minutes per step: DTYPES=f32 skips it.
set -euo pipefail
cd "$(dirname "$0")/../.."
TB=./build/release/tools/tboost/tboost
OUT=bench/peers/train_runs.jsonl
VENV=${VENV:-/work/venv-onnx}
CKPT=${CKPT:-/work/ckpt}
PEERS=${PEERS:-tboost torch}
DTYPES=${DTYPES:-f32 bf16}
MODELS=${MODELS:-gpt2-small llama-110m}
REPS=${REPS:-3}
for m in $MODELS; do
  for dt in $DTYPES; do
    for p in $PEERS; do
      case $p in
        tboost) $TB bench --train --config "$m" --dtype "$dt" --batch 4 --seq 256 -r "$REPS" -t 2 --json \
                  | python3 -c "import json,sys; j=json.load(sys.stdin); j['peer']='tboost'; print(json.dumps(j))" >> "$OUT" ;;
        torch) HF_HUB_OFFLINE=1 "$VENV/bin/python" bench/peers/torch_train_bench.py "$CKPT/$m-f32" \
                  --model "$m" --dtype "$dt" --batch 4 --seq 256 --reps "$REPS" 2>/dev/null >> "$OUT" ;;
      esac
      tail -1 "$OUT"
    done
  done
done
if [ "${MEMORY:-1}" = 1 ]; then
  # Memory: checkpointing on vs off; global batch 8 as 8 micro-batches of 1 vs one batch of 8.
  for args in "--batch 4" "--batch 4 --checkpointing" "--batch 8" "--batch 8 --micro-batch 1"; do
    $TB bench --train --config gpt2-small --dtype f32 --seq 256 -r 1 -t 2 --json $args \
      | python3 -c "import json,sys; j=json.load(sys.stdin); j['peer']='tboost'; j['memory_case']=True; print(json.dumps(j))" >> "$OUT"
    tail -1 "$OUT"
  done
fi
