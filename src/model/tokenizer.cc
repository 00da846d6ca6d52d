// Tokenizer loading (file-type dispatch), the helpers every tokenizer shares (UTF-8, Unicode
// properties and normalization through ICU, tokenizer.json pieces: added tokens and
// post-processors) and StreamDecoder. The three kinds live in tokenizer_bpe.cc,
// tokenizer_wordpiece.cc and tokenizer_sentencepiece.cc.
//
// Unicode tables come from ICU (the Debian libicu-dev the project already needs), so the
// categories behind \p{L}, \p{N}, \s and BERT's punctuation/control tests are the standard's,
// not a hand-copied subset.
#include "tboost/model/tokenizer.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/core/file_io.h"
#include "src/model/tokenizer_internal.h"
#include "tboost/core/error.h"

namespace tboost::model {
namespace tok {

// ---- UTF-8 ----

namespace {
// Length of the valid UTF-8 sequence at s[i], or 0 with *bad = length of the maximal invalid
// subpart (Unicode's "substitution of maximal subparts", what Rust's from_utf8_lossy does).
size_t utf8_seq(std::string_view s, size_t i, char32_t* cp, size_t* bad) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c0 = b(i);
  if (c0 < 0x80) {
    *cp = c0;
    return 1;
  }
  size_t len;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;  // overlong
    if (c0 == 0xED) hi = 0x9F;  // surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;  // overlong
    if (c0 == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    *bad = 1;
    return 0;
  }
  char32_t v = c0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const bool ok =
        i + k < s.size() && b(i + k) >= (k == 1 ? lo : 0x80) && b(i + k) <= (k == 1 ? hi : 0xBF);
    if (!ok) {
      *bad = k;
      return 0;
    }
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  *cp = v;
  return len;
}
}  // namespace

std::vector<Char> utf8_chars(std::string_view s) {
  std::vector<Char> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    size_t bad = 0, n = utf8_seq(s, i, &cp, &bad);
    if (n == 0) cp = kInvalidCp, n = bad;
    out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(n)});
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp = 0;
    size_t bad = 0, n = utf8_seq(bytes, i, &cp, &bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  return out;
}

// ---- Unicode properties ----

namespace {
uint32_t gc_mask(char32_t c) {
  return c >= kInvalidCp ? U_GC_CN_MASK : U_GET_GC_MASK(static_cast<UChar32>(c));
}
}  // namespace

bool is_letter(char32_t c) { return (gc_mask(c) & U_GC_L_MASK) != 0; }
bool is_number(char32_t c) { return (gc_mask(c) & U_GC_N_MASK) != 0; }
bool is_white_space(char32_t c) {
  return c < kInvalidCp && u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}
// Oniguruma's Unicode [[:space:]] table is exactly White_Space.
bool is_space_re(char32_t c) { return is_white_space(c); }
// Unassigned code points (Cn) are not "other" here: HF's unicode_categories has no Cn table.
bool is_other(char32_t c) {
  return c < kInvalidCp &&
         (gc_mask(c) & (U_GC_CC_MASK | U_GC_CF_MASK | U_GC_CS_MASK | U_GC_CO_MASK)) != 0;
}
bool is_mark_nonspacing(char32_t c) { return (gc_mask(c) & U_GC_MN_MASK) != 0; }
bool is_punctuation(char32_t c) { return (gc_mask(c) & U_GC_P_MASK) != 0; }

void append_lower(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (c >= kInvalidCp) {
    out += "\xEF\xBF\xBD";
    return;
  }
  // One character alone: ICU's full mapping without context (no final sigma), like Rust's
  // char::to_lowercase.
  UChar src[2], dst[8];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, static_cast<UChar32>(c));
  UErrorCode err = U_ZERO_ERROR;
  const int32_t m = u_strToLower(dst, 8, src, n, "", &err);
  if (U_FAILURE(err)) {
    append_utf8(out, c);
    return;
  }
  for (int32_t i = 0; i < m;) {
    UChar32 d;
    U16_NEXT(dst, i, m, d);
    append_utf8(out, static_cast<char32_t>(d));
  }
}

