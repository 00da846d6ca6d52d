// WordPiece (BERT) from a tokenizer.json or a plain vocab.txt, as HF tokenizers' BertNormalizer,
// BertPreTokenizer, WordPiece model and WordPiece decoder do it.
//
// Normalizer, in HF's order: clean text (drop NUL, U+FFFD and control/format characters, any
// whitespace becomes ' '), put spaces around CJK ideographs, strip accents (NFD, drop
// non-spacing marks; on when strip_accents is null and lowercase is on), lowercase (full
// per-character mapping). Pre-tokenizer: split on whitespace, isolate punctuation (ASCII
// punctuation and Unicode P*). Model: greedy longest-match-first, continuations prefixed
// "##"; a word longer than max_input_chars_per_word or with an unmatchable rest is one [UNK].
// Decoder: tokens joined by spaces, "##" pieces glued on, then HF's per-token cleanup
// (" ." -> "." ...), so decode is not the input text (lowercased, spaced punctuation).
#include <unordered_map>

#include "src/model/tokenizer_internal.h"
#include "tboost/core/error.h"

namespace tboost::model::tok {
namespace {

// HF tokenizers' CJK ranges (BertNormalizer::is_chinese_char).
bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}
bool is_bert_whitespace(char32_t c) {
  return c == '\t' || c == '\n' || c == '\r' || is_white_space(c);
}
bool is_bert_control(char32_t c) { return c != '\t' && c != '\n' && c != '\r' && is_other(c); }
bool is_bert_punct(char32_t c) {
  return (c < 0x80 && ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                       (c >= 123 && c <= 126))) ||
         is_punctuation(c);
}

// HF decoders::wordpiece::cleanup, applied to each token (with its leading space).
std::string cleanup(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    const std::string_view f(from), t(to);
    for (size_t pos = s.find(f); pos != std::string::npos; pos = s.find(f, pos + t.size()))
      s.replace(pos, f.size(), t);
  }
  return s;
}

struct Options {
  bool clean_text = true, cjk = true, strip_accents = true, lowercase = true;
  bool decoder_cleanup = true;
  std::string prefix = "##";
  size_t max_chars = 100;
};

class WordPiece final : public Tokenizer {
 public:
  WordPiece(std::unordered_map<std::string, int32_t> vocab, AddedTokens added, Template tpl,
            Options opt, const std::string& unk, const std::string& path)
      : vocab_(std::move(vocab)),
        added_(std::move(added)),
        template_(std::move(tpl)),
        opt_(std::move(opt)) {
    if (vocab_.empty()) fail(path, "empty WordPiece vocab");
    for (const auto& [tok, id] : vocab_) {
      if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(id + 1);
      id_to_token_[id] = tok;
    }
    for (const AddedToken& t : added_.all()) {
      if (static_cast<size_t>(t.id) >= id_to_token_.size()) id_to_token_.resize(t.id + 1);
      if (id_to_token_[t.id].empty()) id_to_token_[t.id] = t.content;
    }
    unk_ = token_id(unk);
    if (unk_ < 0) fail(path, "unk token \"" + unk + "\" is not in the vocab");
  }
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  std::string kind() const override { return "wordpiece"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  // BERT has no BOS/EOS (HF's bos_token is None); [CLS]/[SEP] are what encode adds.
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return -1; }
  int32_t token_id(std::string_view token) const override {
    const int32_t a = added_.id_of(token);
    if (a >= 0) return a;
    auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }

