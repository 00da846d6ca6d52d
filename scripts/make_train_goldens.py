#!/usr/bin/env python3
"""Training goldens: PyTorch autograd and torch.optim.AdamW on the tiny checkpoints.

For each of gpt2_tiny, llama_tiny and qwen2_tiny (tests/data/models/<name>, written by
make_model_goldens.py) this writes tests/data/train/<name>/:
    golden.json         batch shape, token ids and labels of 20 batches (labels: ids shifted
                        left, the last position and a few random ones -100), the hyper-parameters,
                        the loss of batch 0 in float64 and float32, and the loss curve of 20
                        AdamW steps (one batch per step) in float64 and float32
    grads.safetensors   every parameter's gradient for batch 0 at the initial weights, computed
                        in float64 and stored as float32, under the parameter's name

The optimizer matches tboost's Trainer: AdamW (betas 0.9/0.95, eps 1e-8), weight decay 0.1 on
matrices and embeddings only, clipping by global norm 1.0, lr 1e-3 with 5 warmup steps
(lr·step/5) then cosine to 0.1·lr at step 20. The loss is the mean cross-entropy over labels
that are not -100.

Needs torch, transformers 5.x, safetensors. Usage:
    /work/venv-onnx/bin/python scripts/make_train_goldens.py
"""
import json
import math
import os

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "tests", "data", "models")
OUT = os.path.join(REPO, "tests", "data", "train")

B, T, STEPS = 2, 24, 20
HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip_norm=1.0,
             warmup_steps=5, total_steps=20, min_lr_ratio=0.1)


def lr_at(step):  # 1-based, as tboost's scheduled_lr
    h = HYPER
    if step <= h["warmup_steps"]:
        return h["lr"] * step / h["warmup_steps"]
    lo = h["lr"] * h["min_lr_ratio"]
    if step >= h["total_steps"]:
        return lo
    t = (step - h["warmup_steps"]) / (h["total_steps"] - h["warmup_steps"])
    return lo + 0.5 * (h["lr"] - lo) * (1 + math.cos(math.pi * t))


def batches(vocab, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(STEPS, B, T), dtype=np.int64)
    labels = np.concatenate([ids[:, :, 1:], np.full((STEPS, B, 1), -100)], axis=2)
    mask = rng.random((STEPS, B, T)) < 0.1
    labels[mask] = -100
    return ids, labels


def loss_of(model, ids, labels):
    logits = model(input_ids=torch.from_numpy(ids)).logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.from_numpy(labels).reshape(-1),
        ignore_index=-100)


def curve(model, ids, labels):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    h = HYPER
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": h["weight_decay"]},
                             {"params": other, "weight_decay": 0.0}],
                            lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"])
    losses = []
    for s in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(s + 1)
        opt.zero_grad()
        loss = loss_of(model, ids[s], labels[s])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), h["clip_norm"])
        opt.step()
        losses.append(float(loss))
    return losses


def make(name, seed):
    src = os.path.join(MODELS, name)
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    m64 = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager").double()
    m32 = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager").float()
    ids, labels = batches(m64.config.vocab_size, seed)
    l64 = loss_of(m64, ids[0], labels[0])
    l64.backward()
    grads = {n: p.grad.detach().float().contiguous() for n, p in m64.named_parameters()}
    l32 = loss_of(m32, ids[0], labels[0])
    l32.backward()
    gdiff = max(float((p.grad.double() - dict(m64.named_parameters())[n].grad).abs().max())
                for n, p in m32.named_parameters())
    save_file(grads, os.path.join(out, "grads.safetensors"))
    m64.zero_grad(), m32.zero_grad()
    c64 = curve(m64, ids, labels)
    c32 = curve(m32, ids, labels)
    golden = dict(model=name, batch=B, seq=T, steps=STEPS, hyper=HYPER,
                  ids=ids.tolist(), labels=labels.tolist(), loss_f64=float(l64),
                  loss_f32=float(l32), grad_f32_vs_f64_max_abs=gdiff,
                  curve_f64=c64, curve_f32=c32,
                  torch=torch.__version__)
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f)
    print(name, "loss", float(l64), "curve", c64[0], "->", c64[-1], "f32 grad diff", gdiff)


if __name__ == "__main__":
    torch.manual_seed(0)
    for i, n in enumerate(["gpt2_tiny", "llama_tiny", "qwen2_tiny"]):
        make(n, 100 + i)
