#!/usr/bin/env python3
"""llama.cpp peer (through llama-cpp-python): llama-bench's pp512 and tg128 on our checkpoints.

1. Converts a checkpoint made by scripts/make_random_checkpoint.py (LLaMA or GPT-2, f32 or
   bf16 safetensors) to GGUF with the `gguf` package's writer, F32 or BF16 (1-D tensors,
   norms and biases, stay F32 as in convert_hf_to_gguf.py). The file is written next to the
   checkpoint (model-<TYPE>.gguf) and reused while it is newer than model.safetensors.
   Tensors are streamed one at a time, so converting needs ~one tensor of extra memory.
   - LLaMA: q/k rows are permuted from HF's rotate-half RoPE layout to GGUF's interleaved
     pairs (convert_hf_to_gguf.py LlamaModel.permute), so logits match the HF model.
   - GPT-2: HF's Conv1D weights are (in, out) and are transposed; the output matrix is
     tied to token_embd (llama.cpp reuses it when `output` is absent).
   - Vocab: none ships with a random checkpoint, so a dummy one of the model's size is
     written: SPM ("llama": <unk> <s> </s>, the 256 <0xXX> byte tokens, then ▁tokN) or
     byte-level BPE ("gpt2": the 256 byte symbols, tokN, <|endoftext|>, one dummy merge). The
     benchmark feeds random token ids, as llama-bench does, so no text is tokenized.
2. Measures like llama-bench (tools/llama-bench in the same llama.cpp): weights read into
   ordinary memory (load_mode NONE, lazy mode off: no mmap), batch 1, n_threads =
   n_threads_batch = --threads, n_batch = n_ubatch = 512, flash attention as llama-bench's
   default (auto), one untimed warm-up of each test, then --reps repetitions, each from an
   empty KV cache (llama_memory_clear(llama_get_memory(ctx), false)).
   pp: one llama_decode of a --pp-token batch (logits of the last token only), synchronized.
   tg: --tg llama_decode calls of one token each (BOS first, then random ids), each
       synchronized, starting from position 0.
   --depth D (llama-bench's -d): each pp and tg run starts from a cache already holding D
       tokens (BOS and random ids, decoded in --batch pieces, untimed); "kv_bytes_per_token"
       and "tg_floor_fraction_with_kv" then count the f16 cache a step reads as well.
   Medians and sample standard deviations of tokens/s are printed as one JSON line, with
   each run's figure and the lowest CPU share of a run (process CPU time / (wall x
   threads); below ~0.9 another process took the cores: rerun when the machine is idle).
3. The decode floor, as `tboost bench` takes it: every --read-every tg tokens the clock stops
   and a plain read of a buffer as large as the weights a step streams (every GGUF tensor
   but token_embd, of which a step reads one row, unless it doubles as the output matrix) is
   timed on the same threads, in this process, with tboost's read kernel on a buffer
   allocated as tboost's weights are (build/release/bench/libtboost_read_probe.so through
   ctypes; --read-probe), so both libraries' floors are the same read. Each run's
   floor is its own reads' median; "tg_floor_fraction" is the median over runs of tokens/s
   against it, and "dram_read_gbps" the reads' median. The host's memory speed moves by up
   to 2x within minutes, so comparing two peers' floor fractions compares them at the same
   memory speed, which their tokens/s from separate processes do not.

Needs: pip install llama-cpp-python gguf safetensors torch numpy.
Usage: nice -n 19 bench/peers/llama_cpp_bench.py /work/ckpt/llama-110m-f32 --type F32 --reps 5
"""
import argparse
import ctypes
import json
import os
import platform
import random
import statistics
import sys
import time

import numpy as np

# ----------------------------------------------------------------------------
# HF checkpoint -> GGUF
# ----------------------------------------------------------------------------


