#!/usr/bin/env bash
# The whole proof that strata's BpeTokenizer equals Hugging Face tokenizers, from the repository
# root, on a machine with python3, g++ (C++20) and `pip install tokenizers` (transformers and
# regex are compared too when installed):
#
#   bash tests/tokenizers/prove_bpe.sh [work directory, default a new temporary one]
#
# Builds bpe_encode with g++ alone, trains a 4096-token byte-level BPE on the shipped corpus with
# tokenizers (train_bpe.py), then compares the ids of the corpus, the hand-written cases and the
# fuzz texts (check_bpe.py). The exit status is check_bpe.py's: 0 when every id matches.
set -euo pipefail
work="${1:-$(mktemp -d /tmp/strata_bpe_proof.XXXXXX)}"
mkdir -p "$work"
echo "work directory: $work"
g++ --version | head -n 1
g++ -std=c++20 -O2 -Iinclude tests/tokenizers/bpe_encode.cpp -o "$work/bpe_encode"
python3 tests/tokenizers/train_bpe.py --output "$work/bpe" --vocab-size 4096
python3 tests/tokenizers/check_bpe.py --binary "$work/bpe_encode" --vocab "$work/bpe/vocab.json" --merges "$work/bpe/merges.txt" --keep "$work/check"