 private:
  std::string normalize_text(std::string_view text) const;
  void word(std::string_view w, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  AddedTokens added_;
  Template template_;
  Options opt_;
  int32_t unk_ = -1;
};

std::string WordPiece::normalize_text(std::string_view text) const {
  std::string s;
  s.reserve(text.size() + 8);
  for (const Char& ch : utf8_chars(text)) {
    char32_t c = ch.cp == kInvalidCp ? 0xFFFD : ch.cp;
    if (opt_.clean_text) {
      if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
      if (is_bert_whitespace(c)) c = ' ';
    }
    if (opt_.cjk && is_cjk(c)) {
      s += ' ';
      append_utf8(s, c);
      s += ' ';
    } else {
      append_utf8(s, c);
    }
  }
  if (opt_.strip_accents) {
    std::string d = normalize(s, NormalForm::kNfd);
    s.clear();
    for (const Char& ch : utf8_chars(d))
      if (!is_mark_nonspacing(ch.cp)) s.append(d, ch.begin, ch.len);
  }
  if (opt_.lowercase) {
    std::string l;
    l.reserve(s.size());
    for (const Char& ch : utf8_chars(s)) append_lower(l, ch.cp);
    s.swap(l);
  }
  return s;
}

void WordPiece::word(std::string_view w, std::vector<int32_t>& out) const {
  const std::vector<Char> chars = utf8_chars(w);
  if (chars.size() > opt_.max_chars) {
    out.push_back(unk_);
    return;
  }
  const size_t first = out.size();
  std::string key;
  for (size_t start = 0; start < chars.size();) {
    int32_t found = -1;
    size_t end = chars.size();
    for (; end > start; --end) {
      const size_t b0 = chars[start].begin;
      const size_t b1 = end < chars.size() ? chars[end].begin : w.size();
      key.assign(start > 0 ? opt_.prefix : std::string());
      key.append(w.substr(b0, b1 - b0));
      auto it = vocab_.find(key);
      if (it != vocab_.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {
      out.resize(first);
      out.push_back(unk_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

std::vector<int32_t> WordPiece::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special) out = template_.prefix;
  for (const AddedTokens::Piece& seg : added_.split(text)) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    const std::string norm = normalize_text(seg.text);
    // BertPreTokenizer: whitespace separates words and is dropped; punctuation stands alone.
    size_t word_begin = 0;
    bool in_word = false;
    for (const Char& ch : utf8_chars(norm)) {
      const bool space = is_white_space(ch.cp), punct = !space && is_bert_punct(ch.cp);
      if (space || punct) {
        if (in_word) word(std::string_view(norm).substr(word_begin, ch.begin - word_begin), out);
        in_word = false;
        if (punct) word(std::string_view(norm).substr(ch.begin, ch.len), out);
      } else if (!in_word) {
        in_word = true;
        word_begin = ch.begin;
      }
    }
    if (in_word) word(std::string_view(norm).substr(word_begin), out);
  }
  if (add_special) out.insert(out.end(), template_.suffix.begin(), template_.suffix.end());
  return out;
}

std::string WordPiece::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  size_t i = 0;  // index among the tokens kept, as HF's decoder sees them
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || id_to_token_[id].empty())
      continue;
    const AddedToken* t = added_.by_id(id);
    if (t && skip_special && t->special) continue;
    std::string tok = t ? t->content : id_to_token_[id];
    if (i++ != 0) {
      if (tok.starts_with(opt_.prefix)) {
        tok.erase(0, opt_.prefix.size());
      } else {
        tok.insert(0, " ");
      }
    }
    out += opt_.decoder_cleanup ? cleanup(std::move(tok)) : tok;
  }
  return out;
}

// [PAD] [UNK] [CLS] [SEP] [MASK] as special added tokens (those the vocab has), the way
// transformers' BertTokenizer treats them.
AddedTokens bert_specials(const std::unordered_map<std::string, int32_t>& vocab) {
  AddedTokens added;
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    auto it = vocab.find(s);
    if (it != vocab.end()) added.add({s, it->second});
  }
  return added;
}

Template bert_template(const std::unordered_map<std::string, int32_t>& vocab,
                       const std::string& path) {
  auto cls = vocab.find("[CLS]"), sep = vocab.find("[SEP]");
  if (cls == vocab.end() || sep == vocab.end()) fail(path, "vocab lacks [CLS] or [SEP]");
  return {{cls->second}, {sep->second}};
}

}  // namespace