def permute_rope(w, n_head, n_head_kv=None):
    """HF rotate-half rows (per head: all first halves, then all second halves) to GGUF's
    interleaved (x0, x1) pairs; the same reshape as convert_hf_to_gguf.py."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama_tensor_map(cfg, names):
    """(gguf name, hf name, transform) in file order."""
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads")
    out = [("token_embd.weight", "model.embed_tokens.weight", None)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", None),
            (f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight",
             lambda w: permute_rope(w, n_head, n_head)),
            (f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight",
             lambda w: permute_rope(w, n_head, n_kv)),
            (f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight", None),
            (f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", None),
            (f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", None),
            (f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight", None),
            (f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight", None),
            (f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", None),
        ]
    out.append(("output_norm.weight", "model.norm.weight", None))
    if "lm_head.weight" in names:
        out.append(("output.weight", "lm_head.weight", None))
    return out


def gpt2_tensor_map(cfg, names):
    t = lambda w: w.T.contiguous()  # noqa: E731  Conv1D stores (in, out)
    pre = "transformer." if "transformer.wte.weight" in names else ""
    out = [("token_embd.weight", pre + "wte.weight", None),
           ("position_embd.weight", pre + "wpe.weight", None)]
    for i in range(cfg["n_layer"]):
        p = f"{pre}h.{i}."
        for g, h, f in [("attn_norm", "ln_1", None), ("attn_qkv", "attn.c_attn", t),
                        ("attn_output", "attn.c_proj", t), ("ffn_norm", "ln_2", None),
                        ("ffn_up", "mlp.c_fc", t), ("ffn_down", "mlp.c_proj", t)]:
            out.append((f"blk.{i}.{g}.weight", p + h + ".weight", f))
            out.append((f"blk.{i}.{g}.bias", p + h + ".bias", None))
    out += [("output_norm.weight", pre + "ln_f.weight", None),
            ("output_norm.bias", pre + "ln_f.bias", None)]
    if "lm_head.weight" in names and not cfg.get("tie_word_embeddings", True):
        out.append(("output.weight", "lm_head.weight", None))
    return out


def gpt2_byte_symbols():
    """GPT-2's byte -> printable unicode table (bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def add_dummy_vocab(w, arch, n_vocab, gguf):
    TT = gguf.TokenType
    if arch == "llama":
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        types = [TT.UNKNOWN, TT.CONTROL, TT.CONTROL] + [TT.BYTE] * 256
        toks += [f"\u2581tok{i}" for i in range(len(toks), n_vocab)]
        types += [TT.NORMAL] * (n_vocab - len(types))
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(toks)
        w.add_token_scores([-float(i) for i in range(n_vocab)])
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
    else:
        toks = gpt2_byte_symbols()
        toks += [f"tok{i}" for i in range(len(toks), n_vocab - 1)] + ["<|endoftext|>"]
        types = [TT.NORMAL] * (n_vocab - 1) + [TT.CONTROL]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(toks)
        w.add_token_types(types)
        # llama.cpp requires the merges key and the writer drops empty arrays: one dummy
        # merge (of two space symbols) keeps the key without changing any tokenization we do.
        w.add_token_merges(["\u0120 \u0120"])
        w.add_bos_token_id(n_vocab - 1)
        w.add_eos_token_id(n_vocab - 1)
        w.add_add_bos_token(False)


