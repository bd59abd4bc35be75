#!/usr/bin/env python3
"""Trains the small tokenizers that tests/tokenizers ships, offline, on the shipped corpus.

Writes into <output> (default: tests/tokenizers, beside this script):

  gpt2_bpe/tokenizer.json     Hugging Face tokenizers, GPT-2 style: the ByteLevel pre-tokenizer with
                              GPT-2's pattern and no prefix space, a BPE model over the 256 byte
                              symbols, then "<|endoftext|>" (special, the next id, as GPT-2's 50256)
                              and "<sep>" (an added token that is not special and is normalized)
  llama3_bpe/tokenizer.json   Llama 3 style: pre-tokenizer Sequence[Split(Llama 3's pattern,
                              isolated), ByteLevel(use_regex=false)], BPE with ignore_merges, the
                              special tokens <|begin_of_text|>, <|end_of_text|>, two reserved ones
                              and <|eot_id|>, and a TemplateProcessing post-processor that puts
                              <|begin_of_text|> first, as Meta's file has it
  llama3_bpe/tokenizer_config.json   {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
                              (what transformers reads for eos_token_id, Megatron's EOD)
  sp_bpe.model                SentencePiece BPE as the Llama 2 tokenizer is trained: byte fallback,
                              digits split, no normalization, a dummy prefix, whitespace kept,
                              <unk> <s> </s> = 0 1 2, no pad
  sp_unigram.model            SentencePiece unigram, otherwise SentencePiece's defaults but without
                              normalization (identity: the NFKC rules would add 240 KB to the file;
                              normalizing is the library's own work, the same for any rule)

The corpus is read as preprocess_data reads plain text: one document per paragraph (blank lines
separate them). Each vocabulary is small (2000-2048) so the files stay small; training is
deterministic for a given tokenizers / sentencepiece release (the versions are printed).

    python3 tests/tokenizers/train_tokenizers.py [--output DIR]
"""

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from train_bpe import read_paragraphs  # noqa: E402

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|eot_id|>"]


def train_gpt2(paragraphs, output, vocab_size):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(paragraphs, trainer=trainer, length=len(paragraphs))
    tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    tokenizer.add_tokens([AddedToken("<sep>", special=False, normalized=True)])
    path = output / "gpt2_bpe"
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    return path / "tokenizer.json"


def train_llama3(paragraphs, output, vocab_size):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(paragraphs, trainer=trainer, length=len(paragraphs))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIALS])
    bos = tokenizer.token_to_id(LLAMA3_SPECIALS[0])
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{LLAMA3_SPECIALS[0]}:0 $A:0",
                                      pair=f"{LLAMA3_SPECIALS[0]}:0 $A:0 {LLAMA3_SPECIALS[0]}:1 $B:1",
                                      special_tokens=[(LLAMA3_SPECIALS[0], bos)]),
    ])
    # Meta's file merges a word only when it is not itself a token (ignore_merges).
    data = json.loads(tokenizer.to_str())
    data["model"]["ignore_merges"] = True
    tokenizer = Tokenizer.from_str(json.dumps(data))
    path = output / "llama3_bpe"
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": LLAMA3_SPECIALS[0], "eos_token": LLAMA3_SPECIALS[1],
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2) + "\n")
    return path / "tokenizer.json"


def train_sentencepiece(paragraphs, output, model_type, vocab_size):
    import os
    import sentencepiece as spm
    name = "sp_bpe" if model_type == "bpe" else "sp_unigram"
    prefix = output.resolve() / name
    # The model records its model_prefix: a bare name, so the file is the same wherever it is trained.
    here = os.getcwd()
    os.chdir(output)
    options = dict(sentence_iterator=iter(paragraphs), model_prefix=name, model_type=model_type,
                   vocab_size=vocab_size, character_coverage=1.0, num_threads=1, minloglevel=2,
                   max_sentence_length=20000, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    if model_type == "unigram":
        options.update(normalization_rule_name="identity")
    if model_type == "bpe":  # the Llama 2 recipe
        options.update(byte_fallback=True, split_digits=True, normalization_rule_name="identity",
                       add_dummy_prefix=True, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True)
    try:
        spm.SentencePieceTrainer.train(**options)
    finally:
        os.chdir(here)
    pathlib.Path(str(prefix) + ".vocab").unlink()  # the .model holds everything
    return pathlib.Path(str(prefix) + ".model")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(HERE.parent.parent / "examples" / "data" / "kjv_pentateuch.txt"))
    p.add_argument("--output", default=str(HERE), help="directory to write into (default: %(default)s)")
    p.add_argument("--bpe-vocab-size", type=int, default=2048)
    p.add_argument("--sp-vocab-size", type=int, default=2000)
    args = p.parse_args()
    try:
        import sentencepiece
        import tokenizers
    except ImportError as e:
        print(f"train_tokenizers.py: {e}; pip install tokenizers sentencepiece", file=sys.stderr)
        return 2
    paragraphs = read_paragraphs(args.corpus)
    output = pathlib.Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    written = [train_gpt2(paragraphs, output, args.bpe_vocab_size),
               train_llama3(paragraphs, output, args.bpe_vocab_size),
               train_sentencepiece(paragraphs, output, "bpe", args.sp_vocab_size),
               train_sentencepiece(paragraphs, output, "unigram", args.sp_vocab_size)]
    for path in written:
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    print(f"trained on {args.corpus}: {len(paragraphs)} paragraphs; tokenizers {tokenizers.__version__}, "
          f"sentencepiece {sentencepiece.__version__}, Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
