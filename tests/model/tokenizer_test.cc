// Tokenizers against the goldens in tests/data/tokenizers/ (Hugging Face tokenizers and
// sentencepiece on 36 varied texts, see its README.md): ids with and without specials, decode
// with and without skipping specials, round trips where the tokenizer is lossless, and
// StreamDecoder fed one id at a time. Plus the LLaMA-3/Qwen2 pre-tokenizer regexes and Digits
// (ids from tokenizers 0.23 on the small byte-level vocab), and bad files.
#include "tboost/model/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "tboost/core/error.h"

namespace tboost::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string data(const std::string& rel) {
  return std::string(TBOOST_SOURCE_DIR) + "/tests/data/tokenizers/" + rel;
}
json load(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}
std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  StreamDecoder sd(tok, skip_special);
  std::string out;
  for (int32_t id : ids) out += sd.push(id);
  return out + sd.flush();
}

// Every golden case; returns how many matched in full (ids, decodes, stream, round trip).
int check_golden(const Tokenizer& tok, const std::string& golden, bool lossless) {
  const json g = load(data(golden));
  const json texts = load(data("texts.json"));
  EXPECT_EQ(g["cases"].size(), texts.size());
  int ok = 0;
  for (const json& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(golden + " text: " + text);
    const std::vector<int32_t> ids = ids_of(c["ids"]), ids_sp = ids_of(c["ids_with_special"]);
    const int failures_before =
        ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
    EXPECT_EQ(tok.encode(text, false), ids);
    EXPECT_EQ(tok.encode(text, true), ids_sp);
    // sentencepiece's "decoded" is decode(ids) (it skips control ids either way).
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>());
    const std::string skip = c.contains("decoded_skip_special")
                                 ? c["decoded_skip_special"].get<std::string>()
                                 : c["decoded"].get<std::string>();
    EXPECT_EQ(tok.decode(ids_sp, true), skip);
    if (lossless) {
      EXPECT_EQ(tok.decode(ids, false), text);
    }
    EXPECT_EQ(stream(tok, ids_sp, true), tok.decode(ids_sp, true));
    EXPECT_EQ(stream(tok, ids_sp, false), tok.decode(ids_sp, false));
    ok += ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count() ==
          failures_before;
  }
  std::printf("[ golden ] %s: %d/%zu texts match\n", golden.c_str(), ok, g["cases"].size());
  return ok;
}

TEST(TokenizerGolden, ByteLevelBpe) {
  auto tok = Tokenizer::from_dir(data("bytelevel_bpe"));
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 1000);
  EXPECT_EQ(tok->token_id("<|endoftext|>"), 0);
  EXPECT_EQ(tok->eos_id(), 0);  // GPT-2's convention when no tokenizer_config.json says
  EXPECT_EQ(tok->token_id("no such token"), -1);
  EXPECT_EQ(check_golden(*tok, "bytelevel_bpe/golden.json", true), 36);
}

TEST(TokenizerGolden, ByteLevelBpeStringMerges) {
  auto tok = Tokenizer::from_file(data("bytelevel_bpe/tokenizer.string_merges.json"));
  EXPECT_EQ(check_golden(*tok, "bytelevel_bpe/golden.json", true), 36);
}

TEST(TokenizerGolden, SmolLM2Bpe) {
  const std::string dir = "/work/pypi_models/smollm2-135m-instruct-f32";
  if (!fs::exists(dir + "/tokenizer.json"))
    GTEST_SKIP() << dir << "/tokenizer.json absent (scripts/fetch_models.sh --convert writes it)";
  auto tok = Tokenizer::from_dir(dir);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos_id(), 1);  // tokenizer_config.json: <|im_start|>, <|im_end|>
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(check_golden(*tok, "smollm2_bpe/golden.json", true), 36);
}

