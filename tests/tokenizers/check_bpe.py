#!/usr/bin/env python3
"""Proof that strata's BpeTokenizer gives the ids of Hugging Face tokenizers, token for token.

Encodes three sets of texts with strata (the bpe_encode program) and with each reference, and
compares the ids exactly:

  corpus        the paragraphs of the shipped corpus (examples/data/kjv_pentateuch.txt), as
                preprocess_data splits it
  adversarial   hand-written cases: contractions in both cases, numbers with separators, digit
                strings, punctuation runs, runs of spaces, tabs, "\\r\\n", Unicode spaces, emoji with
                modifiers and zero-width joiners, CJK, combining marks, right-to-left text,
                Indic and Thai (marks inside words), control characters, long words
  fuzz          random texts from those pieces and from random code points (seeded); only code
                points whose class (letter, number, whitespace, other) is the same in Unicode 3.2
                and in this Python, so that no difference between Unicode versions can show up

References: the tokenizers package (BPE.from_file on the same vocab.json and merges.txt, the
ByteLevel pre-tokenizer without a prefix space: the pipeline GPT2TokenizerFast builds); when
installed, transformers' GPT2TokenizerFast and GPT2Tokenizer loaded from the same files; and,
when the regex package is installed, GPT-2's own algorithm (encoder.py: the pattern through
`regex`, then "merge every occurrence of the best pair" until none is left), which Megatron's
GPT2BPETokenizer runs. Cases holding the text "<|endoftext|>" are not given to transformers,
which reads it as its special token (strata and tokenizers' bare model read it as text).

Prints a table of cases, tokens and mismatches per reference, the speed of each encoder on the
corpus (tokens/s), and the versions (Python and its Unicode, the Unicode of strata's tables,
tokenizers, transformers, regex). Exits 1 on any mismatch with tokenizers, or with another
reference on a case where that reference agrees with tokenizers (where the references disagree
among themselves, the case is listed and strata is held to tokenizers); 2 when tokenizers is
missing (unless --skip-tokenizers) or bpe_encode fails.

    g++ -std=c++20 -O2 -Iinclude tests/tokenizers/bpe_encode.cpp -o /tmp/bpe_encode
    python3 tests/tokenizers/train_bpe.py --output /tmp/bpe
    python3 tests/tokenizers/check_bpe.py --binary /tmp/bpe_encode --vocab /tmp/bpe/vocab.json --merges /tmp/bpe/merges.txt
"""

import argparse
import json
import os
import pathlib
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"


# ------------------------------------------------------------------------------------------------
# Texts

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


