#!/usr/bin/env python3
"""Export GPT-2 / BERT with random weights to ONNX, plus golden inputs/outputs.

For the tboost ONNX importer: builds the models from transformers config
classes (no hub access, fixed seed), exports them with torch.onnx.export
(TorchScript exporter, explicit MatMul/Softmax via eager attention), and
writes golden inputs and the outputs of both torch and onnxruntime as .npy.

Needs: torch, transformers, onnx, onnxruntime (tested with torch 2.15.0,
transformers 5.24.0, onnx 1.23.2, onnxruntime 1.32.0 from PyPI), e.g.
    python3 -m venv /work/venv-onnx
    /work/venv-onnx/bin/pip install torch transformers onnx onnxruntime onnxscript
(onnxscript is only needed for --exporter dynamo). Example:
    /work/venv-onnx/bin/python scripts/make_onnx_models.py --tiny
    /work/venv-onnx/bin/python scripts/make_onnx_models.py --models gpt2,bert --bench 5

Weights: transformers' random init (seeded), then every 1-D parameter
(biases, LayerNorm gamma/beta) gets N(0, 0.1) added so that the goldens
exercise them (--hf-init keeps the plain init). The export is traced at
batch 2 x seq 7, so the golden check at another shape also proves that the
batch/sequence axes are dynamic.

Layout, one folder per model under --out (names: gpt2, bert_base,
gpt2_tiny, bert_tiny):
    model.onnx            the exported graph (weights inline; < 2 GiB)
    input_ids.npy         int64 [batch, seq]
    attention_mask.npy    int64 [batch, seq] (GPT-2: all ones, not a graph input)
    torch_<out>.npy       float32 output from torch (<out> = logits | last_hidden_state)
    ort_<out>.npy         float32 output from onnxruntime (ORT_ENABLE_ALL, --threads)
    summary.json          opset, IR version, node count, op_type histogram,
                          inputs/outputs, max |torch - ort|, versions, timings
"""

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time

import numpy as np


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------
# Model construction (random weights, no network)
# ----------------------------------------------------------------------------

def build_gpt2(tiny):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if tiny:
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000,
                         n_positions=128, attn_implementation="eager", use_cache=False)
    else:
        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257,
                         n_positions=1024, attn_implementation="eager", use_cache=False)
    cfg._attn_implementation = "eager"
    cfg.use_cache = False
    model = GPT2LMHeadModel(cfg).eval()

    class GPT2Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            # An explicit all-ones mask: with attention_mask=None, transformers 5
            # traces its packed-sequence detection (aten::diff, not exportable).
            mask = torch.ones_like(input_ids)
            return self.m(input_ids=input_ids, attention_mask=mask, use_cache=False,
                          return_dict=True).logits

    return GPT2Logits(model).eval(), cfg, ["input_ids"], "logits"


def build_bert(tiny):
    import torch
    from transformers import BertConfig, BertModel

    if tiny:
        cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         intermediate_size=256, vocab_size=1000, max_position_embeddings=128,
                         attn_implementation="eager")
    else:
        cfg = BertConfig(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                         intermediate_size=3072, vocab_size=30522, max_position_embeddings=512,
                         attn_implementation="eager")
    cfg._attn_implementation = "eager"
    model = BertModel(cfg, add_pooling_layer=False).eval()

    class BertHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          return_dict=True).last_hidden_state

    return BertHidden(model).eval(), cfg, ["input_ids", "attention_mask"], "last_hidden_state"


BUILDERS = {"gpt2": build_gpt2, "bert": build_bert}


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

def make_inputs(rng, vocab, batch, seq, pad):
    ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    if pad > 0:
        mask[:, seq - pad:] = 0
    return ids, mask


def feeds_for(input_names, ids, mask):
    d = {"input_ids": ids, "attention_mask": mask}
    return {k: d[k] for k in input_names}


def graph_summary(path):
    import onnx

    m = onnx.load(path, load_external_data=False)
    g = m.graph
    hist = collections.Counter(
        (n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}") for n in g.node)

    def vi(v):
        t = v.type.tensor_type
        dims = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in t.shape.dim]
        return {"name": v.name, "elem_type": onnx.TensorProto.DataType.Name(t.elem_type), "dims": dims}

    n_params = 0
    for init in g.initializer:
        n = 1
        for d in init.dims:
            n *= d
        n_params += n
    return {
        "ir_version": m.ir_version,
        "opset_import": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "producer": f"{m.producer_name} {m.producer_version}",
        "node_count": len(g.node),
        "op_types": dict(sorted(hist.items())),
        "initializers": len(g.initializer),
        "initializer_elements": n_params,
        "inputs": [vi(v) for v in g.input],
        "outputs": [vi(v) for v in g.output],
        "file_bytes": os.path.getsize(path),
    }


