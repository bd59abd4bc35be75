#!/usr/bin/env python3
"""Trains a GPT-2-style byte-level BPE on the shipped corpus with Hugging Face tokenizers.

Writes <output>/vocab.json and <output>/merges.txt in GPT-2's file format (the files Megatron's
--tokenizer-type GPT2BPETokenizer reads), and <output>/tokenizer.json (the trained pipeline, for
reference). The pipeline is GPT-2's: the ByteLevel pre-tokenizer with GPT-2's pattern and no
prefix space, a BPE model over the 256 byte symbols, vocab_size tokens (the byte symbols
included), then "<|endoftext|>" appended with the next id, as GPT-2 has it last (50256).

The corpus is read as preprocess_data reads plain text: one document per paragraph (paragraphs are
separated by blank lines; a paragraph keeps its newlines; a trailing '\\r' is dropped). Runs
offline: nothing is downloaded.

    python3 tests/tokenizers/train_bpe.py --output /tmp/bpe
    python3 tests/tokenizers/check_bpe.py --vocab /tmp/bpe/vocab.json --merges /tmp/bpe/merges.txt
"""

import argparse
import json
import pathlib
import sys
import tempfile

END_OF_TEXT = "<|endoftext|>"


def read_paragraphs(path):
    """The documents of a plain-text file, as preprocess_data splits them."""
    paragraphs, lines = [], []
    with open(path, "r", encoding="utf-8", newline="") as f:
        for line in f.read().split("\n"):
            if line.endswith("\r"):
                line = line[:-1]
            if line.strip(" \t\f\v") == "":
                if lines:
                    paragraphs.append("\n".join(lines))
                    lines = []
            else:
                lines.append(line)
    if lines:
        paragraphs.append("\n".join(lines))
    return paragraphs


def byte_symbols():
    """GPT-2's byte -> character table: printable bytes stand for themselves, the rest map to U+0100 and up."""
    own = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in own:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def byte_level(pre_tokenizers):
    try:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    except TypeError:  # a tokenizers release from before use_regex
        return pre_tokenizers.ByteLevel(add_prefix_space=False)


def main():
    here = pathlib.Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(here.parent.parent / "examples" / "data" / "kjv_pentateuch.txt"),
                   help="plain text, documents separated by blank lines (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=4096, help="tokens of the BPE model, the 256 byte symbols included (default: %(default)s)")
    p.add_argument("--min-frequency", type=int, default=2, help="fewest occurrences of a pair to merge it (default: %(default)s)")
    p.add_argument("--output", required=True, help="directory for vocab.json, merges.txt and tokenizer.json")
    args = p.parse_args()

    try:
        import tokenizers
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as e:
        print(f"train_bpe.py: the tokenizers package is needed ({e}); pip install tokenizers", file=sys.stderr)
        return 2

    paragraphs = read_paragraphs(args.corpus)
    if not paragraphs:
        print(f"train_bpe.py: no text in '{args.corpus}'", file=sys.stderr)
        return 2

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = byte_level(pre_tokenizers)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, min_frequency=args.min_frequency, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(paragraphs, trainer=trainer, length=len(paragraphs))

    output = pathlib.Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        saved = [pathlib.Path(f) for f in tokenizer.model.save(tmp)]
        vocab_path = next((f for f in saved if f.name.endswith("vocab.json")), pathlib.Path(tmp) / "vocab.json")
        merges_path = next((f for f in saved if f.name.endswith("merges.txt")), pathlib.Path(tmp) / "merges.txt")
        vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
        merges_text = merges_path.read_text(encoding="utf-8")

    # GPT-2's file format, checked: every byte symbol is a token; each merge line is two tokens.
    missing = [b for b, c in byte_symbols().items() if c not in vocab]
    if missing:
        print(f"train_bpe.py: the trained vocabulary lacks the symbols of bytes {missing[:10]}", file=sys.stderr)
        return 1
    merge_lines = [line for line in merges_text.split("\n") if line and not line.startswith("#version")]
    bad = [line for line in merge_lines if len(line.split(" ")) != 2]
    if bad:
        print(f"train_bpe.py: merges that are not two tokens: {bad[:5]}", file=sys.stderr)
        return 1
    if END_OF_TEXT not in vocab:
        vocab[END_OF_TEXT] = max(vocab.values()) + 1
    ids = sorted(vocab.values())
    if len(set(ids)) != len(ids):
        print("train_bpe.py: the trained vocabulary gives one id to two tokens", file=sys.stderr)
        return 1

    ordered = dict(sorted(vocab.items(), key=lambda item: item[1]))
    (output / "vocab.json").write_text(json.dumps(ordered, ensure_ascii=False), encoding="utf-8")
    if not merges_text.startswith("#version"):
        merges_text = "#version: 0.2\n" + merges_text
    if not merges_text.endswith("\n"):
        merges_text += "\n"
    (output / "merges.txt").write_text(merges_text, encoding="utf-8")
    tokenizer.save(str(output / "tokenizer.json"))

    print(f"trained on {args.corpus}: {len(paragraphs)} paragraphs, {sum(len(t) for t in paragraphs)} characters")
    print(f"wrote {output}/vocab.json ({len(vocab)} tokens, ids 0..{max(ids)}, {END_OF_TEXT} = {vocab[END_OF_TEXT]}), "
          f"{output}/merges.txt ({len(merge_lines)} merges), {output}/tokenizer.json")
    print(f"tokenizers {getattr(tokenizers, '__version__', '?')}, Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
