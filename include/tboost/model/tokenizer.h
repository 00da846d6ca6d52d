// Tokenizers: text <-> token ids, matching Hugging Face `tokenizers` (and sentencepiece) id for
// id on the goldens in tests/data/tokenizers/.
//
// Kinds:
//   "bpe"            tokenizer.json with model BPE and a ByteLevel pre-tokenizer (GPT-2,
//                    LLaMA-3, SmolLM, Qwen2): added tokens matched first, then the pre-tokenizer
//                    regex (GPT-2's or LLaMA-3's, hand-written), GPT-2 byte-to-unicode map,
//                    rank-based merges (cached per word).
//   "wordpiece"      tokenizer.json with model WordPiece, or a BERT vocab.txt: BERT normalizer
//                    (clean text, CJK split, lowercase + accent strip), punctuation split,
//                    greedy longest-match with "##" continuations.
//   "sentencepiece"  tokenizer.model / *.model, through libsentencepiece.
// encode(add_special) adds what the HF post-processor adds ([CLS] ... [SEP] for BERT, BOS for
// SentencePiece/LLaMA, the tokenizer.json template for BPE). decode(skip_special) drops
// special tokens; ids that name no token are skipped (as HF does). Bad files give a
// tboost::Error (kIo: cannot read; kInvalidArgument: malformed or unsupported) naming the
// file and what is wrong. Tokenizers are immutable after loading; encode/decode are
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tboost::model {

class Tokenizer {
 public:
  // From a model directory: tokenizer.json (model type BPE with ByteLevel pre-tokenizer/decoder,
  // or WordPiece), else tokenizer.model (SentencePiece), else vocab.txt (WordPiece, BERT uncased
  // defaults). Errors (tboost::Error, kIo / kInvalidArgument) name the file and what is wrong.
  static std::unique_ptr<Tokenizer> from_dir(const std::string& dir);
  static std::unique_ptr<Tokenizer> from_file(const std::string& path);  // .json, .model or .txt
  virtual ~Tokenizer() = default;
  // add_special: what the HF tokenizer's post-processor adds (BERT: [CLS] ... [SEP];
  // SentencePiece/LLaMA: BOS; byte-level BPE: the tokenizer.json post_processor, usually
  // nothing).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special = true) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const = 0;
  virtual std::string kind() const = 0;  // "bpe", "wordpiece", "sentencepiece"
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;                          // -1 when none
  virtual int32_t eos_id() const = 0;                          // -1 when none
  virtual int32_t token_id(std::string_view token) const = 0;  // -1 when absent
};

// Incremental detokenization for streaming generation: push(id) returns the newly completed
// text; UTF-8 characters split over several byte tokens are held back until complete. The
// pushes plus flush() concatenate to tok.decode(all ids). Like HF's DecodeStream it decodes a
// short window (the previous token or two as context, so a leading space is kept), not the
// whole history: each push costs O(window), not O(ids so far).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true)
      : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();  // what is held back (an incomplete character decodes as U+FFFD)

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // the window: context tokens, then tokens not yet emitted
  std::string prefix_;        // decode(ids_[0, prefix_index_)): the window's emitted text
  size_t prefix_index_ = 0;   // ids_[prefix_index_, ...) are not emitted yet
};

}  // namespace tboost::model
