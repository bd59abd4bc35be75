#!/usr/bin/env python3
"""The bytes Megatron-LM's tools/preprocess_data.py writes, without Megatron, torch or numpy.

Written from the behaviour of Megatron's preprocess_data.py (Encoder.encode, main's partitions) and
megatron/core/datasets/indexed_dataset.py (IndexedDatasetBuilder.add_document / add_index /
finalize, _IndexWriter), with strata's byte tokenizer in place of Megatron's (token = byte of the
UTF-8 text, end of document 256, vocabulary 257, so uint16 by DType.optimal_dtype). What it does,
step by step, as Megatron does it:

  - each line of the input is json.loads'ed; for each --json-keys key the value is a string (one
    sentence) or a list of strings (sentences); a sentence's ids are kept only when there are
    some; with --append-eod, a document with ids gets the end-of-document id on its last sentence;
  - the builder writes the ids to .bin, extends the sequence lengths by the sentence lengths and
    appends len(sequence_lengths) to the document indices (starting from [0]);
  - .idx: b"MMIDIDX\\x00\\x00", <Q 1, <B dtype code, <Q sequence count, <Q len(document indices),
    int32 lengths, int64 byte pointers (running sum of length * itemsize), int64 document indices;
  - --partitions N: --input is a glob; its lines go round robin (or in runs of
    ceil(lines / N) with --keep-sequential-samples) into <stem>_<i><ext>, each is processed into
    <output-prefix>_<i>_<key>_document, and add_index merges them in order: lengths appended,
    document indices offset by the sequences before and appended without their leading 0, .bin
    copied.

--split-sentences is not here (it needs NLTK's punkt, which strata does not reproduce).

  megatron_preprocess_reference.py --input in.jsonl --output-prefix out [--json-keys k ...]
      [--append-eod] [--partitions N] [--keep-sequential-samples]
  megatron_preprocess_reference.py --make-fixture out.jsonl   (a small corpus for check_megatron_bytes.sh)
"""
import argparse
import glob
import gzip
import json
import math
import os
import random
import struct

EOD = 256
VOCAB_SIZE = 257
UINT16_CODE, INT32_CODE = 8, 4


def optimal_dtype(cardinality):
    """DType.optimal_dtype: (struct format, itemsize, code)."""
    return ("H", 2, UINT16_CODE) if cardinality is not None and cardinality < 65500 else ("i", 4, INT32_CODE)


def tokenize(text):
    return list(text.encode("utf-8"))


class Builder:
    """IndexedDatasetBuilder with its _IndexWriter."""

    def __init__(self, bin_path):
        self.data_file = open(bin_path, "wb")
        self.fmt, self.itemsize, self.code = optimal_dtype(VOCAB_SIZE)
        self.sequence_lengths = []
        self.document_indices = [0]

    def add_document(self, ids, lengths):
        self.data_file.write(struct.pack("<%d%s" % (len(ids), self.fmt), *ids))
        self.sequence_lengths.extend(lengths)
        self.document_indices.append(len(self.sequence_lengths))

    def add_index(self, path_prefix):
        lengths, documents, code = read_index(path_prefix + ".idx")
        assert code == self.code
        offset = len(self.sequence_lengths)
        self.sequence_lengths.extend(lengths)
        self.document_indices.extend(offset + d for d in documents[1:])
        with open(path_prefix + ".bin", "rb") as f:
            self.data_file.write(f.read())

    def finalize(self, idx_path):
        self.data_file.close()
        with open(idx_path, "wb") as f:
            f.write(b"MMIDIDX\x00\x00")
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", self.code))
            f.write(struct.pack("<Q", len(self.sequence_lengths)))
            f.write(struct.pack("<Q", len(self.document_indices)))
            f.write(struct.pack("<%di" % len(self.sequence_lengths), *self.sequence_lengths))
            pointers, current = [], 0
            for length in self.sequence_lengths:
                pointers.append(current)
                current += length * self.itemsize
            f.write(struct.pack("<%dq" % len(pointers), *pointers))
            f.write(struct.pack("<%dq" % len(self.document_indices), *self.document_indices))


