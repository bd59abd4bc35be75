// strata/data/text_tokenizer.hpp: `Tokenizer`, any of the tokenizers behind one value type, and
// `make_tokenizer`, which builds one from Megatron's flags (--tokenizer-type and its files).
//
// The trainers (end-of-document id, sampling) and preprocess_data take a Tokenizer, so a tokenizer
// added here reaches both. A Tokenizer is cheap to copy: copies share the read-only vocabulary and
// each keeps its own caches, so one copy per worker thread encodes without locks.
//
// Types (Megatron's names; docs/TOKENIZERS.md lists their flags, EOD and what is refused):
//   ByteTokenizer              bytes 0..255, end of document 256 (no file; strata's default)
//   GPT2BPETokenizer           GPT-2's byte-level BPE: --vocab-file vocab.json --merge-file merges.txt
//   NullTokenizer              --vocab-size N: the text is ids separated by spaces; EOD is N
//   HuggingFaceTokenizer       --tokenizer-model <dir or tokenizer.json>: byte-level BPE, GPT-2 or
//                              Llama 3 style (huggingface_tokenizer.hpp)
//   SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer
//                              --tokenizer-model tokenizer.model, through the SentencePiece library:
//                              offered where the program links strata::sentencepiece (which defines
//                              STRATA_WITH_SENTENCEPIECE), refused with a message elsewhere
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "bpe_tokenizer.hpp"
#include "huggingface_tokenizer.hpp"
#include "null_tokenizer.hpp"
#include "tokenizer.hpp"
#if defined(STRATA_WITH_SENTENCEPIECE)
#include "sentencepiece_tokenizer.hpp"
#endif

STRATA_NAMESPACE_BEGIN
namespace data {

// Megatron's tokenizer flags.
struct TokenizerOptions {
  std::string type = "ByteTokenizer";  // --tokenizer-type
  std::string vocab_file;              // --vocab-file
  std::string merge_file;              // --merge-file
  std::string tokenizer_model;         // --tokenizer-model
  std::int64_t vocab_size = 0;         // --vocab-size (NullTokenizer)
};

class Tokenizer {
 public:
  // `impl` has encode_into(text, out), decode(ids) const, eod() const and vocab_size() const.
  template <class Impl>
  Tokenizer(Impl impl, std::string name, std::string description)
      : impl_(std::make_shared<Model<Impl>>(std::move(impl))), name_(std::move(name)), description_(std::move(description)) {}

  // Appends the ids of `text` to `out`.
  void encode_into(std::string_view text, std::vector<std::int32_t>& out) { own().encode_into(text, out); }
  std::vector<std::int32_t> encode(std::string_view text) {
    std::vector<std::int32_t> out;
    encode_into(text, out);
    return out;
  }
  // The text the ids stand for (the end-of-document id as the tokenizer spells it).
  std::string decode(std::span<const std::int32_t> ids) const { return impl_->decode(ids); }
  // The same as text to show: the whole sequence decoded at once (a character that byte-level
  // pieces split is whole again), then every byte that is not valid UTF-8 (a cut character at
  // the end, bytes that form none) replaced by U+FFFD, as Python's errors="replace".
  std::string decode_text(std::span<const std::int32_t> ids) const { return replace_invalid_utf8(decode(ids)); }
  std::int32_t eod() const { return impl_->eod(); }
  // Largest id + 1: the embedding rows every id needs (before padding to a multiple).
  std::int64_t vocab_size() const { return impl_->vocab_size(); }
  // Megatron's --tokenizer-type of it, and one line saying what it holds (files, sizes, eod).
  const std::string& name() const { return name_; }
  const std::string& description() const { return description_; }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual std::shared_ptr<Concept> copy() const = 0;
    virtual void encode_into(std::string_view text, std::vector<std::int32_t>& out) = 0;
    virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
    virtual std::int32_t eod() const = 0;
    virtual std::int64_t vocab_size() const = 0;
  };
  template <class Impl>
  struct Model final : Concept {
    explicit Model(Impl i) : impl(std::move(i)) {}
    std::shared_ptr<Concept> copy() const override { return std::make_shared<Model>(impl); }
    void encode_into(std::string_view text, std::vector<std::int32_t>& out) override { impl.encode_into(text, out); }
    std::string decode(std::span<const std::int32_t> ids) const override { return impl.decode(ids); }
    std::int32_t eod() const override { return impl.eod(); }
    std::int64_t vocab_size() const override { return impl.vocab_size(); }
    Impl impl;
  };
  // Copies share impl_ until one encodes (encoding may fill a cache): then it takes its own.
  Concept& own() {
    if (impl_.use_count() > 1) impl_ = impl_->copy();
    return *impl_;
  }

  std::shared_ptr<Concept> impl_;
  std::string name_, description_;
};

// The byte tokenizer as a value with the interface Tokenizer needs.
struct ByteTokenizerImpl {
  void encode_into(std::string_view text, std::vector<std::int32_t>& out) const { ByteTokenizer::encode_into(text, out); }
  std::string decode(std::span<const std::int32_t> ids) const { return ByteTokenizer::decode(ids); }
  std::int32_t eod() const { return ByteTokenizer::kEod; }
  std::int64_t vocab_size() const { return ByteTokenizer::kVocabSize; }
};

// Whether this program was built with the SentencePiece library (strata::sentencepiece).
#if defined(STRATA_WITH_SENTENCEPIECE)
inline constexpr bool kHasSentencePiece = true;
#else
inline constexpr bool kHasSentencePiece = false;
#endif

// Megatron's --tokenizer-type values that strata reads.
inline constexpr std::string_view kTokenizerTypes[] = {"ByteTokenizer",   "GPT2BPETokenizer",          "NullTokenizer",
                                                       "HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
                                                       "Llama2Tokenizer"};

