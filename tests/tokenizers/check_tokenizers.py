#!/usr/bin/env python3
"""Proof that strata's HuggingFaceTokenizer and SentencePiece tokenizers give the ids of the Python
packages (tokenizers, sentencepiece) with Megatron's semantics, token for token.

Configurations (tokenizer files from train_tokenizers.py):

  hf_gpt2          HuggingFaceTokenizer      gpt2_bpe/      tokenizers: Tokenizer.from_file(...).encode(text).ids
  hf_llama3        HuggingFaceTokenizer      llama3_bpe/    (the post-processor's tokens included, as transformers'
                                                            AutoTokenizer(text).input_ids, Megatron's call)
  sp_llama2        Llama2Tokenizer           sp_bpe.model   [bos] + sp.encode(text)          (Megatron: bos=True)
  sp_megatron      SentencePieceTokenizer    sp_bpe.model   Megatron's special-token splitting, written out below
  sp_gpt_unigram   GPTSentencePieceTokenizer sp_unigram.model  sp.encode(text)

Texts: the paragraphs of the shipped corpus (as preprocess_data splits it), hand-written adversarial
cases (those of check_bpe.py plus special tokens inside text, Llama 3's pattern edges, long
whitespace runs, and invalid UTF-8), and seeded random fuzz texts. Every text goes to strata as bytes;
the Python packages get bytes.decode("utf-8", errors="replace"), the text Megatron would hold, which
strata reproduces for invalid input. Fuzz code points are limited to those whose class (letter,
number, whitespace, other) is the same in Unicode 3.2 and in this Python, so no difference between
Unicode versions can show.

Modes:
  --write-expected DIR   writes DIR/<configuration>.jsonl, the fixtures test_tokenizer_fixtures
                         compares strata with on CI (no Python there): a first line with the
                         tokenizer's type, file, vocab_size and eod; for each corpus paragraph its
                         token count and the FNV-1a 64 hash of its ids (each id as 4 little-endian
                         bytes); for each adversarial case its text (or its bytes in hex where they
                         are not UTF-8) and ids
  --binary PATH          runs strata's tokenizer_encode on all texts (fuzz included) and compares;
                         prints mismatches, then a table and the speed of both on the corpus
                         (tokens/s, one thread)

    python3 tests/tokenizers/check_tokenizers.py --models tests/tokenizers --binary /tmp/tokenizer_encode
"""

import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from check_bpe import ADVERSARIAL, FUZZ_PIECES, stable_class  # noqa: E402
from train_bpe import read_paragraphs  # noqa: E402

CONFIGS = {
    "hf_gpt2": ("HuggingFaceTokenizer", "gpt2_bpe"),
    "hf_llama3": ("HuggingFaceTokenizer", "llama3_bpe"),
    "sp_llama2": ("Llama2Tokenizer", "sp_bpe.model"),
    "sp_megatron": ("SentencePieceTokenizer", "sp_bpe.model"),
    "sp_gpt_unigram": ("GPTSentencePieceTokenizer", "sp_unigram.model"),
}