def print_summary(name, s):
    log(f"== {name}: opset {s['opset_import']}, IR {s['ir_version']}, "
        f"{s['node_count']} nodes, {s['initializers']} initializers "
        f"({s['initializer_elements']:,} elements), {s['file_bytes'] / 2**20:.1f} MiB")
    for i in s["inputs"]:
        log(f"   input  {i['name']} {i['elem_type']} {i['dims']}")
    for o in s["outputs"]:
        log(f"   output {o['name']} {o['elem_type']} {o['dims']}")
    width = max(len(k) for k in s["op_types"]) if s["op_types"] else 0
    for op, c in sorted(s["op_types"].items(), key=lambda kv: (-kv[1], kv[0])):
        log(f"   {op:<{width}} {c}")


def ort_session(path, threads, optimized_out=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if optimized_out:
        so.optimized_model_filepath = optimized_out
    return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])


def timed(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

def export_one(kind, args):
    import torch

    tiny = args.tiny
    name = {"gpt2": "gpt2", "bert": "bert"}[kind] + "_tiny" if tiny else \
        {"gpt2": "gpt2", "bert": "bert_base"}[kind]
    outdir = os.path.join(args.out, name)
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, "model.onnx")

    torch.manual_seed(args.seed)
    model, cfg, input_names, out_name = BUILDERS[kind](tiny)
    if not args.hf_init:
        # transformers' init leaves every bias at 0 and every LayerNorm at
        # gamma=1, beta=0: goldens would then not catch a bias or LayerNorm-affine
        # bug, and the exporter deduplicates the identical tensors (Identity
        # nodes). Perturb all 1-D parameters (biases, LayerNorm gamma/beta).
        with torch.no_grad():
            for _, prm in sorted(model.named_parameters()):
                if prm.dim() == 1:
                    prm.add_(torch.randn_like(prm) * 0.1)
    attn = getattr(cfg, "_attn_implementation", None)
    if attn != "eager":
        raise SystemExit(f"{name}: attention implementation is {attn!r}, expected 'eager'")

    batch = args.batch
    seq = args.seq if args.seq else (16 if tiny else 512)
    rng = np.random.default_rng(args.seed)
    pad = args.pad if kind == "bert" else 0
    ids, mask = make_inputs(rng, cfg.vocab_size, batch, seq, pad)

    # Trace with a shape different from the golden one, so that the golden
    # check below also proves the batch/sequence axes really are dynamic.
    tr_ids, tr_mask = make_inputs(rng, cfg.vocab_size, 2, 7, 0)
    tr_args = tuple(torch.from_numpy(v) for v in feeds_for(input_names, tr_ids, tr_mask).values())
    dyn = {n: {0: "batch", 1: "sequence"} for n in input_names}
    dyn[out_name] = {0: "batch", 1: "sequence"}

    log(f"-- exporting {name} (opset {args.opset}, exporter {args.exporter}) -> {path}")
    t0 = time.perf_counter()
    with torch.no_grad():
        if args.exporter == "torchscript":
            torch.onnx.export(model, tr_args, path, input_names=input_names,
                              output_names=[out_name], dynamic_axes=dyn,
                              opset_version=args.opset, do_constant_folding=True,
                              dynamo=False)
        else:
            from torch.export import Dim
            b, s = Dim("batch", min=1, max=64), Dim("sequence", min=2, max=cfg.max_position_embeddings
                                                    if kind == "bert" else cfg.n_positions)
            shapes = {n: {0: b, 1: s} for n in input_names}
            prog = torch.onnx.export(model, tr_args, input_names=input_names,
                                     output_names=[out_name], dynamic_shapes=shapes,
                                     opset_version=args.opset, dynamo=True, external_data=False)
            prog.save(path, external_data=False)
    t_export = time.perf_counter() - t0
    summ = graph_summary(path)
    print_summary(name, summ)

    np.save(os.path.join(outdir, "input_ids.npy"), ids)
    np.save(os.path.join(outdir, "attention_mask.npy"), mask)
    feeds = feeds_for(input_names, ids, mask)

    torch.set_num_threads(args.threads)
    t_in = tuple(torch.from_numpy(v) for v in feeds.values())
    with torch.no_grad():
        ref = model(*t_in).float().numpy()
    np.save(os.path.join(outdir, f"torch_{out_name}.npy"), ref)

    opt_path = os.path.join(outdir, "model.ort_optimized.onnx") if args.save_ort_optimized else None
    sess = ort_session(path, args.threads, opt_path)
    got = sess.run([out_name], feeds)[0]
    np.save(os.path.join(outdir, f"ort_{out_name}.npy"), got)
    diff = float(np.max(np.abs(ref - got)))
    scale = float(np.max(np.abs(ref)))
    log(f"   golden {batch}x{seq}: {out_name} {list(ref.shape)}, max|torch|={scale:.4g}, "
        f"max|torch-ort|={diff:.3g}")
    if not np.allclose(ref, got, rtol=1e-3, atol=1e-3 * max(scale, 1.0)):
        raise SystemExit(f"{name}: torch and onnxruntime disagree (max abs diff {diff})")

    import onnx
    import onnxruntime as ort
    import transformers

    info = {
        "name": name, "kind": kind, "tiny": tiny, "seed": args.seed, "exporter": args.exporter,
        "golden_shape": [batch, seq], "bert_pad_positions": pad, "hf_init": args.hf_init,
        "config": {k: getattr(cfg, k) for k in ("num_hidden_layers", "hidden_size",
                   "num_attention_heads", "vocab_size") if hasattr(cfg, k)},
        "graph": summ,
        "export_seconds": round(t_export, 2),
        "max_abs_diff_torch_ort": diff, "max_abs_torch": scale,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "onnx": onnx.__version__,
                     "onnxruntime": ort.__version__, "numpy": np.__version__},
        "threads": args.threads,
    }
    if opt_path:
        info["ort_optimized_graph"] = graph_summary(opt_path)
        print_summary(name + " (after ORT_ENABLE_ALL)", info["ort_optimized_graph"])

    if args.bench > 0:
        ts = timed(lambda: sess.run([out_name], feeds), warmup=2, reps=args.bench)
        med = statistics.median(ts)
        info["ort_seconds"] = {"median": med, "runs": ts, "shape": [batch, seq]}
        log(f"   onnxruntime {batch}x{seq}, {args.threads} threads, ORT_ENABLE_ALL: "
            f"median {med * 1e3:.1f} ms over {len(ts)} (min {min(ts) * 1e3:.1f}, "
            f"max {max(ts) * 1e3:.1f}); loadavg {os.getloadavg()[0]:.2f}")
        if args.bench_torch:
            with torch.no_grad():
                tt = timed(lambda: model(*t_in), warmup=1, reps=args.bench)
            info["torch_seconds"] = {"median": statistics.median(tt), "runs": tt}
            log(f"   torch eager {batch}x{seq}, {args.threads} threads: "
                f"median {statistics.median(tt) * 1e3:.1f} ms")

    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/work/onnx_models", help="output folder (default %(default)s)")
    p.add_argument("--models", default="gpt2,bert", help="comma list of gpt2,bert (default %(default)s)")
    p.add_argument("--tiny", action="store_true", help="2 layers, hidden 64, 4 heads, vocab 1000; golden 1x16")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default %(default)s)")
    p.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript",
                   help="torch.onnx.export path: torchscript (dynamo=False, default) or dynamo")
    p.add_argument("--batch", type=int, default=1, help="golden batch (default 1)")
    p.add_argument("--seq", type=int, default=0, help="golden sequence length (default 16 tiny / 512 full)")
    p.add_argument("--pad", type=int, default=0,
                   help="BERT: mask out the last PAD positions of the golden attention_mask (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf-init", action="store_true",
                   help="keep transformers' init (zero biases, LayerNorm 1/0) instead of perturbing 1-D params")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for torch and ORT (default 2)")
    p.add_argument("--bench", type=int, default=0, help="time ORT: median of N runs after 2 warm-ups")
    p.add_argument("--bench-torch", action="store_true", help="with --bench, time torch eager too")
    p.add_argument("--save-ort-optimized", action="store_true",
                   help="also write ORT's optimized graph (model.ort_optimized.onnx) and its histogram")
    args = p.parse_args(argv)

    if args.exporter == "dynamo" and args.opset < 18:
        # torch 2.15's dynamo exporter builds opset 18 and down-converts; the
        # converted Split keeps its opset-18 num_outputs attribute, which
        # onnxruntime rejects as an invalid opset-17 graph.
        p.error("--exporter dynamo needs --opset 18 or newer")
    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    for k in kinds:
        if k not in BUILDERS:
            p.error(f"unknown model {k!r}")
    import torch
    torch.set_num_threads(args.threads)
    results = [export_one(k, args) for k in kinds]
    log("\nsummary:")
    for r in results:
        g = r["graph"]
        line = (f"  {r['name']:<14} opset {g['opset_import']} nodes {g['node_count']:>5} "
                f"max|torch-ort| {r['max_abs_diff_torch_ort']:.3g}")
        if "ort_seconds" in r:
            line += f"  ORT {r['ort_seconds']['median'] * 1e3:.1f} ms"
        log(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