namespace detail {
inline bool is_sentencepiece_type(std::string_view type) {
  return type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer";
}
}  // namespace detail

// Checks which flags go with --tokenizer-type before any file is read (ConfigError naming the flag).
inline void validate(const TokenizerOptions& o) {
  const std::string_view type = o.type;
  if (std::find(std::begin(kTokenizerTypes), std::end(kTokenizerTypes), type) == std::end(kTokenizerTypes)) {
    std::string known;
    for (std::string_view t : kTokenizerTypes) known += (known.empty() ? "" : ", ") + std::string(t);
    const bool megatron = type == "BertWordPieceLowerCase" || type == "BertWordPieceCase" || type == "TikTokenizer" ||
                          type == "MultimodalTokenizer" || type == "SFTTokenizer" || type == "NullMultimodalTokenizer";
    fail<ConfigError>("--tokenizer-type ", o.type, megatron ? " is Megatron's but not supported by strata" : " is not known",
                      ": use one of ", known);
  }
  const bool bpe_files = type == "GPT2BPETokenizer";
  const bool model_file = type == "HuggingFaceTokenizer" || detail::is_sentencepiece_type(type);
  if (bpe_files && (o.vocab_file.empty() || o.merge_file.empty()))
    fail<ConfigError>("--tokenizer-type ", o.type, " needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
  if (!bpe_files && (!o.vocab_file.empty() || !o.merge_file.empty()))
    fail<ConfigError>("--vocab-file and --merge-file are the files of --tokenizer-type GPT2BPETokenizer; ", o.type,
                      " takes none", model_file ? " (it reads --tokenizer-model)" : "");
  if (model_file && o.tokenizer_model.empty())
    fail<ConfigError>("--tokenizer-type ", o.type, " needs --tokenizer-model (",
                      type == "HuggingFaceTokenizer" ? "a tokenizer.json or the directory holding it" : "a SentencePiece tokenizer.model", ")");
  if (!model_file && !o.tokenizer_model.empty())
    fail<ConfigError>("--tokenizer-model is not a file of --tokenizer-type ", o.type,
                      "; it goes with HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer");
  if (type == "NullTokenizer" && o.vocab_size <= 0)
    fail<ConfigError>("--tokenizer-type NullTokenizer needs --vocab-size N > 0 (the ids of the data are 0..N-1; EOD is N)");
  if (type != "NullTokenizer" && o.vocab_size != 0)
    fail<ConfigError>("--vocab-size is the vocabulary of --tokenizer-type NullTokenizer; ", o.type, " takes its size from ",
                      type == "ByteTokenizer" ? "its bytes (257)" : "its files");
  if (detail::is_sentencepiece_type(type) && !kHasSentencePiece)
    fail<ConfigError>("--tokenizer-type ", o.type, " needs the SentencePiece library, and this program was built without it: ",
                      "install it (Debian/Ubuntu: libsentencepiece-dev) and link strata::sentencepiece, which CMake defines when it ",
                      "finds the library");
}

// The tokenizer of the flags, its files read and checked (FileError naming the file).
inline Tokenizer make_tokenizer(const TokenizerOptions& o) {
  using ::strata::detail::concat;
  validate(o);
  if (o.type == "GPT2BPETokenizer") {
    BpeTokenizer bpe(o.vocab_file, o.merge_file);
    std::string description = concat("GPT2BPETokenizer (vocab ", bpe.vocab_size(), " from '", o.vocab_file, "', ", bpe.merge_count(),
                                     " merges from '", o.merge_file, "', eod ", bpe.eod(), ")");
    return Tokenizer(std::move(bpe), o.type, std::move(description));
  }
  if (o.type == "NullTokenizer") {
    NullTokenizer null(o.vocab_size);
    std::string description = concat("NullTokenizer (ids 0..", o.vocab_size - 1, " written as text, vocab ", null.vocab_size(), ", eod ",
                                     null.eod(), ")");
    return Tokenizer(std::move(null), o.type, std::move(description));
  }
  if (o.type == "HuggingFaceTokenizer") {
    HuggingFaceTokenizer hf(o.tokenizer_model);
    std::string description = concat("HuggingFaceTokenizer (byte-level BPE, ", hf.pre_tokenizer_name(), " pre-tokenizer, vocab ",
                                     hf.vocab_size(), ", ", hf.merge_count(), " merges, ", hf.added_token_count(), " added tokens from '",
                                     hf.file(), "', eod ", hf.eod(), ": ", hf.eod_rule(), ")");
    return Tokenizer(std::move(hf), o.type, std::move(description));
  }
#if defined(STRATA_WITH_SENTENCEPIECE)
  if (detail::is_sentencepiece_type(o.type)) {
    const auto kind = o.type == "SentencePieceTokenizer"      ? SentencePieceTokenizer::Kind::sentencepiece
                      : o.type == "GPTSentencePieceTokenizer" ? SentencePieceTokenizer::Kind::gpt_sentencepiece
                                                              : SentencePieceTokenizer::Kind::llama2;
    SentencePieceTokenizer sp(o.tokenizer_model, kind);
    std::string description = concat(o.type, " (", sp.piece_count(), " pieces from '", o.tokenizer_model, "', vocab ", sp.vocab_size(),
                                     ", eod ", sp.eod(), kind == SentencePieceTokenizer::Kind::llama2 ? ", bos first" : "", ")");
    return Tokenizer(std::move(sp), o.type, std::move(description));
  }
#endif
  return Tokenizer(ByteTokenizerImpl{}, "ByteTokenizer", concat("ByteTokenizer (vocab ", ByteTokenizer::kVocabSize, ", eod ", ByteTokenizer::kEod, ")"));
}

}  // namespace data
STRATA_NAMESPACE_END