TEST(TokenizerGolden, WordPieceJson) {
  auto tok = Tokenizer::from_file(data("minilm_wordpiece/tokenizer.json"));
  EXPECT_EQ(tok->kind(), "wordpiece");
  EXPECT_EQ(tok->vocab_size(), 30522);
  EXPECT_EQ(tok->token_id("[CLS]"), 101);
  EXPECT_EQ(check_golden(*tok, "minilm_wordpiece/golden.json", false), 36);
}

TEST(TokenizerGolden, WordPieceVocabTxt) {
  auto tok = Tokenizer::from_file(data("minilm_wordpiece/vocab.txt"));
  EXPECT_EQ(tok->kind(), "wordpiece");
  EXPECT_EQ(check_golden(*tok, "minilm_wordpiece/golden.json", false), 36);
}

TEST(TokenizerGolden, SentencePiece) {
  auto tok = Tokenizer::from_file(data("sentencepiece_bpe/sp.model"));
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 500);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->token_id("<s>"), 1);
  EXPECT_EQ(tok->token_id("no such piece"), -1);
  EXPECT_EQ(check_golden(*tok, "sentencepiece_bpe/golden.json", true), 36);
  EXPECT_EQ(tok->decode({1, 410, 455}, false), "<s>H");
}

// The byte-level vocab with another pre-tokenizer (through a temporary file).
std::unique_ptr<Tokenizer> with_pre_tokenizer(const json& pre, const std::string& name) {
  json j = load(data("bytelevel_bpe/tokenizer.json"));
  j["pre_tokenizer"] = pre;
  const fs::path p =
      fs::temp_directory_path() / ("tboost_tok_" + name + std::to_string(getpid()) + ".json");
  std::ofstream(p) << j.dump();
  auto tok = Tokenizer::from_file(p.string());
  fs::remove(p);
  return tok;
}

const std::string kProbe = "I'M don'T 12345 x\r\n\n  y  !!\n\tz 'Neil ﬁ🙂é3";

