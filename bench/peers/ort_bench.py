#!/usr/bin/env python3
"""ONNX Runtime peer: llama-bench's pp512 and tg128 metrics for LLaMA-family and GPT-2
checkpoints.

ONNX Runtime runs exported graphs, so this script first exports the checkpoint: a compact
PyTorch decoder (the Hugging Face LLaMA / GPT-2 math, weights from the same safetensors file
tboost and the other peers read) with the KV cache as explicit inputs and outputs
(past_key.l / past_value.l of shape (1, kv_heads, P, head_dim) in, present_* out, the cache
grown by Concat inside the graph: the layout Hugging Face Optimum exports for ORT), opset 17,
dynamic T and P. --check compares the exported graph's logits with transformers' on a short
prompt and two decode steps before timing (and fails if they differ).

ORT: CPU execution provider, intra_op_num_threads = --threads, graph optimizations
ORT_ENABLE_ALL, I/O through IOBinding on CPU (no extra copies of the cache between steps
beyond ORT's own Concat). f32 only: ORT's CPU provider has no bf16 MatMul.

  pp: one run of a --pp-token prompt with an empty cache (P = 0), logits of the last position.
  tg: --tg single-token runs, each feeding the previous run's present_* as past_*, after a
      1-token prompt that is not timed.
One untimed warm-up of each, then --reps timed repetitions; one JSON line (medians and
sample standard deviations of tokens/s, each run's figure, the lowest CPU share).

Usage: nice -n 19 bench/peers/ort_bench.py /work/ckpt/llama-110m-f32 --reps 3 [--check]
"""
import argparse
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

THREADS = 2


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


