#!/usr/bin/env bash
# The whole proof, from scratch, that strata's tokenizers give the ids of the Python packages, from
# the repository root, on a machine with python3, g++ (C++20), libsentencepiece-dev and
# `pip install tokenizers sentencepiece` (a virtual environment is fine: set PYTHON):
#
#   bash tests/tokenizers/prove_tokenizers.sh [work directory, default a new temporary one]
#
# 1. GPT2BPETokenizer: prove_bpe.sh (vocab.json + merges.txt against tokenizers, transformers, GPT-2).
# 2. Re-trains the shipped tokenizers (train_tokenizers.py) into the work directory and checks that
#    they equal the committed files (training is deterministic for one tokenizers / sentencepiece
#    release; a difference is reported, not fatal, since another release may train otherwise).
# 3. Builds tokenizer_encode with g++ alone and compares strata with the Python packages on the
#    corpus, the adversarial cases and random fuzz texts, for the re-trained files
#    (check_tokenizers.py), printing the speed of both on the corpus.
# 4. Re-writes the CI fixtures from the committed files into the work directory and compares them
#    with tests/tokenizers/expected (they must be equal).
# The exit status is non-zero when any id differs.
set -euo pipefail
work="${1:-$(mktemp -d /tmp/strata_tokenizers_proof.XXXXXX)}"
python="${PYTHON:-python3}"
mkdir -p "$work"
echo "work directory: $work"
g++ --version | head -n 1
"$python" -c "import tokenizers, sentencepiece; print('tokenizers', tokenizers.__version__, 'sentencepiece', sentencepiece.__version__)"

echo "==== 1. GPT2BPETokenizer (prove_bpe.sh)"
PATH="$(dirname "$(command -v "$python")"):$PATH" bash tests/tokenizers/prove_bpe.sh "$work/bpe"

echo "==== 2. re-training the shipped tokenizers"
"$python" tests/tokenizers/train_tokenizers.py --output "$work/trained"
for f in gpt2_bpe/tokenizer.json llama3_bpe/tokenizer.json llama3_bpe/tokenizer_config.json sp_bpe.model sp_unigram.model; do
  if cmp -s "$work/trained/$f" "tests/tokenizers/$f"; then echo "  $f: same as committed"; else echo "  $f: DIFFERS from the committed file (another release trains otherwise?)"; fi
done

echo "==== 3. strata against the Python packages (re-trained files, corpus + adversarial + fuzz)"
g++ -std=c++20 -O2 -Iinclude -DSTRATA_WITH_SENTENCEPIECE=1 tests/tokenizers/tokenizer_encode.cpp -lsentencepiece -o "$work/tokenizer_encode"
"$python" tests/tokenizers/check_tokenizers.py --models "$work/trained" --binary "$work/tokenizer_encode" --fuzz "${FUZZ:-3000}"

echo "==== 4. the CI fixtures, written again from the committed files"
"$python" tests/tokenizers/check_tokenizers.py --models tests/tokenizers --write-expected "$work/expected"
diff -r "$work/expected" tests/tokenizers/expected && echo "  fixtures: same as committed"
