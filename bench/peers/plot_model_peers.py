#!/usr/bin/env python3
"""Summarises bench/peers/run_model_peers.sh output: a markdown table (medians over all runs of
each peer, and the ratios tboost / peer computed per round, i.e. between runs made back to
back) and a PNG bar chart of pp512 and tg128 tokens/s.

Usage: plot_model_peers.py RUNS.jsonl OUT.png [HOST]   (prints the markdown table on stdout;
       HOST names the machine in the title, default "AVX2 host")
Needs: matplotlib.
"""
import collections
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
key = lambda r: (r["model"], r["dtype"])
by = collections.defaultdict(lambda: collections.defaultdict(list))
rounds = collections.defaultdict(dict)
for r in runs:
    by[key(r)][r["peer"]].append(r)
    rounds[key(r) + (r.get("round", 0),)][r["peer"]] = r

def med(xs):
    return statistics.median(xs) if xs else float("nan")

peers = ["tboost", "llama.cpp", "pytorch", "onnxruntime"]
print("| model | dtype | peer | pp512 tok/s | tg128 tok/s | tg floor fraction | tboost/peer pp | tboost/peer tg |")
print("|---|---|---|---|---|---|---|---|")
rows = []
for k in sorted(by):
    for p in peers:
        rs = by[k].get(p, [])
        if not rs:
            continue
        pp = med([r["pp_tokens_per_s"] for r in rs])
        tg = med([r["tg_tokens_per_s"] for r in rs])
        ff = med([r["tg_floor_fraction"] for r in rs]) if p == "tboost" else None
        # per-round ratios (same round = adjacent runs)
        rp, rt = [], []
        for (m, d, rnd), peers_in in rounds.items():
            if (m, d) != k or "tboost" not in peers_in or p not in peers_in or p == "tboost":
                continue
            rp.append(peers_in["tboost"]["pp_tokens_per_s"] / peers_in[p]["pp_tokens_per_s"])
            rt.append(peers_in["tboost"]["tg_tokens_per_s"] / peers_in[p]["tg_tokens_per_s"])
        fmt = lambda xs: ("%.2fx" % med(xs)) + (" (%s)" % ", ".join("%.2f" % x for x in xs) if len(xs) > 1 else "") if xs else "-"
        print(f"| {k[0]} | {k[1]} | {p} | {pp:.1f} | {tg:.1f} | "
              f"{'%.0f%%' % (100 * ff) if ff else '-'} | {fmt(rp)} | {fmt(rt)} |")
        rows.append((k, p, pp, tg))

fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
labels = [f"{m}\n{d}" for (m, d) in sorted(by)]
for ax, idx, title in ((axes[0], 2, "prefill pp512 (tokens/s)"), (axes[1], 3, "decode tg128 (tokens/s)")):
    w = 0.2
    for j, p in enumerate(peers):
        vals = [next((r[idx] for r in rows if r[0] == k and r[1] == p), 0) for k in sorted(by)]
        ax.bar([i + (j - 1.5) * w for i in range(len(labels))], vals, w, label=p)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_title(title)
    ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
axes[0].legend()
host = sys.argv[3] if len(sys.argv) > 3 else "AVX2 host"
fig.suptitle(f"2 threads, batch 1, weights in memory ({host}); medians over runs")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