std::string normalize(std::string_view s, NormalForm form) {
  if (s.empty()) return {};
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n2 = form == NormalForm::kNfc    ? unorm2_getNFCInstance(&err)
                           : form == NormalForm::kNfd  ? unorm2_getNFDInstance(&err)
                           : form == NormalForm::kNfkc ? unorm2_getNFKCInstance(&err)
                                                       : unorm2_getNFKDInstance(&err);
  TBOOST_CHECK_CODE(U_SUCCESS(err), ErrorCode::kInternal, "ICU normalizer: ", u_errorName(err));
  const std::string valid = utf8_lossy(s);
  std::u16string u16(valid.size() + 1, u'\0');
  int32_t len16 = 0;
  u_strFromUTF8(reinterpret_cast<UChar*>(u16.data()), static_cast<int32_t>(u16.size()), &len16,
                valid.data(), static_cast<int32_t>(valid.size()), &err);
  TBOOST_CHECK_CODE(U_SUCCESS(err), ErrorCode::kInternal, "ICU UTF-8: ", u_errorName(err));
  // Decomposition grows text by at most a factor of 18 (Unicode's stated bound, UAX #15).
  std::u16string norm(static_cast<size_t>(len16) * 18 + 4, u'\0');
  const int32_t nlen = unorm2_normalize(n2, reinterpret_cast<const UChar*>(u16.data()), len16,
                                        reinterpret_cast<UChar*>(norm.data()),
                                        static_cast<int32_t>(norm.size()), &err);
  TBOOST_CHECK_CODE(U_SUCCESS(err), ErrorCode::kInternal, "ICU normalize: ", u_errorName(err));
  std::string out(static_cast<size_t>(nlen) * 3 + 1, '\0');
  int32_t olen = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &olen,
              reinterpret_cast<const UChar*>(norm.data()), nlen, &err);
  TBOOST_CHECK_CODE(U_SUCCESS(err), ErrorCode::kInternal, "ICU UTF-16: ", u_errorName(err));
  out.resize(static_cast<size_t>(olen));
  return out;
}

// ---- files ----

void fail(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "tokenizer " + path + ": " + what);
}

std::string read_file(const std::string& path) { return tboost::read_file(path, "tokenizer"); }

json parse_json(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(path, std::string("malformed JSON: ") + e.what());
  }
}

json sibling_config(const std::string& path) {
  const auto cfg = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg, ec)) return json::object();
  try {
    json j = json::parse(read_file(cfg.string()));
    return j.is_object() ? j : json::object();
  } catch (const std::exception&) {
    return json::object();  // optional hints only; the tokenizer file itself is what counts
  }
}

std::string config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return {};
}

// ---- added tokens ----

void AddedTokens::add(AddedToken t) {
  if (t.content.empty()) return;
  auto it = by_content_.find(t.content);
  if (it != by_content_.end()) {
    tokens_[it->second] = t;  // a later entry for the same text wins, as in HF
  } else {
    by_content_[t.content] = tokens_.size();
    by_first_byte_[static_cast<unsigned char>(t.content[0])].push_back(tokens_.size());
    tokens_.push_back(t);
  }
  by_id_[t.id] = by_content_[t.content];
}

const AddedToken* AddedTokens::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

int32_t AddedTokens::id_of(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? -1 : tokens_[it->second].id;
}

