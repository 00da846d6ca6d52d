#!/usr/bin/env python3
"""tboost vs ONNX Runtime on the same .onnx file, same inputs, same threads, one run.

For each model directory made by scripts/make_onnx_models.py (model.onnx, <input>.npy,
ort_<output>.npy) it alternates, `--rounds` times: onnxruntime (ORT_ENABLE_ALL,
intra_op_num_threads = --threads, sequential execution) timed over --runs calls, then
`tboost optimize MODEL --json` (which times the original and the optimized graph itself,
alternating). Medians over rounds are reported, with the outputs' agreement with ORT.

Needs: pip install onnxruntime numpy (torch is needed only to make the models).
Usage: bench/peers/onnx_vs_ort.py --tboost build/release/tools/tboost/tboost \
           /work/onnx_models/gpt2 /work/onnx_models/bert_base
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import time

import numpy as np
import onnxruntime as ort


def ort_session(path, threads):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", help="model directories")
    ap.add_argument("--tboost", default="build/release/tools/tboost/tboost")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--budget", type=float, default=3.0, help="tboost timing seconds per side")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    rows = []
    for d in args.models:
        model = os.path.join(d, "model.onnx")
        sess = ort_session(model, args.threads)
        feeds = {i.name: np.load(os.path.join(d, i.name + ".npy")) for i in sess.get_inputs()}
        batch, seq = next(iter(feeds.values())).shape[:2]
        ref = glob.glob(os.path.join(d, "ort_*.npy"))[0]
        for _ in range(2):  # warm-up
            sess.run(None, feeds)
        t_ort, t_ours, t_orig, last = [], [], [], None
        for _ in range(args.rounds):
            ts = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                sess.run(None, feeds)
                ts.append(time.perf_counter() - t0)
            t_ort.append(statistics.median(ts))
            out = subprocess.run(
                [args.tboost, "optimize", model, "--batch", str(batch), "--seq", str(seq),
                 "--threads", str(args.threads), "--budget", str(args.budget), "--inputs", d,
                 "--reference", ref, "--json"],
                check=True, capture_output=True, text=True).stdout
            last = json.loads(out)
            t_ours.append(last["optimized"]["seconds"])
            t_orig.append(last["original"]["seconds"])
        row = {
            "model": os.path.basename(d.rstrip("/")),
            "batch": int(batch), "seq": int(seq), "threads": args.threads,
            "ort_seconds": statistics.median(t_ort),
            "tboost_seconds": statistics.median(t_ours),
            "tboost_unoptimized_seconds": statistics.median(t_orig),
            "speedup_vs_ort": statistics.median(t_ort) / statistics.median(t_ours),
            "ort_rounds": t_ort, "tboost_rounds": t_ours,
            "max_abs_diff_vs_ort": last["optimized"]["max_abs_diff_vs_reference"],
            "rel_error_vs_ort": last["optimized"]["rel_error_vs_reference"],
            "ops_file": last["original"]["ops"], "ops_after_import": last["original"]["ops_after_import"],
            "ops_optimized": last["optimized"]["ops"],
            "bytes_original": last["original"]["bytes_moved"], "bytes_optimized": last["optimized"]["bytes_moved"],
            "activation_bytes": last["optimized"]["activation_bytes"],
            "naive_activation_bytes": last["original"]["naive_activation_bytes"],
            "fragmentation": last["optimized"]["fragmentation"],
            "onnxruntime": ort.__version__,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