SPECIALS_IN_TEXT = [
    ("end of text", "before<|endoftext|>after <|endoftext|>"),
    ("Llama 3 specials", "<|begin_of_text|>Hello<|end_of_text|><|eot_id|> x<|reserved_special_token_0|>y"),
    ("nested special text", "<|<|endoftext|>|> <|end_of_text <|eot_id|>|>"),
    ("added normalized token", "a<sep>b <sep> <sep><sep>"),
    ("SentencePiece specials", "<s>In the beginning</s> <EOD>next<CLS>a<SEP>b<MASK><PAD> <unk> <EOD><EOD>"),
    ("SentencePiece specials at ends", "<EOD>"),
    ("bos eos pieces", "</s><s> x </s>"),
]
LLAMA3_EDGES = [
    ("contractions any case", "'S 'T 'RE 'Re 'rE 'VE 'M 'LL 'lL 'D 'd 's x's X'S don'T"),
    ("long s", "'\u017f '\u017ft it'\u017f"),
    ("digit groups", "1 12 123 1234 12345 123456 1234567 \u0663\u0664\u0665\u0666 \u00bd\u00bd\u00bd\u00bd"),
    ("punctuation then line breaks", "hello!!\n\nworld?\r\n\r\n...\n x"),
    ("whitespace then line breaks", "a  \n  \n  b \t\r\n\t c"),
    ("one character before letters", "(hello) [x] \tword _under $dollar \u00a0nbsp \u3000ideographic"),
    ("numbers after space", " 1 22 333 4444"),
    ("letters after digits", "abc123def 1st 2nd"),
]
WHITESPACE_RUNS = [
    ("2000 spaces", " " * 2000),
    ("spaces then word", " " * 777 + "word"),
    ("300 newlines", "\n" * 300),
    ("mixed whitespace runs", "\t \n" * 200 + "z" + " \u3000 " * 50),
    ("CRLF runs", "a" + "\r\n" * 100 + "b"),
]
INVALID_UTF8 = [
    ("stray bytes", b"ab\xffcd\xfe"),
    ("truncated 3-byte", b"x\xe2\x82"),
    ("truncated 3-byte then ASCII", b"\xe2\x82A"),
    ("truncated 4-byte", b"\xf0\x9f\x98 smile"),
    ("encoded surrogate", b"\xed\xa0\x80z"),
    ("overlong slash", b"\xc0\xaf"),
    ("lone continuations", b"\x80\x80x\xbf"),
    ("cut at the end", b"caf\xc3"),
    ("emoji and invalid", "hi \U0001f600".encode() + b"\xf0\x9f" + " there".encode()),
    ("invalid inside special", b"<|endo\xfftext|>"),
]


def adversarial_cases():
    cases = [(name, text.encode("utf-8")) for name, text in ADVERSARIAL + SPECIALS_IN_TEXT + LLAMA3_EDGES + WHITESPACE_RUNS]
    cases += INVALID_UTF8
    return cases


FUZZ_EXTRA = ["<|endoftext|>", "<|end_of_text|>", "<|begin_of_text|>", "<sep>", "<s>", "</s>", "<EOD>", "<CLS>", "<unk>",
              "\u017f", "'S", "'Re", "123", "4567", "\r\n\r\n", "  \n", "!!\n"]
INVALID_PIECES = [b"\xff", b"\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf", b"\xc3"]


def fuzz_cases(count, seed):
    rng = random.Random(seed)
    pieces = FUZZ_PIECES + FUZZ_EXTRA
    cases = []
    for i in range(count):
        parts = []
        for _ in range(rng.randint(0, 40)):
            r = rng.random()
            if r < 0.65:
                parts.append(rng.choice(pieces).encode("utf-8"))
            elif r < 0.70:
                parts.append(rng.choice(INVALID_PIECES))
            else:
                while True:
                    cp = rng.randint(0, 0x2FFFF) if r < 0.85 else rng.randint(0, 0x3000)
                    if 0xD800 <= cp < 0xE000:
                        continue
                    if stable_class(chr(cp)) is not None:
                        break
                parts.append(chr(cp).encode("utf-8"))
        cases.append((f"fuzz {i}", b"".join(parts)))
    return cases


def fnv1a64(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=False):
            h ^= b
            h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


# ------------------------------------------------------------------------------------------------
# References (Megatron's semantics over the Python packages)

