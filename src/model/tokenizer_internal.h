// Internals shared by the tokenizer files: UTF-8 and Unicode helpers (categories and
// normalization through ICU), the added-token matcher every tokenizer.json tokenizer runs
// before pre-tokenization, and the constructors Tokenizer::from_file dispatches to.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tboost/model/tokenizer.h"

namespace tboost::model::tok {

using json = nlohmann::json;

// ---- UTF-8 ----
// One decoded character: its code point and its byte span in the text. A byte that starts no
// valid UTF-8 sequence decodes alone, as kInvalidCp (its category is "other"), so any input
// splits into spans that cover every byte.
constexpr char32_t kInvalidCp = 0x110000;
struct Char {
  char32_t cp;
  uint32_t begin, len;
};
std::vector<Char> utf8_chars(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);
inline bool ends_with_replacement(std::string_view s) { return s.ends_with("\xEF\xBF\xBD"); }

// ---- Unicode properties (ICU's tables) ----
bool is_letter(char32_t c);           // \p{L}
bool is_number(char32_t c);           // \p{N}
bool is_space_re(char32_t c);         // Oniguruma's \s: 9-13, U+0085, Zs, Zl, Zp
bool is_white_space(char32_t c);      // Rust char::is_whitespace (White_Space property)
bool is_other(char32_t c);            // general category C* (Cc, Cf, Cs, Co, Cn)
bool is_mark_nonspacing(char32_t c);  // Mn
bool is_punctuation(char32_t c);      // P*
// Full lowercase mapping of one character, no context (Rust char::to_lowercase).
void append_lower(std::string& out, char32_t c);
// Normal forms; the input must be valid UTF-8 (invalid bytes become U+FFFD first).
enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string normalize(std::string_view s, NormalForm form);

// ---- files ----
std::string read_file(const std::string& path);                            // kIo naming the path
json parse_json(const std::string& path);                                  // kIo / kInvalidArgument
[[noreturn]] void fail(const std::string& path, const std::string& what);  // kInvalidArgument

// ---- added tokens (tokenizer.json "added_tokens", BERT's specials) ----
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true, lstrip = false, rstrip = false, single_word = false;
};
// Splits text into runs of plain text and added tokens, leftmost-longest (HF's Aho-Corasick
// with MatchKind::LeftmostLongest), honouring lstrip / rstrip / single_word.
class AddedTokens {
 public:
  void add(AddedToken t);
  struct Piece {
    std::string_view text;  // plain text when id < 0
    int32_t id = -1;
  };
  std::vector<Piece> split(std::string_view text) const;
  const AddedToken* by_id(int32_t id) const;
  int32_t id_of(std::string_view content) const;  // -1 when absent
  const std::vector<AddedToken>& all() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  std::vector<std::vector<size_t>> by_first_byte_ = std::vector<std::vector<size_t>>(256);
};
AddedTokens parse_added_tokens(const json& j, const std::string& path);

// What a tokenizer.json post_processor adds around one sequence (TemplateProcessing "single",
// BertProcessing / RobertaProcessing, Sequence of those; ByteLevel adds nothing).
struct Template {
  std::vector<int32_t> prefix, suffix;
};
Template parse_post_processor(const json& pp, const std::string& path);

// Optional fields of a tokenizer_config.json beside `path` (empty json when absent or bad).
json sibling_config(const std::string& path);
// A tokenizer_config.json token field: "text" or {"content": "text"}; "" when absent.
std::string config_token(const json& cfg, const char* key);

// ---- constructors ----
std::unique_ptr<Tokenizer> make_bpe(const json& j, const std::string& path);
std::unique_ptr<Tokenizer> make_wordpiece_json(const json& j, const std::string& path);
std::unique_ptr<Tokenizer> make_wordpiece_vocab(const std::string& path);
std::unique_ptr<Tokenizer> make_sentencepiece(const std::string& path);

}  // namespace tboost::model::tok