TEST(TokenizerPreTokenizer, Llama3SplitRegex) {
  const json split = {
      {"type", "Split"},
      {"pattern",
       {{"Regex",
         R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
      {"behavior", "Isolated"},
      {"invert", false}};
  const json bl = {{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}};
  auto tok = with_pre_tokenizer({{"type", "Sequence"}, {"pretokenizers", {split, bl}}}, "llama3");
  // tokenizers 0.23, same json.
  const std::vector<int32_t> want = {41,  7,   45,  293, 262, 7,   52,  221, 17,  18, 19,
                                     20,  21,  221, 88,  202, 199, 199, 221, 221, 89, 221,
                                     221, 1,   1,   199, 198, 90,  221, 7,   46,  69, 411,
                                     221, 172, 106, 224, 717, 248, 225, 472, 19};
  EXPECT_EQ(tok->encode(kProbe, false), want);
  EXPECT_EQ(tok->decode(tok->encode(kProbe, false), false), kProbe);
}

TEST(TokenizerPreTokenizer, DigitsThenByteLevel) {
  const json digits = {{"type", "Digits"}, {"individual_digits", true}};
  const json bl = {{"type", "ByteLevel"},
                   {"add_prefix_space", true},
                   {"trim_offsets", true},
                   {"use_regex", true}};
  auto tok = with_pre_tokenizer({{"type", "Sequence"}, {"pretokenizers", {digits, bl}}}, "digits");
  // tokenizers 0.23: add_prefix_space puts a space before each digit piece ("Ġ1" "Ġ2" ...).
  const std::vector<int32_t> want = {350, 7,   45,  293, 262, 7,   52,  221, 467, 507, 640,
                                     221, 20,  221, 21,  221, 88,  202, 199, 199, 221, 221,
                                     89,  221, 221, 1,   1,   199, 198, 90,  221, 7,   46,
                                     69,  411, 221, 172, 106, 224, 717, 248, 225, 472, 640};
  EXPECT_EQ(tok->encode(kProbe, false), want);
}

void expect_error(const std::function<void()>& f, ErrorCode code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerBadInput, Files) {
  const fs::path dir = fs::temp_directory_path() / ("tboost_tok_bad" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  expect_error([&] { Tokenizer::from_file((dir / "missing.json").string()); }, ErrorCode::kIo,
               "missing.json");
  expect_error([&] { Tokenizer::from_dir((dir / "nodir").string()); }, ErrorCode::kIo, "nodir");
  const std::string bad = write("bad.json", "{\"model\": {\"type\": \"BPE\", ");
  expect_error([&] { Tokenizer::from_file(bad); }, ErrorCode::kInvalidArgument, "bad.json");
  const std::string uni = write("unigram.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  expect_error([&] { Tokenizer::from_file(uni); }, ErrorCode::kInvalidArgument, "Unigram");
  const std::string merge =
      write("merge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]},
                             "pre_tokenizer": {"type": "ByteLevel"}})");
  expect_error([&] { Tokenizer::from_file(merge); }, ErrorCode::kInvalidArgument, "merge.json");
  const std::string wrong_type =
      write("wrong_type.json", R"({"model": {"type": "BPE", "vocab": {"a": "zero"}}})");
  expect_error([&] { Tokenizer::from_file(wrong_type); }, ErrorCode::kInvalidArgument,
               "wrong_type.json");
  const std::string regex =
      write("regex.json",
            R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer":
          {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}})");
  expect_error([&] { Tokenizer::from_file(regex); }, ErrorCode::kInvalidArgument, "\\\\w+");
  const std::string sp = write("garbage.model", "this is not a protobuf");
  expect_error([&] { Tokenizer::from_file(sp); }, ErrorCode::kInvalidArgument, "garbage.model");
  const std::string vocab = write("vocab.txt", "[PAD]\nhello\n");
  expect_error([&] { Tokenizer::from_file(vocab); }, ErrorCode::kInvalidArgument, "vocab.txt");
  expect_error([&] { Tokenizer::from_file(write("x.bin", "")); }, ErrorCode::kInvalidArgument,
               "x.bin");
  const fs::path empty = dir / "empty_dir";
  fs::create_directories(empty);
  expect_error([&] { Tokenizer::from_dir(empty.string()); }, ErrorCode::kIo, "empty_dir");
  fs::remove_all(dir);
}

TEST(TokenizerBadInput, InvalidUtf8AndOddIds) {
  auto bpe = Tokenizer::from_dir(data("bytelevel_bpe"));
  const std::string bytes = "a\xff\xc3(\xe2\x82 z";
  EXPECT_EQ(bpe->decode(bpe->encode(bytes, false), false),
            "a\xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD z");  // bytes kept; decode is lossy UTF-8
  EXPECT_EQ(bpe->decode({-5, 999999, 40}, true), "H");    // ids naming no token are skipped
  auto wp = Tokenizer::from_dir(data("minilm_wordpiece"));
  EXPECT_EQ(wp->encode(bytes, false), wp->encode("a( z", false));
  auto sp = Tokenizer::from_file(data("sentencepiece_bpe/sp.model"));
  EXPECT_NO_THROW(sp->encode(bytes, true));
  EXPECT_EQ(sp->decode({-1, 100000}, true), "");
}

TEST(TokenizerStream, HoldsBackSplitCharacters) {
  auto tok = Tokenizer::from_dir(data("bytelevel_bpe"));
  const std::vector<int32_t> ids = tok->encode("日本", false);  // byte tokens
  ASSERT_GT(ids.size(), 2u);
  StreamDecoder sd(*tok);
  std::vector<std::string> parts;
  for (int32_t id : ids) parts.push_back(sd.push(id));
  for (const std::string& p : parts)
    EXPECT_TRUE(p.empty() || p == "日" || p == "本" || p == "日本") << p;
  EXPECT_EQ(sd.flush(), "");
}

}  // namespace
}  // namespace tboost::model
