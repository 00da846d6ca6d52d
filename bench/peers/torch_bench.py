#!/usr/bin/env python3
"""PyTorch eager (Hugging Face transformers) peer: llama-bench's pp512 and tg128 metrics.

Loads a checkpoint made by scripts/make_random_checkpoint.py with AutoModelForCausalLM in
the asked dtype (weights in ordinary memory), batch 1, torch.set_num_threads(--threads),
torch.inference_mode, no torch.compile. Random token ids (fixed seed), as llama-bench.

  pp: one forward of a --pp-token prompt into an empty cache (tokens/s = pp / time).
  tg: --tg single-token forwards with past_key_values, after a 1-token prompt that is not
      timed (tokens/s = tg / time of the tg steps); llama-bench's tg also starts from an
      (almost) empty context.
Like llama-bench (whose batches ask for the last token's logits only), the forwards
compute logits for the last position only (logits_to_keep=1): the 512 x V output matmul
of a full-logits prefill would otherwise be ~20% of the small model's prefill FLOPs.
One untimed warm-up of each, then --reps timed repetitions; medians and sample standard
deviations of tokens/s are printed as one JSON line, with each run's figure and the
lowest CPU share of a run (process CPU time / (wall x threads); below ~0.9 another process
took the cores: rerun when the machine is idle).

Usage: HF_HUB_OFFLINE=1 nice -n 19 bench/peers/torch_bench.py /work/ckpt/llama-110m-f32 \
           --dtype f32 --reps 5
"""
import argparse
import inspect
import json
import os
import platform
import statistics
import time

import torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

THREADS = 2  # --threads, for the CPU share


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def timed(n, t, c):
    """(tokens/s, CPU share) of a region started at perf_counter t, process_time c. The
    share is process CPU time / (wall time x threads): well below 1 means other processes
    took our cores during the run (the result is then not the library's speed)."""
    wall = time.perf_counter() - t
    return n / wall, (time.process_time() - c) / (wall * THREADS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="directory with config.json + model.safetensors")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--model", help="name in the JSON (default: checkpoint dir name)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa | eager")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    from transformers import AutoModelForCausalLM
    import transformers

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        args.checkpoint, dtype=DTYPES[args.dtype], attn_implementation=args.attn)
    model.eval()
    load_s = time.time() - t0
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, vocab, (1, args.pp), generator=g)
    gen_tokens = torch.randint(0, vocab, (1, args.tg + 1), generator=g)

    def run_pp():
        t, c = time.perf_counter(), time.process_time()
        model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        return timed(args.pp, t, c)

    # transformers 5.2x renamed past_key_values to cache (the old name warns, then goes).
    cache_kw = ("cache" if "cache" in inspect.signature(model.forward).parameters
                else "past_key_values")

    def run_tg():
        out = model(input_ids=gen_tokens[:, :1], use_cache=True, logits_to_keep=1)
        past = getattr(out, cache_kw)
        t, c = time.perf_counter(), time.process_time()
        for i in range(1, args.tg + 1):
            out = model(input_ids=gen_tokens[:, i:i + 1], use_cache=True, logits_to_keep=1,
                        **{cache_kw: past})
            past = getattr(out, cache_kw)
        return timed(args.tg, t, c)

    with torch.inference_mode():
        run_pp()  # warm-up
        pp, pp_util = zip(*[run_pp() for _ in range(args.reps)])
        run_tg()
        tg, tg_util = zip(*[run_tg() for _ in range(args.reps)])

    print(json.dumps({
        "peer": "pytorch",
        "model": args.model or os.path.basename(os.path.normpath(args.checkpoint)),
        "dtype": args.dtype, "threads": args.threads,
        "pp_tokens": args.pp, "tg_tokens": args.tg, "reps": args.reps,
        "pp_tokens_per_s": round(statistics.median(pp), 2), "pp_sd": round(sd(pp), 2),
        "tg_tokens_per_s": round(statistics.median(tg), 2), "tg_sd": round(sd(tg), 2),
        "pp_runs": [round(x, 2) for x in pp], "tg_runs": [round(x, 2) for x in tg],
        "cpu_share_pp": round(min(pp_util), 2), "cpu_share_tg": round(min(tg_util), 2),
        "pp_shares": [round(x, 2) for x in pp_util], "tg_shares": [round(x, 2) for x in tg_util],
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "weights": "in memory (from_pretrained)", "attn_implementation": args.attn,
        "load_s": round(load_s, 2), "torch": torch.__version__,
        "transformers": transformers.__version__, "cpu": platform.processor() or
        platform.machine()}))


if __name__ == "__main__":
    main()