ADVERSARIAL = [
    ("contractions", "I'm sure you're right, we'll see; they've gone, she'd know, it's John's. Don't, can't, won't."),
    ("contractions in caps", "I'M SURE YOU'RE RIGHT, WE'LL SEE; THEY'VE GONE, SHE'D KNOW, IT'S JOHN'S. 'S 'LL 'T 'RE 'VE 'M 'D"),
    ("contraction edges", "'s 's' ''s '''ll rock'n'roll 'tis ' s' x'd 'dd 'mm 'llama 'revolution ?!'s 'S's"),
    ("curly apostrophes", "don\u2019t it\u2019s \u2018quoted\u2019 \u201cdouble\u201d"),
    ("numbers", "1 12 123 1234 12345 3.14159 1,000,000 1.000.000,00 1_000 10^9 2nd 3rd -5 +6 0x1F 1e-9 $9.99 50% #1"),
    ("digit strings", "0123456789" * 20 + " " + "9" * 300),
    ("numbers of other scripts", "\u0660\u0661\u0662\u0663 \u09e6\u09e7\u09e8 \uff11\uff12\uff13 \u00bd \u00be \u00b2 \u00b3 \u216b \u217b \u3007 \u2460\u2461"),
    ("punctuation runs", "Hello!!! What?!?! ... --- *** ((nested)) [x] {y} <z> @#$%^&*_+=~`|\\/ \"quoted\" 'single'"),
    ("multiple spaces", "a  b   c    d     e      f"),
    ("trailing spaces", "end   "),
    ("leading spaces", "   start"),
    ("long run of spaces", " " * 1000 + "x"),
    ("long mixed whitespace", " \t\n" * 300 + "y"),
    ("only spaces", " " * 37),
    ("tabs", "\tindented\n\t\tmore\tcolumns\t\t\n\t"),
    ("CRLF line ends", "line one\r\nline two\r\n\r\nline four\r\n"),
    ("newlines", "a\n\nb\n\n\nc\n \n d\n"),
    ("Unicode spaces", "a\u00a0b\u2009c\u3000d\u2028e\u2029f\u0085g\u200bh\u202fi\u205fj\u1680k\u2000l\u200am  \u00a0n"),
    ("separator and other controls", "a\x1cb\x1dc\x1ed\x1fe\x0bf\x0cg\x00h\x01i\x7fj\x1b[31mred\x1b[0m"),
    ("emoji", "hi \U0001f44b\U0001f3fd there \U0001f600\U0001f603\U0001f604 \U0001f389 \U0001f1fa\U0001f1f8 \u2764\ufe0f \U0001f44d\U0001f3ff!"),
    ("zero-width joiners", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f469\u200d\U0001f4bb \u200d alone a\u200db \u200c\u200d"),
    ("CJK", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u4e2d\u6587\u6587\u672c\uff0c\u4f60\u597d\u4e16\u754c\uff01\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8"),
    ("CJK long", "\u5929\u5730\u7384\u9ec4\u5b87\u5b99\u6d2a\u8352" * 40),
    ("combining marks", "cafe\u0301 nai\u0308ve Z\u0351\u0334\u0315a\u0352l\u0337g\u0330o\u0324 e\u0301\u0301\u0301 a\u20dd"),
    ("precomposed letters", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m Stra\u00dfe \u01c5 \u02b0 \u1d43"),
    ("right to left", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u200fRLM\u200e LRM \u202bembedded\u202c"),
    ("Indic", "\u0939\u093f\u0928\u094d\u0926\u0940 \u0928\u092e\u0938\u094d\u0924\u0947 \u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u09ac\u09be\u0982\u09b2\u09be"),
    ("Thai", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35"),
    ("Greek and Cyrillic", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442"),
    ("math", "\u2200x\u2208\u211d: x\u00b2 \u2265 0, \u2211\u1d62 a\u1d62 \u2248 \u03c0 \u2260 \u221e"),
    ("code", "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n"),
    ("URL and JSON", "https://example.com/a/b?q=1&r=two#frag {\"key\": \"value\", \"n\": [1, 2, 3]}"),
    ("mixed words and numbers", "ABC123def456 GHI-789_jkl 12:30pm 2024-01-02T03:04:05Z v1.2.3-rc4"),
    ("end-of-text as text", "before" + END_OF_TEXT + "after " + END_OF_TEXT),
    ("empty", ""),
    ("one space", " "),
    ("one newline", "\n"),
    ("byte order mark", "\ufeffBOM at the start"),
    ("private use and noncharacters", "\ue000\uf8ff\ufffd\U0010fffd\U000f0000"),
    ("long word", "a" * 3000),
    ("long letters", "abcdefghij" * 300),
    ("long punctuation", "!" * 500 + "?" * 500 + "." * 10),
]

FUZZ_PIECES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n",
               "the", " the", "LORD", " God", "and", "a", "x", "1", "42", "2024", ",", ".", "!", "?", "...", "-", "(", ")", "\"",
               "\u00a0", "\u3000", "\u2009", "\u0085", "\u2028", "\u200b", "\u200d", "\u200f", "\x1c", "\x00", "\x7f", "\ufeff",
               "\u00e9", "\u0301", "\u0308", "\u65e5", "\u672c", "\u3002", "\uff0c", "\u05e9", "\u0627", "\u0939", "\u093f",
               "\u0e20", "\u0e31", "\u0663", "\u00bd", "\u216b", "\u00b2", "\U0001f600", "\U0001f3fd", "\U0001f44b", "\u2764",
               "\ufe0f", "\u01c5", "\u02b0", "\U00020000", "\U0001d400"]


def stable_class(c):
    """The character's class in GPT-2's pattern if it is the same in Unicode 3.2 and in this Python, else None."""
    def klass(category, code_point):
        if code_point in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85) or category in ("Zs", "Zl", "Zp"):
            return "whitespace"
        if category[0] == "L":
            return "letter"
        if category[0] == "N":
            return "number"
        return "other"
    cp = ord(c)
    now = unicodedata.category(c)
    then = unicodedata.ucd_3_2_0.category(c)
    if now == "Cn" or then == "Cn" or now == "Cs":
        return None
    a, b = klass(now, cp), klass(then, cp)
    return a if a == b else None


def fuzz_texts(count, seed):
    rng = random.Random(seed)
    texts = []
    for i in range(count):
        parts = []
        for _ in range(rng.randint(0, 30)):
            r = rng.random()
            if r < 0.7:
                parts.append(rng.choice(FUZZ_PIECES))
            else:
                while True:
                    cp = rng.randint(0, 0x2FFFF) if r < 0.85 else rng.randint(0, 0x3000)
                    if 0xD800 <= cp < 0xE000:
                        continue
                    if stable_class(chr(cp)) is not None:
                        break
                parts.append(chr(cp))
        texts.append((f"fuzz {i}", "".join(parts)))
    return texts


# ------------------------------------------------------------------------------------------------
# strata's side

def run_bpe_encode(binary, vocab, merges, texts, workdir, stem):
    texts_path = workdir / f"{stem}.jsonl"
    ids_path = workdir / f"{stem}.ids"
    with open(texts_path, "w", encoding="ascii") as f:
        for text in texts:
            f.write(json.dumps(text, ensure_ascii=True) + "\n")
    done = subprocess.run([str(binary), str(vocab), str(merges), str(texts_path), str(ids_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bpe_encode exited with {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    with open(ids_path, "r", encoding="ascii") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(texts):
        raise RuntimeError(f"bpe_encode wrote {len(lines)} lines of ids for {len(texts)} texts")
    ids = [[int(x) for x in line.split()] for line in lines]
    return ids, summary


# ------------------------------------------------------------------------------------------------
# References

class Reference:
    def __init__(self, name, encode_one, encode_many=None, skip=None, note=""):
        self.name = name
        self.encode_one = encode_one
        self.encode_many = encode_many
        self.skip = skip or (lambda text: False)
        self.note = note

    def encode(self, texts):
        return [None if self.skip(t) else list(self.encode_one(t)) for t in texts]


def bytes_to_symbols():
    own = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in own:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def load_vocab_and_merges(vocab_path, merges_path):
    vocab = json.loads(pathlib.Path(vocab_path).read_text(encoding="utf-8"))
    ranks = {}
    for line in pathlib.Path(merges_path).read_text(encoding="utf-8").split("\n"):
        line = line.rstrip("\r")
        if not line or line.startswith("#version"):
            continue
        a, b = line.split(" ")
        ranks.setdefault((a, b), len(ranks))
    return vocab, ranks


def gpt2_reference(vocab_path, merges_path):
    """GPT-2's encoder.py algorithm, written out: the pattern through `regex`, then the merge loop."""
    import regex
    pattern = regex.compile(GPT2_PATTERN)
    vocab, ranks = load_vocab_and_merges(vocab_path, merges_path)
    symbols = bytes_to_symbols()
    cache = {}

    def bpe(token):
        if token in cache:
            return cache[token]
        word = list(token)
        while len(word) > 1:
            best = min(((ranks[p], p) for p in zip(word, word[1:]) if p in ranks), default=None)
            if best is None:
                break
            first, second = best[1]
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        cache[token] = word
        return word

    def encode(text):
        ids = []
        for piece in pattern.findall(text):
            token = "".join(symbols[b] for b in piece.encode("utf-8"))
            ids.extend(vocab[t] for t in bpe(token))
        return ids

    version = getattr(regex, "__version__", "?")
    return Reference("gpt2 encoder.py", encode, note=f"regex {version}"), version


def tokenizers_reference(vocab_path, merges_path):
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    if hasattr(models.BPE, "from_file"):
        model = models.BPE.from_file(str(vocab_path), str(merges_path))
    else:
        model = models.BPE(str(vocab_path), str(merges_path))
    tokenizer = Tokenizer(model)
    try:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    except TypeError:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()

    def encode_many(texts):
        return [e.ids for e in tokenizer.encode_batch(texts)]

    reference = Reference("tokenizers", lambda t: tokenizer.encode(t).ids, encode_many)
    reference.token_to_id = tokenizer.token_to_id
    return reference, getattr(tokenizers, "__version__", "?")


def transformers_references(vocab_path, merges_path, workdir):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: never wait on the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers
    try:
        transformers.logging.set_verbosity_error()
    except Exception:
        pass
    directory = workdir / "gpt2-files"
    directory.mkdir(exist_ok=True)
    shutil.copy(vocab_path, directory / "vocab.json")
    shutil.copy(merges_path, directory / "merges.txt")
    references, problems = [], []
    for class_name in ("GPT2TokenizerFast", "GPT2Tokenizer"):
        cls = getattr(transformers, class_name, None)
        if cls is None:
            problems.append(f"{class_name}: not in this transformers")
            continue
        tokenizer, errors = None, []
        attempts = [
            lambda: cls.from_pretrained(str(directory), add_prefix_space=False, local_files_only=True),
            lambda: cls(vocab_file=str(directory / "vocab.json"), merges_file=str(directory / "merges.txt"), add_prefix_space=False),
        ]
        for attempt in attempts:
            try:
                tokenizer = attempt()
                break
            except Exception as e:  # noqa: BLE001 -- any failure to build one is reported, not fatal
                errors.append(f"{type(e).__name__}: {e}")
        if tokenizer is None:
            problems.append(f"{class_name}: could not be built ({'; '.join(errors)[:300]})")
            continue

        def encode(text, tokenizer=tokenizer):
            return tokenizer.encode(text, add_special_tokens=False)

        actual = type(tokenizer).__name__
        references.append(Reference(class_name, encode, skip=lambda t: END_OF_TEXT in t,
                                    note="" if actual == class_name else f"built as {actual}"))
    return references, problems, getattr(transformers, "__version__", "?")


# ------------------------------------------------------------------------------------------------
# Comparison and report

def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def describe_mismatch(name, text, ours, theirs, id_to_token, reference_name):
    i = first_difference(ours, theirs)
    lo = max(0, i - 3)

    def spell(ids):
        return " ".join(f"{t}:{id_to_token.get(t, '?')!r}" for t in ids)
    shown = text if len(text) <= 160 else text[:160] + f"... ({len(text)} characters)"
    unusual = sorted({c for c in text if ord(c) > 0x7E or ord(c) < 0x20})
    chars = ", ".join(f"U+{ord(c):04X} {unicodedata.category(c)}" for c in unusual[:12])
    lines = [f"  [{reference_name}] {name}: {shown!r}",
             f"    first difference at token {i} (strata {len(ours)} tokens, {reference_name} {len(theirs)})",
             f"    strata: {spell(ours[lo:i + 6])}",
             f"    {reference_name}: {spell(theirs[lo:i + 6])}"]
    if chars:
        lines.append(f"    characters outside printable ASCII (this Python's categories): {chars}")
    return "\n".join(lines)


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def parse_args():
    here = pathlib.Path(__file__).resolve().parent
    root = here.parent.parent
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", default="/tmp/bpe_encode", help="the bpe_encode program (default: %(default)s)")
    p.add_argument("--vocab", required=True, help="vocab.json (GPT-2's format)")
    p.add_argument("--merges", required=True, help="merges.txt (GPT-2's format)")
    p.add_argument("--corpus", default=str(root / "examples" / "data" / "kjv_pentateuch.txt"), help="plain-text corpus (default: %(default)s)")
    p.add_argument("--fuzz", type=int, default=3000, help="random texts (default: %(default)s)")
    p.add_argument("--seed", type=int, default=2024, help="seed of the random texts (default: %(default)s)")
    p.add_argument("--show", type=int, default=5, help="mismatches to print per reference and set (default: %(default)s)")
    p.add_argument("--skip-tokenizers", action="store_true",
                   help="run without the tokenizers package, against the other references only (a dry run of this script; the proof needs tokenizers)")
    p.add_argument("--keep", metavar="DIR", help="write the texts and ids under DIR and keep them (default: a temporary directory)")
    return p.parse_args()


def main():
    args = parse_args()
    binary = pathlib.Path(args.binary)
    if not binary.exists():
        print(f"check_bpe.py: no bpe_encode at {binary}; build it with\n"
              f"  g++ -std=c++20 -O2 -Iinclude tests/tokenizers/bpe_encode.cpp -o {binary}", file=sys.stderr)
        return 2
    for path in (args.vocab, args.merges, args.corpus):
        if not pathlib.Path(path).exists():
            print(f"check_bpe.py: no file {path}", file=sys.stderr)
            return 2

    sets = {
        "corpus": [(f"paragraph {i}", t) for i, t in enumerate(read_paragraphs(args.corpus))],
        "adversarial": ADVERSARIAL + [("corpus paragraph with CRLF", read_paragraphs(args.corpus)[0].replace("\n", "\r\n"))],
        "fuzz": fuzz_texts(args.fuzz, args.seed),
    }

    versions = {"Python": platform.python_version(), "Python unicodedata": unicodedata.unidata_version}
    references, notes = [], []
    primary = None
    if args.skip_tokenizers:
        notes.append("tokenizers: skipped (--skip-tokenizers): this run proves nothing about tokenizers")
    else:
        try:
            primary, versions["tokenizers"] = tokenizers_reference(args.vocab, args.merges)
            references.append(primary)
        except ImportError as e:
            print(f"check_bpe.py: the tokenizers package is needed ({e}); pip install tokenizers "
                  f"(or --skip-tokenizers for a dry run)", file=sys.stderr)
            return 2

    temporary = None
    if args.keep:
        workdir = pathlib.Path(args.keep)
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        temporary = tempfile.TemporaryDirectory(prefix="check_bpe_")
        workdir = pathlib.Path(temporary.name)

    try:
        try:
            found, problems, versions["transformers"] = transformers_references(args.vocab, args.merges, workdir)
            references.extend(found)
            notes.extend(problems)
        except ImportError:
            notes.append("transformers: not installed, GPT2TokenizerFast and GPT2Tokenizer not compared")
        except Exception as e:  # noqa: BLE001 -- a broken transformers install is reported, not fatal
            notes.append(f"transformers: could not be used ({type(e).__name__}: {e}), GPT2TokenizerFast and GPT2Tokenizer not compared")
        try:
            reference, versions["regex"] = gpt2_reference(args.vocab, args.merges)
            references.append(reference)
        except ImportError:
            notes.append("regex: not installed, GPT-2's encoder.py algorithm not compared")
        if not references:
            print("check_bpe.py: no reference to compare with", file=sys.stderr)
            return 2

        vocab, _ = load_vocab_and_merges(args.vocab, args.merges)
        id_to_token = {i: t for t, i in vocab.items()}

        # strata
        ours, summaries = {}, {}
        for set_name, cases in sets.items():
            try:
                ours[set_name], summaries[set_name] = run_bpe_encode(binary, args.vocab, args.merges, [t for _, t in cases], workdir, set_name)
            except (RuntimeError, OSError, ValueError) as e:
                print(f"check_bpe.py: {e}", file=sys.stderr)
                return 2
        versions["strata Unicode tables"] = summaries["corpus"]["unicode"]
        round_trip_failures = sum(s["round_trip_failures"] for s in summaries.values())

        # references, compared
        failures = 0
        details = []
        rows = []
        speed = []
        corpus_texts = [t for _, t in sets["corpus"]]
        corpus_bytes = sum(len(t.encode("utf-8")) for t in corpus_texts)
        corpus_tokens = summaries["corpus"]["tokens"]
        speed.append(("strata BpeTokenizer (1 thread, empty cache)", summaries["corpus"]["seconds"]))
        speed.append(("strata BpeTokenizer (1 thread, warm cache)", summaries["corpus"]["seconds_warm"]))
        primary_ids = {}
        for reference in references:
            for set_name, cases in sets.items():
                texts = [t for _, t in cases]
                try:
                    theirs, seconds = timed(reference.encode, texts)
                except Exception as e:  # noqa: BLE001 -- a reference that breaks is a failure of the check, reported
                    details.append(f"  [{reference.name}] failed on the {set_name} set: {type(e).__name__}: {e}")
                    rows.append((set_name, reference.name, len(cases), 0, 0, "error", ""))
                    failures += 1
                    continue
                if set_name == "corpus":
                    speed.append((f"{reference.name} encode (1 thread)", seconds))
                    if reference.encode_many is not None:
                        _, many = timed(reference.encode_many, texts)
                        speed.append((f"{reference.name} encode_batch ({os.cpu_count()} threads)", many))
                if reference is primary:
                    primary_ids[set_name] = theirs
                compared = mismatched = tokens = disagreements = 0
                shown = 0
                for k, ((name, text), mine, their) in enumerate(zip(cases, ours[set_name], theirs)):
                    if their is None:
                        continue
                    compared += 1
                    tokens += len(their)
                    if mine == their:
                        continue
                    # A reference that disagrees with tokenizers on this case: strata is held to tokenizers.
                    if reference is not primary and primary is not None and primary_ids.get(set_name) is not None \
                            and primary_ids[set_name][k] != their:
                        disagreements += 1
                        if shown < args.show:
                            details.append(describe_mismatch(name, text, mine, their, id_to_token, reference.name)
                                           + f"\n    (tokenizers gives {'the same as strata' if primary_ids[set_name][k] == mine else 'a third answer'})")
                            shown += 1
                        continue
                    mismatched += 1
                    if shown < args.show:
                        details.append(describe_mismatch(name, text, mine, their, id_to_token, reference.name))
                        shown += 1
                failures += mismatched
                skipped = len(cases) - compared
                rows.append((set_name, reference.name, compared, tokens, mismatched, disagreements, f"{skipped} skipped" if skipped else ""))

        # report
        print("strata BpeTokenizer against the references: ids compared exactly")
        print(f"vocabulary: {args.vocab} ({summaries['corpus']['vocab_size']} ids, {summaries['corpus']['merges']} merges, "
              f"<|endoftext|> = {summaries['corpus']['eod']})")
        if primary is not None and getattr(primary, "token_to_id", None):
            eod = primary.token_to_id(END_OF_TEXT)
            if eod != summaries["corpus"]["eod"]:
                details.append(f"  [tokenizers] <|endoftext|> is {eod}, strata says {summaries['corpus']['eod']}")
                failures += 1
        print()
        header = f"{'set':<12} {'reference':<20} {'cases':>6} {'tokens':>9} {'mismatches':>10} {'refs disagree':>13}  note"
        print(header)
        print("-" * len(header))
        for set_name, name, compared, tokens, mismatched, disagreements, note in rows:
            print(f"{set_name:<12} {name:<20} {compared:>6} {tokens:>9} {mismatched!s:>10} {disagreements!s:>13}  {note}")
        for set_name, summary in summaries.items():
            print(f"{set_name:<12} {'strata':<20} {summary['texts']:>6} {summary['tokens']:>9}"
                  f"{'':>10} {'':>13}  decode(encode(text)) != text: {summary['round_trip_failures']}")
        print()
        print(f"speed on the corpus ({len(corpus_texts)} paragraphs, {corpus_bytes / 1e6:.2f} MB, {corpus_tokens} tokens):")
        for name, seconds in speed:
            rate = corpus_tokens / seconds if seconds > 0 else float("inf")
            print(f"  {name:<48} {seconds:9.4f} s  {rate:12,.0f} tokens/s  {corpus_bytes / 1e6 / max(seconds, 1e-12):8.2f} MB/s")
        print()
        print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        for reference in references:
            if reference.note:
                print(f"  {reference.name}: {reference.note}")
        for note in notes:
            print(f"  {note}")
        if versions.get("strata Unicode tables") != unicodedata.unidata_version:
            print(f"  note: strata's tables are Unicode {versions.get('strata Unicode tables')}, this Python's {unicodedata.unidata_version}; "
                  "the fuzz texts use only characters whose class is the same in Unicode 3.2 and here")
        if details:
            print()
            print("mismatches and disagreements (first ones):")
            print("\n".join(details))
        failures += round_trip_failures
        print()
        if failures:
            print(f"FAILED: {failures} mismatches" + (f" ({round_trip_failures} round trips)" if round_trip_failures else ""))
            return 1
        checked = "tokenizers" if primary is not None else "the references present (tokenizers skipped)"
        print(f"OK: strata's ids equal {checked} on every case")
        return 0
    finally:
        if temporary is not None:
            temporary.cleanup()


if __name__ == "__main__":
    sys.exit(main())