class Reference:
    def __init__(self, config, models):
        kind, file = CONFIGS[config]
        self.kind, self.path = kind, models / file
        if kind == "HuggingFaceTokenizer":
            from tokenizers import Tokenizer
            self.hf = Tokenizer.from_file(str(self.path / "tokenizer.json"))
            self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
            config_file = self.path / "tokenizer_config.json"
            eos = json.loads(config_file.read_text())["eos_token"] if config_file.exists() else None
            if eos is None:
                specials = {t.content for t in self.hf.get_added_tokens_decoder().values() if t.special}
                eos = next(n for n in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>") if n in specials)
            self.eod = self.hf.token_to_id(eos)
            self.encode = lambda text: self.hf.encode(text).ids
        else:
            import sentencepiece as spm
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
            n = self.sp.get_piece_size()
            if kind == "Llama2Tokenizer":
                self.vocab_size, self.eod = n, self.sp.eos_id()
                bos = self.sp.bos_id()
                self.encode = lambda text: [bos] + self.sp.encode(text)
            elif kind == "GPTSentencePieceTokenizer":
                self.vocab_size, self.eod = n, self.sp.eos_id()
                self.encode = lambda text: self.sp.encode(text)
            else:
                self._megatron_specials()
                self.encode = self._megatron_encode

    def _megatron_specials(self):
        """Megatron's _SentencePieceTokenizer: the pieces, then <CLS> <SEP> <EOD> <MASK> and the pad, bos, eos pieces."""
        vocab = {self.sp.id_to_piece(i): i for i in range(self.sp.get_piece_size())}
        self.specials = {}

        def add(token):
            if token not in vocab:
                vocab[token] = len(vocab)
            self.specials[token] = vocab[token]

        for token in ("<CLS>", "<SEP>", "<EOD>", "<MASK>"):
            add(token)
        for get, fallback in ((self.sp.pad_id, "<PAD>"), (self.sp.bos_id, "<BOS>"), (self.sp.eos_id, "<EOS>")):
            try:
                add(self.sp.id_to_piece(get()))
            except IndexError:
                add(fallback)
        self.vocab_size, self.eod = len(vocab), self.specials["<EOD>"]

    def _megatron_encode(self, text):
        ids, start = [], 0
        while True:
            found = {t: text.find(t, start) for t in self.specials}
            found = {t: at for t, at in found.items() if at >= 0}
            if not found:
                break
            token = min(found, key=found.get)  # the earliest; at a tie the first added
            ids += self.sp.encode(text[start:found[token]])
            ids.append(self.specials[token])
            start = found[token] + len(token)
        return ids + self.sp.encode(text[start:])


# ------------------------------------------------------------------------------------------------

def run_strata(binary, config, models, cases, workdir):
    kind, file = CONFIGS[config]
    texts_path, ids_path = workdir / f"{config}.hex", workdir / f"{config}.ids"
    texts_path.write_text("".join(raw.hex() + "\n" for _, raw in cases))
    done = subprocess.run([str(binary), "--tokenizer-type", kind, "--tokenizer-model", str(models / file), str(texts_path),
                           str(ids_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tokenizer_encode ({config}) exited with {done.returncode}: {done.stderr.strip()}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    lines = ids_path.read_text().split("\n")[:-1]
    return [[int(x) for x in line.split()] for line in lines], summary


def corpus_cases(corpus):
    return [(f"corpus {k}", p.encode("utf-8")) for k, p in enumerate(read_paragraphs(corpus))]


def python_speed(ref, texts):
    start = time.perf_counter()
    tokens = sum(len(ref.encode(t)) for t in texts)
    return tokens, time.perf_counter() - start


def write_expected(args, models):
    out = pathlib.Path(args.write_expected)
    out.mkdir(parents=True, exist_ok=True)
    import sentencepiece
    import tokenizers
    corpus = corpus_cases(args.corpus)
    for config in args.configs:
        ref = Reference(config, models)
        kind, file = CONFIGS[config]
        lines = [json.dumps({"tokenizer_type": kind, "tokenizer_model": file, "vocab_size": ref.vocab_size, "eod": ref.eod,
                             "made_by": f"tokenizers {tokenizers.__version__}, sentencepiece {sentencepiece.__version__}"})]
        for k, (_, raw) in enumerate(corpus):
            ids = ref.encode(raw.decode("utf-8", errors="replace"))
            lines.append(json.dumps({"paragraph": k, "count": len(ids), "fnv1a64": f"{fnv1a64(ids):016x}"}))
        for name, raw in adversarial_cases():
            ids = ref.encode(raw.decode("utf-8", errors="replace"))
            try:  # the text itself where it is UTF-8 (smaller), its bytes in hex where not
                text = {"text": raw.decode("utf-8")}
            except UnicodeDecodeError:
                text = {"hex": raw.hex()}
            lines.append(json.dumps({"case": name, **text, "ids": ids}, separators=(",", ":")))
        path = out / f"{config}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path}: {len(corpus)} paragraphs, {len(adversarial_cases())} cases, vocab {ref.vocab_size}, eod {ref.eod}")


def check(args, models):
    corpus = corpus_cases(args.corpus)
    groups = [("corpus", corpus), ("adversarial", adversarial_cases()), ("fuzz", fuzz_cases(args.fuzz, args.seed))]
    all_cases = [c for _, cs in groups for c in cs]
    failures = 0
    rows, speed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        for config in args.configs:
            ref = Reference(config, models)
            ids, summary = run_strata(args.binary, config, models, all_cases, workdir)
            if summary["vocab_size"] != ref.vocab_size or summary["eod"] != ref.eod:
                print(f"{config}: vocab_size/eod strata {summary['vocab_size']}/{summary['eod']}, Python {ref.vocab_size}/{ref.eod}")
                failures += 1
            k = 0
            for group, cases in groups:
                bad = 0
                tokens = 0
                for name, raw in cases:
                    expected = ref.encode(raw.decode("utf-8", errors="replace"))
                    tokens += len(expected)
                    if ids[k] != expected:
                        bad += 1
                        if bad <= args.show:
                            at = next((i for i, (a, b) in enumerate(zip(ids[k], expected)) if a != b), min(len(ids[k]), len(expected)))
                            print(f"MISMATCH {config} {name}: text {raw[:80]!r}\n  strata {ids[k][max(0, at - 3):at + 5]}\n"
                                  f"  python {expected[max(0, at - 3):at + 5]} (first difference at id {at})")
                    k += 1
                rows.append((config, group, len(cases), tokens, bad))
                failures += bad
            # Speed on the corpus, one thread each: strata's pass over the corpus alone.
            _, corpus_summary = run_strata(args.binary, config, models, corpus, workdir)
            texts = [raw.decode("utf-8") for _, raw in corpus]
            py_tokens, py_seconds = python_speed(ref, texts)
            speed.append((config, corpus_summary["tokens"], corpus_summary["seconds"], corpus_summary["seconds_warm"], py_tokens, py_seconds))
    print(f"\n{'configuration':<16} {'texts':<12} {'cases':>6} {'tokens':>8} {'mismatches':>10}")
    for config, group, n, tokens, bad in rows:
        print(f"{config:<16} {group:<12} {n:>6} {tokens:>8} {bad:>10}")
    print(f"\nspeed on the corpus ({len(corpus)} paragraphs, {sum(len(r) for _, r in corpus)} bytes), one thread, tokens/s:")
    print(f"{'configuration':<16} {'strata (cold)':>14} {'strata (warm)':>14} {'python':>12} {'ratio cold':>10}")
    for config, tokens, cold, warm, py_tokens, py_seconds in speed:
        print(f"{config:<16} {tokens / cold:>14,.0f} {tokens / warm:>14,.0f} {py_tokens / py_seconds:>12,.0f} "
              f"{(tokens / cold) / (py_tokens / py_seconds):>10.2f}")
    import sentencepiece
    import tokenizers
    print(f"\ntokenizers {tokenizers.__version__}, sentencepiece {sentencepiece.__version__} (Python), Python {sys.version.split()[0]}")
    print("ALL IDS MATCH" if failures == 0 else f"{failures} MISMATCHES")
    return 0 if failures == 0 else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=str(HERE), help="directory with the trained files (default: %(default)s)")
    p.add_argument("--corpus", default=str(HERE.parent.parent / "examples" / "data" / "kjv_pentateuch.txt"))
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--write-expected", help="write the CI fixtures into this directory")
    p.add_argument("--binary", help="strata's tokenizer_encode, to compare with")
    p.add_argument("--fuzz", type=int, default=2000, help="random texts (default: %(default)s)")
    p.add_argument("--seed", type=int, default=20261123)
    p.add_argument("--show", type=int, default=5, help="mismatches shown per configuration and group")
    args = p.parse_args()
    models = pathlib.Path(args.models)
    if args.write_expected:
        write_expected(args, models)
    if args.binary:
        return check(args, models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
