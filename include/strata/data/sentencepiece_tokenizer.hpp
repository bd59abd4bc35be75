// strata/data/sentencepiece_tokenizer.hpp: Megatron's SentencePiece tokenizers over the SentencePiece
// C++ library (--tokenizer-model tokenizer.model). This header needs sentencepiece_processor.h and
// libsentencepiece: include it only from code that links strata::sentencepiece (CMake defines that
// target when it finds the library; the target sets STRATA_WITH_SENTENCEPIECE=1, which makes
// make_tokenizer offer these types). The rest of strata stays header-only without it.
// STRATA_HEADER_CHECK_SKIP (the header check compiles this header in tests/data, with the library).
//
// Three of Megatron's types, each with its semantics (megatron/training/tokenizer/tokenizer.py):
//   SentencePieceTokenizer     the model's pieces, then the special tokens <CLS>, <SEP>, <EOD>,
//                              <MASK> and the pad, bos and eos pieces (<PAD>, <BOS>, <EOS> where the
//                              model has none), each appended with the next id unless it is already a
//                              piece. The text is cut at each special token it contains (the earliest
//                              one first; among those starting at the same place, the first of that
//                              list), the parts between are encoded by SentencePiece, each special
//                              token is its id. EOD is <EOD>; vocab_size() counts the added tokens.
//   GPTSentencePieceTokenizer  SentencePiece's ids as they are; EOD is the model's eos id.
//   Llama2Tokenizer            the model's bos id, then SentencePiece's ids: Megatron's
//                              _Llama2Tokenizer.tokenize(text) has bos=True, eos=False by default,
//                              and preprocess_data calls it so. EOD is the model's eos id.
// For the last two vocab_size() is the number of pieces.
//
// Text that is not UTF-8 is first decoded as Python's bytes.decode("utf-8", errors="replace") does
// (each maximal ill-formed subpart becomes U+FFFD; replace_invalid_utf8), so the ids are those the
// Python package gives for the text Megatron would hold.
//
// The processor is loaded once and shared by copies (SentencePiece's encoding is const and
// thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sentencepiece_processor.h>

#include "../core/error.hpp"
#include "../core/file.hpp"
#include "bpe_tokenizer.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

class SentencePieceTokenizer {
 public:
  enum class Kind : std::uint8_t { sentencepiece, gpt_sentencepiece, llama2 };

  SentencePieceTokenizer(const std::string& model_file, Kind kind) : kind_(kind) {
    require_regular_file(model_file, "SentencePiece model (tokenizer.model)");
    if (std::filesystem::file_size(model_file) > kMaxTokenizerBytes)
      fail<FileError>("SentencePiece model (tokenizer.model) '", model_file, "' holds more than ", kMaxTokenizerBytes,
                      " bytes, more than such a file can reasonably hold; check that the path names the right file");
    auto processor = std::make_shared<sentencepiece::SentencePieceProcessor>();
    const auto status = processor->Load(model_file);
    if (!status.ok())
      fail<FileError>("'", model_file, "' is not a SentencePiece model (tokenizer.model): ", status.ToString());
    auto shared = std::make_shared<Shared>();
    shared->file = model_file;
    const sentencepiece::SentencePieceProcessor& sp = *processor;
    shared->pieces = sp.GetPieceSize();
    shared->bos = sp.bos_id();
    shared->eos = sp.eos_id();
    if (kind != Kind::sentencepiece) {
      if (shared->eos < 0 || shared->eos >= shared->pieces)
        fail<FileError>("'", model_file, "' has no eos piece (eos_id ", shared->eos, "); ", name_of(kind),
                        " takes the end of document from it");
      if (kind == Kind::llama2 && (shared->bos < 0 || shared->bos >= shared->pieces))
        fail<FileError>("'", model_file, "' has no bos piece (bos_id ", shared->bos, "); Llama2Tokenizer puts it before each text");
      shared->vocab_size = shared->pieces;
      shared->eod = shared->eos;
    } else {
      add_megatron_specials(sp, *shared);
    }
    shared->processor = std::move(processor);
    shared_ = std::move(shared);
  }

  static std::string_view name_of(Kind kind) {
    switch (kind) {
      case Kind::sentencepiece: return "SentencePieceTokenizer";
      case Kind::gpt_sentencepiece: return "GPTSentencePieceTokenizer";
      case Kind::llama2: return "Llama2Tokenizer";
    }
    return "?";
  }