std::vector<AddedTokens::Piece> AddedTokens::split(std::string_view text) const {
  std::vector<Piece> out;
  if (tokens_.empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return out;
  }
  const std::vector<Char> chars = utf8_chars(text);
  std::vector<int32_t> char_at(text.size() + 1, -1);  // byte offset -> char index
  for (size_t k = 0; k < chars.size(); ++k) char_at[chars[k].begin] = static_cast<int32_t>(k);
  char_at[text.size()] = static_cast<int32_t>(chars.size());
  const auto word_char = [](char32_t c) { return c == '_' || is_letter(c) || is_number(c); };

  size_t plain_begin = 0;  // byte offset where the current run of plain text starts
  for (size_t ci = 0; ci < chars.size();) {
    const size_t pos = chars[ci].begin;
    const AddedToken* best = nullptr;
    for (size_t t : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const std::string& c = tokens_[t].content;
      if ((!best || c.size() > best->content.size()) && text.substr(pos).starts_with(c) &&
          char_at[pos + c.size()] >= 0)
        best = &tokens_[t];
    }
    if (!best) {
      ++ci;
      continue;
    }
    size_t begin = ci, end = static_cast<size_t>(char_at[pos + best->content.size()]);
    if (best->single_word && ((begin > 0 && word_char(chars[begin - 1].cp)) ||
                              (end < chars.size() && word_char(chars[end].cp)))) {
      ci = end;  // HF skips the match and scans on after it
      continue;
    }
    if (best->lstrip)
      while (begin > 0 && chars[begin - 1].begin >= plain_begin &&
             is_white_space(chars[begin - 1].cp))
        --begin;
    if (best->rstrip)
      while (end < chars.size() && is_white_space(chars[end].cp)) ++end;
    const size_t b0 = chars[begin].begin;
    const size_t b1 = end < chars.size() ? chars[end].begin : text.size();
    if (b0 > plain_begin) out.push_back({text.substr(plain_begin, b0 - plain_begin), -1});
    out.push_back({text.substr(b0, b1 - b0), best->id});
    plain_begin = b1;
    ci = end;
  }
  if (plain_begin < text.size()) out.push_back({text.substr(plain_begin), -1});
  return out;
}

AddedTokens parse_added_tokens(const json& j, const std::string& path) {
  AddedTokens out;
  auto it = j.find("added_tokens");
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) fail(path, "\"added_tokens\" must be an array");
  for (const json& t : *it) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string())
      fail(path, "added token needs an integer \"id\" and a string \"content\": " + t.dump());
    AddedToken a;
    a.content = t["content"].get<std::string>();
    a.id = t["id"].get<int32_t>();
    if (a.id < 0) fail(path, "added token " + a.content + " has a negative id");
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    out.add(std::move(a));
  }
  return out;
}

// ---- post-processors ----

Template parse_post_processor(const json& pp, const std::string& path) {
  Template out;
  if (pp.is_null()) return out;
  if (!pp.is_object() || !pp.contains("type")) fail(path, "malformed post_processor");
  const std::string type = pp["type"].is_string() ? pp["type"].get<std::string>() : "";
  if (type == "ByteLevel") return out;
  if (type == "Sequence") {
    for (const json& p : pp.value("processors", json::array())) {
      Template t = parse_post_processor(p, path);
      out.prefix.insert(out.prefix.end(), t.prefix.begin(), t.prefix.end());
      out.suffix.insert(out.suffix.begin(), t.suffix.begin(), t.suffix.end());
    }
    return out;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    const auto id_of = [&](const char* key) {
      const json& v = pp.value(key, json());
      if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
        fail(path, type + " needs \"" + key + "\": [token, id]");
      return v[1].get<int32_t>();
    };
    out.prefix.push_back(id_of("cls"));
    out.suffix.push_back(id_of("sep"));
    return out;
  }
  if (type == "TemplateProcessing") {
    const json& single = pp.value("single", json());
    const json& specials = pp.value("special_tokens", json::object());
    if (!single.is_array()) fail(path, "TemplateProcessing needs a \"single\" array");
    bool seen_sequence = false;
    for (const json& item : single) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const json& st = item.value("SpecialToken", json());
      if (!st.is_object() || !st.contains("id") || !st["id"].is_string())
        fail(path, "TemplateProcessing: unknown item " + item.dump());
      const std::string name = st["id"].get<std::string>();
      if (!specials.contains(name) || !specials[name].contains("ids"))
        fail(path, "TemplateProcessing: special token " + name + " has no ids");
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) fail(path, "TemplateProcessing: bad id for " + name);
        (seen_sequence ? out.suffix : out.prefix).push_back(id.get<int32_t>());
      }
    }
    return out;
  }
  fail(path, "unsupported post_processor type \"" + type +
                 "\" (supported: TemplateProcessing, BertProcessing, RobertaProcessing, "
                 "ByteLevel, Sequence)");
}

}  // namespace tok