std::unique_ptr<Tokenizer> make_wordpiece_vocab(const std::string& path) {
  const std::string text = read_file(path);
  std::unordered_map<std::string, int32_t> vocab;
  int32_t id = 0;
  for (size_t pos = 0; pos < text.size(); ++id) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string tok = text.substr(pos, nl - pos);
    if (!tok.empty() && tok.back() == '\r') tok.pop_back();
    vocab[tok] = id;  // a repeated line: the later id wins, as transformers' load_vocab
    pos = nl + 1;
  }
  vocab.erase("");
  // tokenizer_config.json beside vocab.txt may change BERT's uncased defaults.
  const json cfg = sibling_config(path);
  Options opt;
  opt.lowercase = cfg.value("do_lower_case", true);
  opt.cjk = cfg.value("tokenize_chinese_chars", true);
  opt.strip_accents = cfg.contains("strip_accents") && cfg["strip_accents"].is_boolean()
                          ? cfg["strip_accents"].get<bool>()
                          : opt.lowercase;
  std::string unk = config_token(cfg, "unk_token");
  if (unk.empty()) unk = "[UNK]";
  AddedTokens added = bert_specials(vocab);
  Template tpl = bert_template(vocab, path);
  return std::make_unique<WordPiece>(std::move(vocab), std::move(added), std::move(tpl),
                                     std::move(opt), unk, path);
}

std::unique_ptr<Tokenizer> make_wordpiece_json(const json& j, const std::string& path) {
  const json& model = j["model"];
  const json& v = model.value("vocab", json());
  if (!v.is_object()) fail(path, "WordPiece model needs a \"vocab\" object");
  std::unordered_map<std::string, int32_t> vocab;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX)
      fail(path, "vocab entry \"" + it.key() + "\" needs a non-negative integer id");
    vocab[it.key()] = it.value().get<int32_t>();
  }
  Options opt;
  opt.prefix = model.value("continuing_subword_prefix", std::string("##"));
  opt.max_chars = model.value("max_input_chars_per_word", size_t{100});
  const std::string unk = model.value("unk_token", std::string("[UNK]"));

  const json& nm = j.value("normalizer", json());
  if (nm.is_null()) {
    opt.clean_text = opt.cjk = opt.strip_accents = opt.lowercase = false;
  } else if (nm.is_object() && nm.value("type", "") == "BertNormalizer") {
    opt.clean_text = nm.value("clean_text", true);
    opt.cjk = nm.value("handle_chinese_chars", true);
    opt.lowercase = nm.value("lowercase", true);
    opt.strip_accents = nm.contains("strip_accents") && nm["strip_accents"].is_boolean()
                            ? nm["strip_accents"].get<bool>()
                            : opt.lowercase;
  } else {
    fail(path, "unsupported normalizer " + nm.dump().substr(0, 200) +
                   " for WordPiece (supported: BertNormalizer, null)");
  }
  const json& pt = j.value("pre_tokenizer", json());
  if (!pt.is_object() || pt.value("type", "") != "BertPreTokenizer")
    fail(path, "unsupported pre_tokenizer " + pt.dump().substr(0, 200) +
                   " for WordPiece (supported: BertPreTokenizer)");
  const json& dec = j.value("decoder", json());
  if (dec.is_object() && dec.value("type", "") == "WordPiece") {
    opt.decoder_cleanup = dec.value("cleanup", true);
  } else if (!dec.is_null()) {
    fail(path, "unsupported decoder " + dec.dump().substr(0, 200) + " for WordPiece");
  }
  AddedTokens added = parse_added_tokens(j, path);
  Template tpl = parse_post_processor(j.value("post_processor", json()), path);
  return std::make_unique<WordPiece>(std::move(vocab), std::move(added), std::move(tpl),
                                     std::move(opt), unk, path);
}

}  // namespace tboost::model::tok