def read_index(idx_path):
    with open(idx_path, "rb") as f:
        data = f.read()
    assert data[:9] == b"MMIDIDX\x00\x00"
    code = data[17]
    sequences, documents = struct.unpack_from("<QQ", data, 18)
    lengths = list(struct.unpack_from("<%di" % sequences, data, 34))
    document_indices = list(struct.unpack_from("<%dq" % documents, data, 34 + 12 * sequences))
    return lengths, document_indices, code


def encode(line, keys, append_eod):
    """Encoder.encode."""
    data = json.loads(line)
    ids, lens = {}, {}
    for key in keys:
        text = data[key]
        sentences = text if isinstance(text, list) else [text]
        doc_ids, sentence_lens = [], []
        for sentence in sentences:
            sentence_ids = tokenize(sentence)
            if len(sentence_ids) > 0:
                doc_ids.extend(sentence_ids)
                sentence_lens.append(len(sentence_ids))
        if len(doc_ids) > 0 and append_eod:
            doc_ids.append(EOD)
            sentence_lens[-1] += 1
        ids[key], lens[key] = doc_ids, sentence_lens
    return ids, lens


def process_json_file(input_file, output_prefix, keys, append_eod):
    builders = {key: Builder("%s_%s_document.bin" % (output_prefix, key)) for key in keys}
    with open(input_file, "r", encoding="utf-8") as fin:
        for line in fin:
            ids, lens = encode(line, keys, append_eod)
            for key in ids:
                builders[key].add_document(ids[key], lens[key])
    for key in keys:
        builders[key].finalize("%s_%s_document.idx" % (output_prefix, key))


def main_partitions(args):
    stem, extension = os.path.splitext(args.input)
    names = [(stem + "_" + str(i) + extension, args.output_prefix + "_" + str(i)) for i in range(args.partitions)]
    inputs = glob.glob(args.input)
    if args.keep_sequential_samples:
        total = 0
        for name in inputs:
            opener = gzip.open(name, "rt") if name.endswith(".gz") else open(name, "r", encoding="utf-8")
            with opener as fin:
                total += sum(1 for _ in fin)
        partition_size = math.ceil(total / args.partitions)
    outs = [open(name, "w") for name, _ in names]
    index, line_count = 0, 0
    for name in inputs:
        fin = gzip.open(name, "rt") if name.endswith(".gz") else open(name, "r", encoding="utf-8")
        for line in fin:
            outs[index].write(line)
            if args.keep_sequential_samples:
                line_count += 1
                if line_count % partition_size == 0:
                    index += 1
            else:
                index = (index + 1) % args.partitions
        fin.close()
    for out in outs:
        out.close()
    for partition_input, partition_prefix in names:
        process_json_file(partition_input, partition_prefix, args.json_keys, args.append_eod)
    for key in args.json_keys:
        builder = Builder("%s_%s_document.bin" % (args.output_prefix, key))
        for _, partition_prefix in names:
            builder.add_index("%s_%s_document" % (partition_prefix, key))
        builder.finalize("%s_%s_document.idx" % (args.output_prefix, key))


def make_fixture(path):
    """JSON lines with empty texts, escapes, UTF-8, newlines, and lists of sentences (no blank line:
    Megatron's json.loads stops on one)."""
    rng = random.Random(2026)
    words = ["In", "the", "beginning", "God", "created.", "\u00e9t\u00e9", "\u2014", "\u4e2d\u6587", "\U0001F40D", "tab\t",
             "quote\"", "back\\slash", "\n", "line\r\nbreak"]
    with open(path, "w", encoding="utf-8") as out:
        for i in range(600):
            def text():
                if rng.random() < 0.15:
                    return ""
                return " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
            record = {"id": i, "text": text(), "title": text()}
            if rng.random() < 0.2:
                record["text"] = [text() for _ in range(rng.randint(0, 4))]
            out.write(json.dumps(record, ensure_ascii=rng.random() < 0.5) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--input")
    parser.add_argument("--output-prefix")
    parser.add_argument("--json-keys", nargs="+", default=["text"])
    parser.add_argument("--append-eod", action="store_true")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--keep-sequential-samples", action="store_true")
    parser.add_argument("--make-fixture")
    args = parser.parse_args()
    if args.make_fixture:
        make_fixture(args.make_fixture)
    elif args.partitions == 1:
        process_json_file(args.input, args.output_prefix, args.json_keys, args.append_eod)
    else:
        main_partitions(args)


if __name__ == "__main__":
    main()
