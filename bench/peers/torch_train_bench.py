#!/usr/bin/env python3
"""PyTorch peer of `tboost bench --train`: one training step of a Hugging Face causal LM.

Step = zero_grad, forward with labels (the model's own shifted cross-entropy), backward,
clip_grad_norm_(1.0), AdamW step (torch.optim.AdamW, default foreach implementation), the same
work as tboost's Trainer.step. f32: everything in float32. bf16: torch.autocast("cpu",
bfloat16) around forward and loss with float32 weights (PyTorch's mixed precision on CPU).
--compile wraps the model in torch.compile (default inductor) first. Random token ids from a
fixed seed; one untimed warm-up step, then --reps timed steps; prints one JSON line with the
median step time, tokens/s, the peak RSS and the lowest CPU share of a step (process CPU time
/ (wall x threads); well below 1 means another process took the cores).

Usage: HF_HUB_OFFLINE=1 bench/peers/torch_train_bench.py /work/ckpt/gpt2-small-f32 \
           --dtype bf16 --batch 4 --seq 256 --reps 3
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--model", help="name in the JSON (default: checkpoint dir name)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa | eager")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32,
                                                 attn_implementation=args.attn)
    model.train()
    model.config.use_cache = False
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=3e-4, betas=(0.9, 0.95))
    fwd = torch.compile(model) if args.compile else model
    g = torch.Generator().manual_seed(12345)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        if args.dtype == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = fwd(input_ids=ids, labels=ids).loss
        else:
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss)

    t0 = time.perf_counter()
    step()
    warm = time.perf_counter() - t0
    times, shares = [], []
    for _ in range(args.reps):
        t, c = time.perf_counter(), time.process_time()
        loss = step()
        wall = time.perf_counter() - t
        times.append(wall)
        shares.append((time.process_time() - c) / (wall * args.threads))
    med = statistics.median(times)
    print(json.dumps({
        "peer": "pytorch" + ("-compile" if args.compile else "-eager"),
        "model": args.model or os.path.basename(os.path.normpath(args.checkpoint)),
        "dtype": args.dtype, "threads": args.threads, "batch": args.batch, "seq": args.seq,
        "step_seconds": med, "step_seconds_all": times, "warmup_seconds": warm,
        "tokens_per_s": args.batch * args.seq / med,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "min_cpu_share": min(shares), "loss": loss, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
