// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, LLaMA-3, SmolLM, Qwen2 style).
//
// encode: added tokens are cut out of the raw text first (they bypass everything else), each
// run of plain text is normalized (NFC/NFKC... when the json asks), split by the
// pre-tokenizer steps (the ByteLevel regex, a Split regex, Digits), every piece's bytes are
// mapped through GPT-2's byte-to-unicode table and merged by rank. decode maps the characters
// back to bytes and reads them as UTF-8, invalid sequences as U+FFFD (HF's ByteLevel decoder).
//
// The pre-tokenizer regexes are written out by hand: std::regex knows neither \p{..} nor
// Unicode, and the three patterns in use (GPT-2's; LLaMA-3's; Qwen2's, LLaMA-3's with single
// digits) are small alternations whose backtracking is easy to state exactly. A tokenizer.json
// with any other pattern is rejected by name rather than tokenized differently from HF.
#include <cstdio>
#include <deque>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "src/model/tokenizer_internal.h"
#include "tboost/core/error.h"

namespace tboost::model::tok {
namespace {

// The regex families, as the strings tokenizer.json holds them.
struct Pattern {
  bool llama = false;  // LLaMA-3 / Qwen2 alternation instead of GPT-2's
  bool ci = false;     // (?i:) contractions
  int max_digits = 0;  // \p{N}{1,k}; 0 = \p{N}+ with an optional leading space (GPT-2)
};
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool pattern_of(const std::string& re, Pattern* p) {
  if (re == kGpt2Regex)
    *p = {false, false, 0};
  else if (re == kLlama3Regex)
    *p = {true, true, 3};
  else if (re == kQwen2Regex)
    *p = {true, true, 1};
  else
    return false;
  return true;
}

// The regex at c[i]: end of the match (first alternative that matches, with the regex's
// backtracking), or i when none does.
size_t match_at(const std::vector<Char>& c, size_t i, const Pattern& p) {
  const size_t n = c.size();
  const auto at = [&](size_t k) -> char32_t { return k < n ? c[k].cp : 0; };
  const auto L = [&](size_t k) { return k < n && is_letter(c[k].cp); };
  const auto N = [&](size_t k) { return k < n && is_number(c[k].cp); };
  const auto S = [&](size_t k) { return k < n && is_space_re(c[k].cp); };
  const auto other = [&](size_t k) { return k < n && !S(k) && !L(k) && !N(k); };
  const auto crlf = [&](size_t k) { return at(k) == '\r' || at(k) == '\n'; };
  const auto run = [&](size_t k, auto pred) {
    while (pred(k)) ++k;
    return k;
  };
  // 's|'t|'re|'ve|'m|'ll|'d, ASCII case folded under (?i) (plus U+017F, which folds to 's').
  if (at(i) == '\'') {
    const auto lc = [&](size_t k) -> char32_t {
      char32_t ch = at(k);
      if (!p.ci) return ch;
      if (ch == 0x17F) return 's';
      return ch >= 'A' && ch <= 'Z' ? ch + 32 : ch;
    };
    const char32_t a = lc(i + 1), b = lc(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  }
  if (!p.llama) {
    const size_t j = at(i) == ' ' ? i + 1 : i;  // " ?" then at least one of the class
    if (L(j)) return run(j, L);                 // ` ?\p{L}+`
    if (N(j)) return run(j, N);                 // ` ?\p{N}+`
    if (other(j)) return run(j, other);         // ` ?[^\s\p{L}\p{N}]+`
  } else {
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if (L(i)) return run(i, L);
    if (i < n && !crlf(i) && !N(i) && L(i + 1)) return run(i + 1, L);
    // `\p{N}{1,k}`
    if (N(i)) {
      size_t j = i;
      while (j < n && j - i < static_cast<size_t>(p.max_digits) && N(j)) ++j;
      return j;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    const size_t j = at(i) == ' ' && other(i + 1) ? i + 1 : i;
    if (other(j)) return run(run(j, other), crlf);
    // `\s*[\r\n]+`: the whitespace run up to and including its last \r or \n.
    if (S(i)) {
      const size_t e = run(i, S);
      for (size_t k = e; k > i; --k)
        if (crlf(k - 1)) return k;
    }
  }
  // `\s+(?!\S)` backs off one character when a non-space follows; then `\s+`.
  if (S(i)) {
    const size_t e = run(i, S);
    return (e == n || e - i < 2) ? e : e - 1;
  }
  return i;
}

// One pre-tokenizer step; each maps a list of pieces to a finer one.
struct Step {
  enum Kind { kRegex, kDigits, kLiteral, kPrefixSpace } kind = kRegex;
  Pattern pattern;
  bool individual = false;  // Digits: one piece per digit
  std::string literal;      // Split with a String pattern
  bool remove = false;      // Split behavior "Removed" (else "Isolated")
};

void apply_step(const Step& s, std::string_view piece, std::vector<std::string_view>& out) {
  if (s.kind == Step::kLiteral) {
    size_t pos = 0;
    while (true) {
      const size_t hit = s.literal.empty() ? std::string_view::npos : piece.find(s.literal, pos);
      const size_t end = hit == std::string_view::npos ? piece.size() : hit;
      if (end > pos) out.push_back(piece.substr(pos, end - pos));
      if (hit == std::string_view::npos) return;
      if (!s.remove) out.push_back(piece.substr(hit, s.literal.size()));
      pos = hit + s.literal.size();
    }
  }
  const std::vector<Char> c = utf8_chars(piece);
  const auto byte_at = [&](size_t k) { return k < c.size() ? c[k].begin : piece.size(); };
  size_t gap = 0;  // start (char index) of text no match has covered yet
  for (size_t i = 0; i < c.size();) {
    size_t e = i;
    if (s.kind == Step::kRegex) {
      e = match_at(c, i, s.pattern);
    } else if (is_number(c[i].cp)) {
      e = i + 1;
      if (!s.individual)
        while (e < c.size() && is_number(c[e].cp)) ++e;
    }
    if (e == i) {
      ++i;
      continue;
    }
    if (i > gap) out.push_back(piece.substr(byte_at(gap), byte_at(i) - byte_at(gap)));
    out.push_back(piece.substr(byte_at(i), byte_at(e) - byte_at(i)));
    gap = i = e;
  }
  if (gap < c.size()) out.push_back(piece.substr(byte_at(gap)));
}

class ByteLevelBpe final : public Tokenizer {
 public:
  ByteLevelBpe(const json& j, const std::string& path);
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  std::string kind() const override { return "bpe"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t token_id(std::string_view token) const override {
    const int32_t a = added_.id_of(token);
    if (a >= 0) return a;
    auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }

 private:
  void parse_pre_tokenizer(const json& pt, const std::string& path);
  void parse_normalizer(const json& nm, const std::string& path);
  void bpe_word(std::string_view bytes, std::vector<int32_t>& out) const;
  std::string mapped(std::string_view bytes) const {
    std::string s;
    for (unsigned char b : bytes) s += byte_char_[b];
    return s;
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // "" where no token has the id
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  AddedTokens added_;
  Template template_;
  std::vector<Step> steps_;
  std::vector<NormalForm> normal_forms_;
  bool byte_level_ = false, ignore_merges_ = false;
  int32_t unk_ = -1, bos_ = -1, eos_ = -1;
  std::string byte_char_[256];                       // byte -> its character, UTF-8
  int32_t byte_id_[256];                             // byte -> id of its one-character token
  std::unordered_map<char32_t, uint8_t> char_byte_;  // the inverse map, for decode
  // Words seen before -> their ids (HF caches the same way); bounded, then not grown.
  static constexpr size_t kCacheCapacity = 10000;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

ByteLevelBpe::ByteLevelBpe(const json& j, const std::string& path) {
  // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 are
  // moved to U+0100.. in byte order, so every byte is a visible, non-space character.
  for (int b = 0, extra = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    append_utf8(byte_char_[b], cp);
    char_byte_[cp] = static_cast<uint8_t>(b);
  }

  const json& model = j["model"];
  const json& vocab = model.value("vocab", json());
  if (!vocab.is_object() || vocab.empty()) fail(path, "BPE model needs a non-empty \"vocab\"");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX)
      fail(path, "vocab entry \"" + it.key() + "\" needs a non-negative integer id");
    const int32_t id = it.value().get<int32_t>();
    vocab_[it.key()] = id;
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(id + 1);
    id_to_token_[id] = it.key();
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
      fail(path, std::string("BPE \"") + k + "\" is not supported with byte-level BPE");
  }
  ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = vocab_.find(model["unk_token"].get<std::string>());
    if (it != vocab_.end()) unk_ = it->second;
  }

  const json& merges = model.value("merges", json::array());
  if (!merges.is_array()) fail(path, "BPE \"merges\" must be an array");
  int32_t rank = 0;
  for (const json& m : merges) {
    std::string a, b;
    if (m.is_string()) {  // "a b" (older files, GPT-2's)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail(path, "merge \"" + s + "\" is not two tokens separated by one space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      fail(path, "merge " + m.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || ic == vocab_.end())
      fail(path, "merge \"" + a + "\" + \"" + b + "\" uses or makes a token not in the vocab");
    merges_.try_emplace(key(ia->second, ib->second), Merge{rank++, ic->second});
  }

  added_ = parse_added_tokens(j, path);
  // Added tokens beyond the model vocab extend the id range.
  for (const AddedToken& t : added_.all()) {
    if (static_cast<size_t>(t.id) >= id_to_token_.size()) id_to_token_.resize(t.id + 1);
    if (id_to_token_[t.id].empty()) id_to_token_[t.id] = t.content;
  }

  parse_normalizer(j.value("normalizer", json()), path);
  parse_pre_tokenizer(j.value("pre_tokenizer", json()), path);
  if (!byte_level_)
    fail(path,
         "BPE without a ByteLevel pre-tokenizer is not supported (SentencePiece-style "
         "tokenizers load from tokenizer.model)");
  const json& dec = j.value("decoder", json());
  const auto byte_level_decoder = [](const json& d) {
    return d.is_object() && d.value("type", "") == "ByteLevel";
  };
  bool dec_ok = byte_level_decoder(dec);
  if (dec.is_object() && dec.value("type", "") == "Sequence")
    for (const json& d : dec.value("decoders", json::array())) dec_ok |= byte_level_decoder(d);
  if (!dec_ok) fail(path, "BPE needs a ByteLevel decoder, got " + dec.dump().substr(0, 200));
  template_ = parse_post_processor(j.value("post_processor", json()), path);

  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_char_[b]);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  // BOS/EOS: tokenizer_config.json beside the file (what HF reads), else the template's
  // first/last special token, else GPT-2's <|endoftext|> for both.
  const json cfg = sibling_config(path);
  bos_ = token_id(config_token(cfg, "bos_token"));
  eos_ = token_id(config_token(cfg, "eos_token"));
  if (bos_ < 0 && !template_.prefix.empty()) bos_ = template_.prefix.front();
  if (eos_ < 0 && !template_.suffix.empty()) eos_ = template_.suffix.back();
  if (bos_ < 0 && eos_ < 0) bos_ = eos_ = token_id("<|endoftext|>");
}

void ByteLevelBpe::parse_normalizer(const json& nm, const std::string& path) {
  if (nm.is_null()) return;
  const std::string type = nm.is_object() ? nm.value("type", "") : "";
  if (type == "Sequence") {
    for (const json& n : nm.value("normalizers", json::array())) parse_normalizer(n, path);
    return;
  }
  if (type == "NFC")
    normal_forms_.push_back(NormalForm::kNfc);
  else if (type == "NFD")
    normal_forms_.push_back(NormalForm::kNfd);
  else if (type == "NFKC")
    normal_forms_.push_back(NormalForm::kNfkc);
  else if (type == "NFKD")
    normal_forms_.push_back(NormalForm::kNfkd);
  else
    fail(path, "unsupported normalizer " + nm.dump().substr(0, 200) + " for byte-level BPE");
}

void ByteLevelBpe::parse_pre_tokenizer(const json& pt, const std::string& path) {
  const std::string type = pt.is_object() ? pt.value("type", "") : "";
  if (type == "Sequence") {
    for (const json& p : pt.value("pretokenizers", json::array())) parse_pre_tokenizer(p, path);
    return;
  }
  if (type == "ByteLevel") {
    byte_level_ = true;
    if (pt.value("add_prefix_space", false)) {
      Step s;
      s.kind = Step::kPrefixSpace;
      steps_.push_back(s);
    }
    if (pt.value("use_regex", true)) {
      Step s;
      pattern_of(kGpt2Regex, &s.pattern);
      steps_.push_back(s);
    }
    return;
  }
  if (type == "Digits") {
    Step s;
    s.kind = Step::kDigits;
    s.individual = pt.value("individual_digits", false);
    steps_.push_back(s);
    return;
  }
  if (type == "Split") {
    const std::string behavior = pt.value("behavior", "");
    if (pt.value("invert", false) || (behavior != "Isolated" && behavior != "Removed"))
      fail(path, "Split pre-tokenizer: only behavior Isolated/Removed without invert is supported");
    const json& pat = pt.value("pattern", json());
    Step s;
    s.remove = behavior == "Removed";
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      if (s.remove || !pattern_of(pat["Regex"].get<std::string>(), &s.pattern))
        fail(path, "unsupported Split regex " + pat["Regex"].dump() +
                       " (supported: GPT-2's, LLaMA-3's and Qwen2's, Isolated)");
    } else if (pat.contains("String") && pat["String"].is_string()) {
      s.kind = Step::kLiteral;
      s.literal = pat["String"].get<std::string>();
    } else {
      fail(path, "Split pre-tokenizer needs a Regex or String pattern");
    }
    steps_.push_back(s);
    return;
  }
  fail(path, "unsupported pre_tokenizer " + (pt.is_null() ? std::string("null") : type) +
                 " for BPE (supported: ByteLevel, Split, Digits, Sequence; SentencePiece-style "
                 "tokenizers load from tokenizer.model)");
}

// Rank-ordered merging, HF's algorithm: a heap of candidate pairs keyed (rank, position); a
// popped pair is applied if both symbols are still there and still form it. O(n log n).
void ByteLevelBpe::bpe_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(mapped(bytes));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(std::string(bytes));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> sym;
  sym.reserve(bytes.size());
  for (unsigned char b : bytes) {
    int32_t id = byte_id_[b];
    if (id < 0) {  // a byte the vocab lacks: <0xNN> byte fallback, else unk, else dropped
      char buf[8];
      snprintf(buf, sizeof buf, "<0x%02X>", b);
      auto it = vocab_.find(buf);
      id = it != vocab_.end() ? it->second : unk_;
      if (id < 0) continue;
    }
    const int32_t i = static_cast<int32_t>(sym.size());
    sym.push_back({id, i - 1, -1});
    if (i > 0) sym[i - 1].next = i;
  }
  struct Cand {
    int32_t rank, pos, id;
    bool operator<(const Cand& o) const {  // std::priority_queue pops the largest
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Cand> heap;
  const auto offer = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto it = merges_.find(key(sym[pos].id, sym[sym[pos].next].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) offer(i);
  std::vector<bool> dead(sym.size(), false);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (dead[c.pos] || sym[c.pos].next < 0) continue;
    const int32_t r = sym[c.pos].next;
    auto it = merges_.find(key(sym[c.pos].id, sym[r].id));
    if (it == merges_.end() || it->second.id != c.id) continue;  // stale
    sym[c.pos].id = c.id;
    sym[c.pos].next = sym[r].next;
    if (sym[r].next >= 0) sym[sym[r].next].prev = c.pos;
    dead[r] = true;
    offer(sym[c.pos].prev);
    offer(c.pos);
  }
  std::vector<int32_t> ids;
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(bytes), std::move(ids));
}

std::vector<int32_t> ByteLevelBpe::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special) out = template_.prefix;
  for (const AddedTokens::Piece& seg : added_.split(text)) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    std::string norm(seg.text);
    for (NormalForm f : normal_forms_) norm = normalize(norm, f);
    std::vector<std::string_view> pieces{norm}, next;
    std::deque<std::string> prefixed;  // owns pieces that got a leading space (stable)
    for (const Step& s : steps_) {
      if (s.kind == Step::kPrefixSpace) {  // ByteLevel's add_prefix_space, on every piece
        for (std::string_view& p : pieces)
          if (!p.starts_with(' ')) p = prefixed.emplace_back(" " + std::string(p));
        continue;
      }
      next.clear();
      for (std::string_view p : pieces) apply_step(s, p, next);
      pieces.swap(next);
    }
    for (std::string_view p : pieces) bpe_word(p, out);
  }
  if (add_special) out.insert(out.end(), template_.suffix.begin(), template_.suffix.end());
  return out;
}

std::string ByteLevelBpe::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) continue;
    const AddedToken* t = added_.by_id(id);
    if (t && skip_special && t->special) continue;
    const std::string& s = t ? t->content : id_to_token_[id];
    // Each character back to its byte; a token with a character outside the table (an added
    // token such as "<|im start|>" with a real space) is taken as its own UTF-8, as HF does.
    std::string tb;
    bool mappable = true;
    for (const Char& c : utf8_chars(s)) {
      auto it = char_byte_.find(c.cp);
      if (it == char_byte_.end()) {
        mappable = false;
        break;
      }
      tb += static_cast<char>(it->second);
    }
    bytes += mappable ? tb : s;
  }
  return utf8_lossy(bytes);
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe(const json& j, const std::string& path) {
  return std::make_unique<ByteLevelBpe>(j, path);
}

}  // namespace tboost::model::tok
