#!/usr/bin/env python3
"""Write a random-weight Hugging Face checkpoint (config.json + model.safetensors).

The peer benchmarks (bench/peers/*_bench.py) load the same weights in every framework, so
the models are made once here: named configs (the shapes of /work/shared/PERF.md), a fixed
seed, every weight matrix N(0, --std), norm gains 1 and biases 0, saved with
save_pretrained in f32 or bf16 as one unsharded model.safetensors.

Memory: the model is built on the meta device and materialised directly in the target
dtype, so peak memory is about one copy of the weights (llama-1b: 3.4 GB f32, 1.7 GB bf16)
plus what save_pretrained needs to write it; transformers' own init is skipped (it would
run over every weight once more, in f32).

Needs: torch, transformers (5.x), safetensors. No network (HF_HUB_OFFLINE=1 is fine).
Usage: scripts/make_random_checkpoint.py llama-110m /work/ckpt/llama-110m-f32 --dtype f32
"""
import argparse
import json
import os
import time

import torch

# Shapes: PERF.md "small" (134M with the untied output; called llama-110m in issues) and
# "1b" (a TinyLlama-like GQA model with 16 layers, 853M); GPT-2 small as released (124M).
CONFIGS = {
    "llama-110m": dict(arch="llama", vocab_size=32000, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12),
    "llama-1b": dict(arch="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8),
    "gpt2-small": dict(arch="gpt2"),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def make_config(name):
    spec = dict(CONFIGS[name])
    arch = spec.pop("arch")
    if arch == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(max_position_embeddings=2048, rms_norm_eps=1e-5,
                           tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                           **spec)
    from transformers import GPT2Config
    return GPT2Config(**spec)  # defaults are GPT-2 small: 12 x 768, 12 heads, 50257 vocab


def build(name, dtype, seed, std):
    from transformers import AutoModelForCausalLM
    cfg = make_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # Parameters in a fixed (named) order so the seed fixes every value. Norm gains
        # (LayerNorm/RMSNorm weight) 1, biases 0, everything else N(0, std).
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                # Drawn in f32 chunks, so bf16 checkpoints are the rounded f32 ones and the
                # temporary stays small.
                flat = p.view(-1)
                step = 1 << 24
                for i in range(0, flat.numel(), step):
                    n = min(step, flat.numel() - i)
                    flat[i:i + n].copy_(torch.randn(n, generator=gen) * std)
        # to_empty leaves the non-persistent buffers (rotary inv_freq, causal masks) as
        # garbage; they are not saved, but recompute what we can so the model is usable.
        for m in model.modules():
            if hasattr(m, "rope_init_fn") and hasattr(m, "inv_freq"):
                inv_freq, _ = m.rope_init_fn(m.config, "cpu")
                m.inv_freq.copy_(inv_freq)
                if hasattr(m, "original_inv_freq"):
                    m.original_inv_freq = m.inv_freq
    model.tie_weights()
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", choices=sorted(CONFIGS))
    ap.add_argument("out", help="output directory")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--std", type=float, default=0.02)
    args = ap.parse_args()
    t0 = time.time()
    model = build(args.config, DTYPES[args.dtype], args.seed, args.std)
    t1 = time.time()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, max_shard_size="100GB", safe_serialization=True)
    t2 = time.time()
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"config": args.config, "dtype": args.dtype, "params": n,
                      "out": args.out, "build_s": round(t1 - t0, 2),
                      "save_s": round(t2 - t1, 2)}))


if __name__ == "__main__":
    main()
