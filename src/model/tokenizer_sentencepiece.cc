// SentencePiece models (tokenizer.model, LLaMA-1/2, TinyLlama, ...) through libsentencepiece,
// so ids are sentencepiece's own (normalization, dummy prefix, byte fallback included).
//
// add_special prepends BOS as LLaMA does (no EOS), unless a tokenizer_config.json beside the
// model sets add_bos_token / add_eos_token. decode with skip_special drops control tokens and
// <unk> (HF's all_special_ids); without it they appear as their piece text ("<s>"), with the
// text between them decoded by sentencepiece.
#include <sentencepiece_processor.h>

#include "src/model/tokenizer_internal.h"
#include "tboost/core/error.h"

namespace tboost::model::tok {
namespace {

class SentencePiece final : public Tokenizer {
 public:
  explicit SentencePiece(const std::string& path) {
    const std::string bytes = read_file(path);  // kIo when missing or unreadable
    const auto st = sp_.LoadFromSerializedProto(bytes);
    if (!st.ok()) fail(path, "not a SentencePiece model: " + st.ToString());
    if (sp_.GetPieceSize() <= 0) fail(path, "SentencePiece model has no pieces");
    const json cfg = sibling_config(path);
    add_bos_ = cfg.value("add_bos_token", true) && sp_.bos_id() >= 0;
    add_eos_ = cfg.value("add_eos_token", false) && sp_.eos_id() >= 0;
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    TBOOST_CHECK_CODE(st.ok(), ErrorCode::kInvalidArgument,
                      "sentencepiece encode: ", st.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 2);
    if (add_special && add_bos_) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_special && add_eos_) out.push_back(sp_.eos_id());
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    std::vector<int> run;
    const auto flush = [&] {
      if (run.empty()) return;
      std::string text;
      const auto st = sp_.Decode(run, &text);
      TBOOST_CHECK_CODE(st.ok(), ErrorCode::kInvalidArgument,
                        "sentencepiece decode: ", st.ToString());
      out += text;
      run.clear();
    };
    const int n = sp_.GetPieceSize();
    for (int32_t id : ids) {
      if (id < 0 || id >= n) continue;  // names no piece (HF skips these too)
      if (sp_.IsControl(id) || (skip_special && sp_.IsUnknown(id))) {
        if (skip_special) continue;
        flush();
        out += sp_.IdToPiece(id);
        continue;
      }
      run.push_back(id);
    }
    flush();
    return out;
  }

  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }
  int32_t token_id(std::string_view token) const override {
    const int id = sp_.PieceToId(token);  // unknown pieces map to unk: check the way back
    return id >= 0 && sp_.IdToPiece(id) == token ? id : -1;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true, add_eos_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece(const std::string& path) {
  return std::make_unique<SentencePiece>(path);
}

}  // namespace tboost::model::tok
