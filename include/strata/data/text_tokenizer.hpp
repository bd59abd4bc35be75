// strata/data/text_tokenizer.hpp: `Tokenizer`, any of the tokenizers behind one value type, and
// `make_tokenizer`, which builds one from Megatron's flags (--tokenizer-type and its files).
//
// The trainers (end-of-document id, sampling) and preprocess_data take a Tokenizer, so a tokenizer
// added here reaches both. A Tokenizer is cheap to copy: copies share the read-only vocabulary and
// each keeps its own caches, so one copy per worker thread encodes without locks.
//
// Types (Megatron's names):
//   ByteTokenizer       bytes 0..255, end of document 256 (no file; strata's default)
//   GPT2BPETokenizer    GPT-2's byte-level BPE: --vocab-file vocab.json --merge-file merges.txt
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "bpe_tokenizer.hpp"
#include "tokenizer.hpp"

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

// Checks which files go with --tokenizer-type before any is read (ConfigError naming the flag).
inline void validate(const TokenizerOptions& o) {
  const bool bpe_files = o.type == "GPT2BPETokenizer";
  if (o.type != "ByteTokenizer" && o.type != "GPT2BPETokenizer")
    fail<ConfigError>("--tokenizer-type ", o.type, " is not known here: use ByteTokenizer or GPT2BPETokenizer");
  if (bpe_files && (o.vocab_file.empty() || o.merge_file.empty()))
    fail<ConfigError>("--tokenizer-type ", o.type, " needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
  if (!bpe_files && (!o.vocab_file.empty() || !o.merge_file.empty()))
    fail<ConfigError>("--vocab-file and --merge-file are the files of --tokenizer-type GPT2BPETokenizer; ", o.type,
                      " takes none");
  if (!o.tokenizer_model.empty())
    fail<ConfigError>("--tokenizer-model is not a file of --tokenizer-type ", o.type);
}

// The tokenizer of the flags, its files read and checked (FileError naming the file).
inline Tokenizer make_tokenizer(const TokenizerOptions& o) {
  validate(o);
  if (o.type == "GPT2BPETokenizer") {
    BpeTokenizer bpe(o.vocab_file, o.merge_file);
    std::string description = ::strata::detail::concat("GPT2BPETokenizer (vocab ", bpe.vocab_size(), " from '", o.vocab_file, "', ",
                                             bpe.merge_count(), " merges from '", o.merge_file, "', eod ", bpe.eod(), ")");
    return Tokenizer(std::move(bpe), o.type, std::move(description));
  }
  return Tokenizer(ByteTokenizerImpl{}, "ByteTokenizer",
                   ::strata::detail::concat("ByteTokenizer (vocab ", ByteTokenizer::kVocabSize, ", eod ", ByteTokenizer::kEod, ")"));
}

}  // namespace data
STRATA_NAMESPACE_END
