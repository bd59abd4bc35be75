#!/usr/bin/env bash
# megatron_flag_share.sh <pretrain_gpt> <flags file> [min share, default 0.90]: how pretrain_gpt
# answers each distinct flag of Megatron-LM's example scripts (megatron_example_flags.txt), read from
# its --help: "meaning" (a flag it implements), "noted" (accepted, its help says why it changes
# nothing: "accepted: ..."), "refused" ("not available: ..."), "unknown" (not a flag of it). Prints
# one line per flag, the counts per script and overall, and fails when the share of meaning + noted
# is below the minimum. megatron_launch_lines.sh runs the lines themselves.
set -euo pipefail
pretrain=$1
flags_file=$2
min_share=${3:-0.90}

# One line per option of --help: "--name[,--alias...] description", continuation lines joined.
help=$("$pretrain" --help 2>&1 | awk '
  /^  -/ { if (entry != "") print entry; entry = $0; next }
  /^                              / { sub(/^ +/, " "); entry = entry $0; next }
  { if (entry != "") print entry; entry = "" }
  END { if (entry != "") print entry }')

classify() {  # classify <flag>: meaning | noted | refused | unknown
  local line
  line=$(grep -E -- "(^|[ ,!])$1([^a-z0-9-]|\$)" <<<"$help" | head -n 1 || true)
  if [[ -z "$line" ]]; then echo unknown
  elif [[ "$line" == *" not available: "* ]]; then echo refused
  elif [[ "$line" == *" accepted: "* ]]; then echo noted
  else echo meaning
  fi
}

declare -A total=() good=()
all=0 all_good=0
while read -r flag scripts; do
  [[ -z "$flag" || "$flag" == \#* ]] && continue
  kind=$(classify "$flag")
  printf '%-8s %-45s %s\n' "$kind" "$flag" "$scripts"
  all=$((all + 1))
  [[ "$kind" == meaning || "$kind" == noted ]] && all_good=$((all_good + 1))
  IFS=, read -ra names <<<"$scripts"
  for name in "${names[@]}"; do
    total[$name]=$(( ${total[$name]:-0} + 1 ))
    [[ "$kind" == meaning || "$kind" == noted ]] && good[$name]=$(( ${good[$name]:-0} + 1 ))
  done
done <"$flags_file"

echo
for name in "${!total[@]}"; do
  printf '%-12s %3d of %3d flags accepted (%s)\n' "$name" "${good[$name]:-0}" "${total[$name]}" \
    "$(awk -v g="${good[$name]:-0}" -v t="${total[$name]}" 'BEGIN { printf "%.1f%%", 100 * g / t }')"
done | sort
share=$(awk -v g="$all_good" -v t="$all" 'BEGIN { printf "%.4f", g / t }')
echo "all          $all_good of $all distinct flags accepted with Megatron's meaning or as a noted no-op ($share)"
if awk -v s="$share" -v m="$min_share" 'BEGIN { exit !(s < m) }'; then
  echo "FAIL: the share $share is below $min_share" >&2
  exit 1
fi