def convert(ckpt, gtype, out_path):
    import gguf
    import torch
    from safetensors import safe_open

    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    arch = cfg["model_type"]
    st_path = os.path.join(ckpt, "model.safetensors")
    f = safe_open(st_path, framework="pt")
    names = set(f.keys())
    if arch == "llama":
        tmap = llama_tensor_map(cfg, names)
    elif arch == "gpt2":
        tmap = gpt2_tensor_map(cfg, names)
    else:
        raise SystemExit(f"unsupported model_type {arch!r} (llama, gpt2)")

    w = gguf.GGUFWriter(out_path + ".tmp", arch)
    w.add_name(os.path.basename(os.path.normpath(ckpt)))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if gtype == "F32"
                    else gguf.LlamaFileType.MOSTLY_BF16)
    if arch == "llama":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    else:
        w.add_context_length(cfg["n_positions"])
        w.add_embedding_length(cfg["n_embd"])
        w.add_block_count(cfg["n_layer"])
        w.add_feed_forward_length(cfg.get("n_inner") or 4 * cfg["n_embd"])
        w.add_head_count(cfg["n_head"])
        w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
    n_vocab = cfg["vocab_size"]
    w.add_vocab_size(n_vocab)
    add_dummy_vocab(w, arch, n_vocab, gguf)

    def to_gguf(t, fn):
        t = f.get_tensor(t)
        if fn is not None:
            t = fn(t)
        if t.dim() == 1 or gtype == "F32":  # norms and biases stay F32, as convert does
            return t.to(torch.float32).contiguous().numpy(), None
        # BF16: round-to-nearest-even from f32 (torch), stored as raw 16-bit words.
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy(), \
            gguf.GGMLQuantizationType.BF16

    # Tensor infos first (shapes and byte counts only), then the data one tensor at a time.
    for g, h, _ in tmap:
        shape = list(f.get_slice(h).get_shape())
        if h.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) and arch == "gpt2":
            shape = shape[::-1]
        bf16 = gtype == "BF16" and len(shape) > 1
        nbytes = int(np.prod(shape)) * (2 if bf16 else 4)
        w.add_tensor_info(g, shape, np.dtype(np.int16 if bf16 else np.float32), nbytes,
                          raw_dtype=gguf.GGMLQuantizationType.BF16 if bf16 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for g, h, fn in tmap:
        arr, _ = to_gguf(h, fn)
        w.write_tensor_data(arr)
    w.close()
    os.replace(out_path + ".tmp", out_path)


def floor_bytes(gguf_path):
    """(bytes the floor reads, bytes a decode step reads): every tensor once, but only one row
    of token_embd unless no output.weight exists (then it is the output matrix too)."""
    import gguf
    r = gguf.GGUFReader(gguf_path)
    tied = not any(t.name == "output.weight" for t in r.tensors)
    streamed, row = 0, 0
    for t in r.tensors:
        if t.name == "token_embd.weight" and not tied:
            row = int(t.n_bytes) // int(t.shape[-1] if len(t.shape) > 1 else 1)
            continue
        streamed += int(t.n_bytes)
    return streamed, streamed + row


# ----------------------------------------------------------------------------
# Benchmark
# ----------------------------------------------------------------------------

THREADS = 2  # --threads, for the CPU share


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def timed(n, t, c):
    """(tokens/s, CPU share) of a region started at perf_counter t, process_time c. The
    share is process CPU time / (wall time x threads): well below 1 means other processes
    took our cores during the run (the result is then not the library's speed)."""
    wall = time.perf_counter() - t
    return n / wall, (time.process_time() - c) / (wall * THREADS)


def peak_rss_bytes():
    """This process's peak resident set so far (VmHWM), in bytes; 0 where /proc has none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="HF checkpoint dir (config.json + model.safetensors), "
                    "or a .gguf file to benchmark as is")
    ap.add_argument("--type", choices=["F32", "BF16"], default="F32", help="GGUF weight type")
    ap.add_argument("--model", help="name in the JSON (default: checkpoint dir name)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0,
                    help="tokens in the KV cache before each pp and tg run (untimed), as "
                    "llama-bench's -d")
    ap.add_argument("--batch", type=int, default=512, help="n_batch = n_ubatch")
    ap.add_argument("--fa", choices=["auto", "on", "off"], default="auto",
                    help="flash attention (llama-bench's default: auto)")
    ap.add_argument("--reconvert", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="keep llama.cpp's log")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--read-probe", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "../../build/release/bench/libtboost_read_probe.so"),
        help="tboost's read kernel as a shared library (the floor; skipped if missing)")
    ap.add_argument("--read-every", type=int, default=16, help="tg tokens between floor reads")
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads

    t0 = time.time()
    if args.checkpoint.endswith(".gguf"):
        gguf_path = args.checkpoint
        name = args.model or os.path.basename(gguf_path)[:-5]
    else:
        gguf_path = os.path.join(args.checkpoint, f"model-{args.type}.gguf")
        st = os.path.join(args.checkpoint, "model.safetensors")
        if (args.reconvert or not os.path.exists(gguf_path)
                or os.path.getmtime(gguf_path) < os.path.getmtime(st)):
            convert(args.checkpoint, args.type, gguf_path)
        name = args.model or os.path.basename(os.path.normpath(args.checkpoint))
    convert_s = time.time() - t0

    import llama_cpp as L

    if not args.verbose:
        # Silence llama.cpp's log (kept alive in a global: ctypes must not free it).
        global _log_cb
        _log_cb = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(_log_cb, ctypes.c_void_p(0))
    L.llama_backend_init()

    t0 = time.time()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.load_mode = L.LLAMA_LOAD_MODE_NONE  # read into ordinary memory, no mmap
    mp.lazy_mode = 0                       # LLAMA_LAZY_MODE_OFF: every tensor read up front
    model = L.llama_model_load_from_file(gguf_path.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {gguf_path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = args.depth + max(args.pp, args.tg + 1) + 128
    cp.n_batch = cp.n_ubatch = args.batch
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
                          "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                          "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[args.fa]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama_init_from_model failed")
    load_s = time.time() - t0
    mem = L.llama_get_memory(ctx)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    bos = L.llama_vocab_bos(vocab) if L.llama_vocab_get_add_bos(vocab) else None
    rng = random.Random(args.seed)

    def decode(ids):
        arr = (L.llama_token * len(ids))(*ids)
        rc = L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids)))
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")

    def fill_depth():  # the cache at --depth tokens (BOS first), untimed
        L.llama_memory_clear(mem, False)
        if args.depth > 0:
            ids = [bos if bos is not None else rng.randrange(n_vocab)] + \
                [rng.randrange(n_vocab) for _ in range(args.depth - 1)]
            for i in range(0, args.depth, args.batch):
                decode(ids[i:i + args.batch])
            L.llama_synchronize(ctx)

    def first_id():  # BOS opens an empty cache; at depth the run continues the sequence
        return bos if bos is not None and args.depth == 0 else rng.randrange(n_vocab)

    def run_pp(n):
        fill_depth()
        ids = [first_id() if bos is not None else rng.randrange(n_vocab)] + \
            [rng.randrange(n_vocab) for _ in range(n - 1)]
        t, c = time.perf_counter(), time.process_time()
        for i in range(0, n, args.batch):  # one call when n <= n_batch, as pp512 is
            decode(ids[i:i + args.batch])
        L.llama_synchronize(ctx)
        return timed(n, t, c)

    # Peak RSS of the model, its context and one prompt's compute, taken before the floor's
    # buffer (as large as the weights) is allocated. It includes this Python process (tens of
    # MB); tboost's figure includes its own process the same way.
    run_pp(args.pp)
    peak_rss = peak_rss_bytes()

    probe = None
    if args.read_probe and os.path.exists(args.read_probe):
        probe = ctypes.CDLL(args.read_probe)
        probe.tboost_read_seconds.restype = ctypes.c_double
        probe.tboost_read_seconds.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
        probe.tboost_read_buffer_new.restype = ctypes.c_void_p
        probe.tboost_read_buffer_new.argtypes = [ctypes.c_int64]
        probe.tboost_read_buffer_free.argtypes = [ctypes.c_void_p]
        streamed, bpt = floor_bytes(gguf_path)
        # Allocated as tboost's weights are, so both floors are the same read.
        floor_ptr = probe.tboost_read_buffer_new(streamed)
        if not floor_ptr:
            raise SystemExit(f"could not allocate the {streamed}-byte floor buffer")
    reads_all, fracs, fracs_kv = [], [], []
    # KV bytes a tg step reads, mean over the run: the f16 cache (llama.cpp's default type_k /
    # type_v) of every layer at the step's context, as tboost bench counts its own.
    n_layer, n_head = L.llama_model_n_layer(model), L.llama_model_n_head(model)
    head_dim = L.llama_model_n_embd(model) // n_head
    kv_bpt = (args.depth + (args.tg + 1) / 2) * n_layer * 2 * L.llama_model_n_head_kv(model) * \
        head_dim * 2

    def run_tg(n, floor=False):
        fill_depth()
        ids = [first_id()] + \
            [rng.randrange(n_vocab) for _ in range(n - 1)]
        arrs = [(L.llama_token * 1)(i) for i in ids]
        wall = cpu = 0.0
        reads = []
        for i, a in enumerate(arrs):
            if floor and probe is not None and i % args.read_every == 0:
                reads.append(probe.tboost_read_seconds(floor_ptr, streamed, args.threads))
            t, c = time.perf_counter(), time.process_time()
            rc = L.llama_decode(ctx, L.llama_batch_get_one(a, 1))
            if rc != 0:
                raise SystemExit(f"llama_decode returned {rc}")
            L.llama_synchronize(ctx)
            wall += time.perf_counter() - t
            cpu += time.process_time() - c
        if reads:
            # floor tokens/s = (streamed / read seconds) / bytes per token
            read_s = statistics.median(reads)
            fracs.append(n / wall * read_s * bpt / streamed)
            fracs_kv.append(n / wall * read_s * (bpt + kv_bpt) / streamed)
            reads_all.extend(reads)
        return n / wall, cpu / (wall * THREADS)

    run_tg(1)  # warm-ups, as llama-bench: one prompt (above, before the RSS), one token
    pp, pp_util = zip(*[run_pp(args.pp) for _ in range(args.reps)])
    tg, tg_util = zip(*[run_tg(args.tg, floor=True) for _ in range(args.reps)])
    floor = {}
    if fracs:
        floor = {"tg_floor_fraction": round(statistics.median(fracs), 4),
                 "dram_read_gbps": round(streamed / statistics.median(reads_all) / 1e9, 2),
                 "weight_bytes_per_token": bpt, "tg_floor_fractions": [round(x, 4) for x in fracs],
                 "kv_bytes_per_token": kv_bpt,
                 "tg_floor_fraction_with_kv": round(statistics.median(fracs_kv), 4)}

    L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps({
        "peer": "llama.cpp", "model": name, "dtype": args.type.lower(),
        "threads": args.threads, "pp_tokens": args.pp, "tg_tokens": args.tg, "depth": args.depth,
        "reps": args.reps,
        "pp_tokens_per_s": round(statistics.median(pp), 2), "pp_sd": round(sd(pp), 2),
        "tg_tokens_per_s": round(statistics.median(tg), 2), "tg_sd": round(sd(tg), 2),
        "pp_runs": [round(x, 2) for x in pp], "tg_runs": [round(x, 2) for x in tg],
        "cpu_share_pp": round(min(pp_util), 2), "cpu_share_tg": round(min(tg_util), 2),
        "pp_shares": [round(x, 2) for x in pp_util], "tg_shares": [round(x, 2) for x in tg_util],
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "gguf": gguf_path, "weights": "in memory (load_mode none, no mmap)",
        "flash_attn": args.fa, "n_batch": args.batch,
        "convert_s": round(convert_s, 2), "load_s": round(load_s, 2),
        "llama_cpp_python": L.__version__,
        "system_info": L.llama_print_system_info().decode().strip(),
        "peak_rss_bytes": peak_rss,
        "cpu": platform.processor() or platform.machine(), **floor}))


if __name__ == "__main__":
    sys.exit(main())