// ---- loading ----

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(ErrorCode::kIo, "tokenizer " + path + ": no such file");
  const std::string ext = std::filesystem::path(path).extension().string();
  try {
    if (ext == ".model") return tok::make_sentencepiece(path);
    if (ext == ".txt") return tok::make_wordpiece_vocab(path);
    if (ext != ".json")
      tok::fail(path, "unknown tokenizer file type \"" + ext + "\" (expected .json, .model, .txt)");
    const tok::json j = tok::parse_json(path);
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
      tok::fail(path, "no \"model\" object (not a Hugging Face tokenizer.json)");
    const tok::json& model = j["model"];
    // Old files omit "type" for BPE; WordPiece always names itself.
    const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
    if (type == "BPE") return tok::make_bpe(j, path);
    if (type == "WordPiece") return tok::make_wordpiece_json(j, path);
    tok::fail(path, "unsupported model type \"" + type + "\" (supported: BPE, WordPiece)");
  } catch (const tok::json::exception& e) {
    // A field of the wrong JSON type (the parsers read optional fields with value()).
    tok::fail(path, std::string("malformed tokenizer file: ") + e.what());
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCode::kIo, "tokenizer directory " + dir + ": no such directory");
  const fs::path d(dir);
  const auto has = [&](const char* name) { return fs::is_regular_file(d / name, ec); };
  if (has("tokenizer.json")) {
    try {
      return from_file((d / "tokenizer.json").string());
    } catch (const Error& e) {
      // A SentencePiece-style tokenizer.json (Metaspace, byte fallback) is not supported
      // here; the tokenizer.model beside it describes the same tokenizer.
      if (e.code() != ErrorCode::kInvalidArgument || !has("tokenizer.model")) throw;
    }
  }
  if (has("tokenizer.model")) return from_file((d / "tokenizer.model").string());
  if (has("vocab.txt")) return from_file((d / "vocab.txt").string());
  throw Error(ErrorCode::kIo,
              "tokenizer directory " + dir + ": no tokenizer.json, tokenizer.model or vocab.txt");
}

// ---- streaming ----

// HF's DecodeStream::step: decode the window; emit what grew past the text already emitted,
// unless it ends in U+FFFD (a character still incomplete); then drop the window's old
// context so that the tokens of this emission become the next context.
std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::string text = tok_.decode(ids_, skip_special_);
  if (text.size() <= prefix_.size() || tok::ends_with_replacement(text)) return {};
  size_t common = prefix_.size();
  if (!std::string_view(text).starts_with(prefix_)) {
    // The decoders here keep a window's text a prefix of the longer window's; if one ever
    // does not, emit past the common part rather than fail mid-generation.
    common = std::mismatch(prefix_.begin(), prefix_.end(), text.begin()).first - prefix_.begin();
  }
  std::string out = text.substr(common);
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tok_.decode(ids_, skip_special_);
  prefix_index_ = new_prefix_index;
  return out;
}

std::string StreamDecoder::flush() {
  std::string text = tok_.decode(ids_, skip_special_);
  std::string out;
  if (text.size() > prefix_.size()) {
    size_t common =
        std::mismatch(prefix_.begin(), prefix_.end(), text.begin()).first - prefix_.begin();
    out = text.substr(common);
  }
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return out;
}

}  // namespace tboost::model