  Kind kind() const { return kind_; }
  std::int64_t vocab_size() const { return shared_->vocab_size; }
  std::int32_t eod() const { return shared_->eod; }
  std::int32_t piece_count() const { return shared_->pieces; }
  std::int32_t bos() const { return shared_->bos; }
  std::int32_t eos() const { return shared_->eos; }
  const std::string& file() const { return shared_->file; }
  // SentencePieceTokenizer's added special tokens, (text, id) in Megatron's order.
  const std::vector<std::pair<std::string, std::int32_t>>& special_tokens() const { return shared_->specials; }

  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    encode_into(text, out);
    return out;
  }
  void encode_into(std::string_view text, std::vector<std::int32_t>& out) const {
    if (is_valid_utf8(text)) {
      encode_valid(text, out);
    } else {
      const std::string replaced = replace_invalid_utf8(text);
      encode_valid(replaced, out);
    }
  }
  // SentencePiece's decoding; for SentencePieceTokenizer each special token is written as Megatron
  // writes it: the text before it decoded, then " <token> ".
  std::string decode(std::span<const std::int32_t> ids) const {
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab_size())
        fail<ConfigError>(name_of(kind_), "::decode: token ", ids[i], " at position ", i, " is not in the vocabulary of '", file(), "' (ids 0..",
                          vocab_size() - 1, ")");
    std::string out;
    std::size_t last = 0;
    if (kind_ == Kind::sentencepiece) {
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto& inverse = shared_->special_of_id;
        if (static_cast<std::size_t>(ids[i]) < inverse.size() && inverse[static_cast<std::size_t>(ids[i])] >= 0) {
          out += decode_pieces(ids.subspan(last, i - last));
          out += ' ';
          out += shared_->specials[static_cast<std::size_t>(inverse[static_cast<std::size_t>(ids[i])])].first;
          out += ' ';
          last = i + 1;
        }
      }
    }
    out += decode_pieces(ids.subspan(last));
    return out;
  }

 private:
  struct Shared {
    std::shared_ptr<const sentencepiece::SentencePieceProcessor> processor;
    std::string file;
    std::int32_t pieces = 0, bos = -1, eos = -1, eod = -1;
    std::int64_t vocab_size = 0;
    std::vector<std::pair<std::string, std::int32_t>> specials;  // SentencePieceTokenizer's, in order
    std::vector<std::int32_t> special_of_id;                     // id -> index in specials, or -1
  };

  // Megatron's _SentencePieceTokenizer: <CLS> <SEP> <EOD> <MASK>, then the pad, bos and eos pieces.
  static void add_megatron_specials(const sentencepiece::SentencePieceProcessor& sp, Shared& s) {
    std::int64_t next = s.pieces;
    const auto add = [&](const std::string& token) {
      for (const auto& special : s.specials)
        if (special.first == token) return special.second;
      std::int32_t id = sp.PieceToId(token);
      // PieceToId gives the unk id for a text that is no piece.
      if (id == sp.unk_id() && sp.IdToPiece(id) != token) id = -1;
      if (id < 0) id = static_cast<std::int32_t>(next++);
      s.specials.emplace_back(token, id);
      return id;
    };
    const auto piece_or = [&](int id, const char* fallback) {
      return id >= 0 && id < s.pieces ? sp.IdToPiece(id) : std::string(fallback);
    };
    add("<CLS>");
    add("<SEP>");
    s.eod = add("<EOD>");
    add("<MASK>");
    add(piece_or(sp.pad_id(), "<PAD>"));
    add(piece_or(sp.bos_id(), "<BOS>"));
    add(piece_or(sp.eos_id(), "<EOS>"));
    s.vocab_size = next;
    s.special_of_id.assign(static_cast<std::size_t>(next), -1);
    for (std::size_t k = 0; k < s.specials.size(); ++k) s.special_of_id[static_cast<std::size_t>(s.specials[k].second)] = static_cast<std::int32_t>(k);
  }

  void encode_valid(std::string_view text, std::vector<std::int32_t>& out) const {
    if (kind_ == Kind::llama2) out.push_back(shared_->bos);
    if (kind_ != Kind::sentencepiece) {
      encode_pieces(text, out);
      return;
    }
    // Cut at the earliest special token; at one position the first in Megatron's order.
    std::size_t from = 0;
    while (true) {
      std::size_t best = std::string_view::npos, best_k = 0;
      for (std::size_t k = 0; k < shared_->specials.size(); ++k) {
        const std::size_t at = text.find(shared_->specials[k].first, from);
        if (at < best) {
          best = at;
          best_k = k;
        }
      }
      if (best == std::string_view::npos) break;
      encode_pieces(text.substr(from, best - from), out);
      out.push_back(shared_->specials[best_k].second);
      from = best + shared_->specials[best_k].first.size();
    }
    encode_pieces(text.substr(from), out);
  }

  void encode_pieces(std::string_view text, std::vector<std::int32_t>& out) const {
    std::vector<int> ids;
    const auto status = shared_->processor->Encode(text, &ids);
    if (!status.ok()) fail<Error>(name_of(kind_), ": SentencePiece could not encode a text with '", file(), "': ", status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string decode_pieces(std::span<const std::int32_t> ids) const {
    std::string text;
    if (ids.empty()) return text;
    const std::vector<int> pieces(ids.begin(), ids.end());
    const auto status = shared_->processor->Decode(pieces, &text);
    if (!status.ok()) fail<Error>(name_of(kind_), ": SentencePiece could not decode ids with '", file(), "': ", status.ToString());
    return text;
  }

  std::shared_ptr<const Shared> shared_;
  Kind kind_;
};

}  // namespace data
STRATA_NAMESPACE_END
