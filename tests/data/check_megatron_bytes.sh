#!/usr/bin/env bash
# preprocess_data against the bytes Megatron's preprocess_data.py writes, as
# megatron_preprocess_reference.py computes them from Megatron's code (no Megatron, torch or numpy
# needed): a corpus with empty texts, lists of sentences, escapes and UTF-8, two --json-keys,
# with and without --append-eod, --partitions 3 round robin and with --keep-sequential-samples,
# and a gzip input split into partitions (the one place Megatron reads gzip). Every .bin/.idx must
# be equal byte for byte.
#   check_megatron_bytes.sh <preprocess_data> [python3]
set -euo pipefail
tool=$1
python=${2:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
reference="$here/megatron_preprocess_reference.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" "$reference" --make-fixture "$work/corpus.jsonl"
gzip -c "$work/corpus.jsonl" > "$work/corpus.jsonl.gz"
checked=0
compare() {  # compare <name> <input file> <flags...>: runs both in their own folders, compares outputs
  local name=$1 input=$2
  shift 2
  mkdir -p "$work/$name/strata" "$work/$name/megatron"
  cp "$work/$input" "$work/$name/strata/" && cp "$work/$input" "$work/$name/megatron/"
  "$tool" --input "$work/$name/strata/$input" --output-prefix "$work/$name/strata/out" --input-format jsonl \
    --json-keys text title --workers 2 "$@" > "$work/$name/strata.log" 2>&1 || { cat "$work/$name/strata.log"; exit 1; }
  "$python" "$reference" --input "$work/$name/megatron/$input" --output-prefix "$work/$name/megatron/out" \
    --json-keys text title "$@"
  for key in text title; do
    for ext in bin idx; do
      if ! cmp "$work/$name/strata/out_${key}_document.$ext" "$work/$name/megatron/out_${key}_document.$ext"; then
        echo "FAIL $name: out_${key}_document.$ext differs from Megatron's"; exit 1
      fi
      checked=$((checked + 1))
    done
  done
  echo "ok   $name ($*): .bin/.idx equal to Megatron's"
}
compare plain corpus.jsonl
compare eod corpus.jsonl --append-eod
compare round_robin corpus.jsonl --append-eod --partitions 3
compare sequential corpus.jsonl --append-eod --partitions 3 --keep-sequential-samples
compare gzip_partitions corpus.jsonl.gz --append-eod --partitions 2
echo "all $checked files equal"