class Decoder(torch.nn.Module):
    """LLaMA (RMSNorm, rotate-half rope, GQA, SwiGLU) or GPT-2 (LayerNorm, learned positions,
    fused c_attn Conv1D, GELU-tanh) with an explicit KV cache."""

    def __init__(self, cfg, sd_):
        super().__init__()
        self.llama = cfg["model_type"] != "gpt2"
        c = cfg
        if self.llama:
            self.C, self.L = c["hidden_size"], c["num_hidden_layers"]
            self.H = c["num_attention_heads"]
            self.Hkv = c.get("num_key_value_heads", self.H)
            self.D = c.get("head_dim") or self.C // self.H
            self.eps = c["rms_norm_eps"]
            theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 1e4))
            rt = (c.get("rope_parameters") or {}).get("rope_type", "default")
            if rt != "default" or c.get("rope_scaling"):
                raise SystemExit("ort_bench: only default rope is exported")
            self.register_buffer(
                "inv_freq", 1.0 / theta ** (torch.arange(0, self.D, 2, dtype=torch.float32) / self.D))
            self.p = "model."
        else:
            self.C, self.L, self.H = c["n_embd"], c["n_layer"], c["n_head"]
            self.Hkv, self.D, self.eps = self.H, self.C // self.H, c["layer_norm_epsilon"]
            self.p = "transformer."
        # Parameters by name ("." -> "_"); the tied output head reuses the embedding.
        self.w = {}
        for k, v in sd_.items():
            name = k.replace(".", "_")
            self.register_buffer(name, v.float())
            self.w[k] = name
        self.head = "lm_head.weight" if "lm_head.weight" in sd_ else (
            "model.embed_tokens.weight" if self.llama else "transformer.wte.weight")

    def g(self, k):
        return getattr(self, self.w[k])

    def rope(self, x, pos):
        f = pos[:, None].float() * self.inv_freq[None, :]  # (T, D/2)
        emb = torch.cat([f, f], dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x1, x2 = x[..., : self.D // 2], x[..., self.D // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def forward(self, ids, pos, *past):
        T = ids.shape[1]
        P = past[0].shape[2]
        g = self.g
        if self.llama:
            h = g("model.embed_tokens.weight")[ids[0]][None]
        else:
            h = (g("transformer.wte.weight")[ids[0]] + g("transformer.wpe.weight")[pos])[None]
        # Causal mask over [past, new] keys: query i sees keys j <= P + i.
        qi = torch.arange(T)[:, None] + P
        kj = torch.arange(P + T)[None, :]
        mask = torch.where(kj <= qi, 0.0, float("-inf"))[None, None]
        presents = []
        for l in range(self.L):
            pre = f"{self.p}layers.{l}." if self.llama else f"{self.p}h.{l}."
            if self.llama:
                x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
                x = x * g(pre + "input_layernorm.weight")
                q = x @ g(pre + "self_attn.q_proj.weight").T
                k = x @ g(pre + "self_attn.k_proj.weight").T
                v = x @ g(pre + "self_attn.v_proj.weight").T
                if pre + "self_attn.q_proj.bias" in self.w:
                    q = q + g(pre + "self_attn.q_proj.bias")
                    k = k + g(pre + "self_attn.k_proj.bias")
                    v = v + g(pre + "self_attn.v_proj.bias")
            else:
                x = F.layer_norm(h, (self.C,), g(pre + "ln_1.weight"), g(pre + "ln_1.bias"),
                                 self.eps)
                qkv = x @ g(pre + "attn.c_attn.weight") + g(pre + "attn.c_attn.bias")
                q, k, v = qkv.split(self.C, dim=-1)
            q = q.view(1, T, self.H, self.D).transpose(1, 2)
            k = k.view(1, T, self.Hkv, self.D).transpose(1, 2)
            v = v.view(1, T, self.Hkv, self.D).transpose(1, 2)
            if self.llama:
                q, k = self.rope(q, pos), self.rope(k, pos)
            k = torch.cat([past[2 * l], k], dim=2)
            v = torch.cat([past[2 * l + 1], v], dim=2)
            presents += [k, v]
            if self.Hkv != self.H:
                k = k.repeat_interleave(self.H // self.Hkv, dim=1)
                v = v.repeat_interleave(self.H // self.Hkv, dim=1)
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.D)) + mask
            o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(1, T, self.H * self.D)
            if self.llama:
                h = h + o @ g(pre + "self_attn.o_proj.weight").T
                x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
                x = x * g(pre + "post_attention_layernorm.weight")
                a = F.silu(x @ g(pre + "mlp.gate_proj.weight").T) * (
                    x @ g(pre + "mlp.up_proj.weight").T)
                h = h + a @ g(pre + "mlp.down_proj.weight").T
            else:
                h = h + o @ g(pre + "attn.c_proj.weight") + g(pre + "attn.c_proj.bias")
                x = F.layer_norm(h, (self.C,), g(pre + "ln_2.weight"), g(pre + "ln_2.bias"),
                                 self.eps)
                a = F.gelu(x @ g(pre + "mlp.c_fc.weight") + g(pre + "mlp.c_fc.bias"),
                           approximate="tanh")
                h = h + a @ g(pre + "mlp.c_proj.weight") + g(pre + "mlp.c_proj.bias")
        last = h[:, -1:]
        if self.llama:
            last = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + self.eps)
            last = last * g("model.norm.weight")
        else:
            last = F.layer_norm(last, (self.C,), g("transformer.ln_f.weight"),
                                g("transformer.ln_f.bias"), self.eps)
        return (last @ g(self.head).T, *presents)


def export(model, path):
    L, Hkv, D = model.L, model.Hkv, model.D
    past = [torch.zeros(1, Hkv, 3, D) for _ in range(2 * L)]
    names = [f"past_{kv}.{l}" for l in range(L) for kv in ("key", "value")]
    outs = ["logits"] + [f"present_{kv}.{l}" for l in range(L) for kv in ("key", "value")]
    dyn = {"ids": {1: "T"}, "pos": {0: "T"}}
    dyn.update({n: {2: "P"} for n in names})
    dyn.update({n: {2: "PT"} for n in outs[1:]})
    torch.onnx.export(model, (torch.zeros(1, 2, dtype=torch.int64),
                              torch.arange(3, 5, dtype=torch.int64), *past), path,
                      input_names=["ids", "pos"] + names, output_names=outs,
                      dynamic_axes=dyn, opset_version=17, dynamo=False)
    return names, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="directory with config.json + model.safetensors")
    ap.add_argument("--model", help="name in the JSON (default: checkpoint dir name)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--check", action="store_true", help="compare with transformers first")
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads
    torch.set_num_threads(args.threads)
    import onnxruntime as ort

    cfg = json.load(open(os.path.join(args.checkpoint, "config.json")))
    weights = load_file(os.path.join(args.checkpoint, "model.safetensors"))
    if any(v.dtype != torch.float32 for v in weights.values()):
        raise SystemExit("ort_bench: f32 checkpoints only (ORT's CPU provider has no bf16 MatMul)")
    model = Decoder(cfg, weights).eval()
    del weights
    tmp = tempfile.mkdtemp(prefix="tboost_ort_")
    path = os.path.join(tmp, "model.onnx")
    t0 = time.time()
    with torch.no_grad():
        names, outs = export(model, path)
    export_s = time.time() - t0
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    finally:
        shutil.rmtree(tmp)  # the session holds the weights in memory now
    L, Hkv, D = model.L, model.Hkv, model.D
    vocab = cfg["vocab_size"]

    def empty_past():
        return [np.zeros((1, Hkv, 0, D), np.float32) for _ in names]

    def step(ids, start, past):
        """Runs ids (T tokens) at positions start.. with `past`; (logits, presents)."""
        b = sess.io_binding()
        T = len(ids)
        b.bind_cpu_input("ids", np.asarray(ids, np.int64)[None])
        b.bind_cpu_input("pos", np.arange(start, start + T, dtype=np.int64))
        for n, p in zip(names, past):
            b.bind_ortvalue_input(n, p) if isinstance(p, ort.OrtValue) else b.bind_cpu_input(n, p)
        for o in outs:
            b.bind_output(o, "cpu")
        sess.run_with_iobinding(b)
        r = b.get_outputs()
        return r[0], r[1:]

    if args.check:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
        ids = [5, 17, 300, 42, 7, 99]
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor([ids])).logits[0].numpy()
        lg, past = step(ids[:4], 0, empty_past())
        got = [lg.numpy()[0, -1]]
        for i in (4, 5):
            lg, past = step([ids[i]], i, past)
            got.append(lg.numpy()[0, -1])
        err = max(float(np.abs(g - ref[i]).max()) for g, i in zip(got, (3, 4, 5)))
        scale = float(np.abs(ref).max())
        if not err <= 1e-4 * max(1.0, scale):
            raise SystemExit(f"ort_bench: exported graph differs from transformers: {err}")
        del hf

    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, vocab, args.pp).tolist()
    gen = rng.integers(0, vocab, args.tg + 1).tolist()

    def timed(n, t, c):
        wall = time.perf_counter() - t
        return n / wall, (time.process_time() - c) / (wall * THREADS)

    def run_pp():
        t, c = time.perf_counter(), time.process_time()
        step(prompt, 0, empty_past())
        return timed(args.pp, t, c)

    def run_tg():
        _, past = step(gen[:1], 0, empty_past())
        t, c = time.perf_counter(), time.process_time()
        for i in range(1, args.tg + 1):
            _, past = step(gen[i:i + 1], i, past)
        return timed(args.tg, t, c)

    run_pp()
    pp, pp_util = zip(*[run_pp() for _ in range(args.reps)])
    run_tg()
    tg, tg_util = zip(*[run_tg() for _ in range(args.reps)])
    print(json.dumps({
        "peer": "onnxruntime",
        "model": args.model or os.path.basename(os.path.normpath(args.checkpoint)),
        "dtype": "f32", "threads": args.threads,
        "pp_tokens": args.pp, "tg_tokens": args.tg, "reps": args.reps,
        "pp_tokens_per_s": round(statistics.median(pp), 2), "pp_sd": round(sd(pp), 2),
        "tg_tokens_per_s": round(statistics.median(tg), 2), "tg_sd": round(sd(tg), 2),
        "pp_runs": [round(x, 2) for x in pp], "tg_runs": [round(x, 2) for x in tg],
        "cpu_share_pp": round(min(pp_util), 2), "cpu_share_tg": round(min(tg_util), 2),
        "loadavg_1m": round(os.getloadavg()[0], 2), "checked": args.check,
        "weights": "in memory (ORT session)", "export_s": round(export_s, 1),
        "onnxruntime": ort.__version__, "cpu": platform.processor() or platform.machine()}))


if __name__ == "__main__":
    main()
