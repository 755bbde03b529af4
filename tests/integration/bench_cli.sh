#!/usr/bin/env bash
# CLI test of `pagoda bench decode` and `pagoda bench throughput` on the bundled demo model:
# the run's shape as reported in --json (batch, prompts per prefill step, lengths; requests,
# sampling, output tokens), the clamp of --prefill-seqs to the batch, and exit status 2 for
# usage errors.
# Usage: bench_cli.sh PAGODA_BINARY
set -uo pipefail
BIN="$1"
MODEL="$(dirname "$0")/../../models/demo"
[ -x "$BIN" ] || { echo "FAIL: no binary $BIN"; exit 1; }
fails=0
expect() { # expect NAME WANT GOT
  if [ "$2" != "$3" ]; then echo "FAIL $1: want [$2] got [$3]"; fails=$((fails + 1)); fi
}
shape() { # the shape fields of a --json report
  grep -o '"batch": [0-9]*, "prefill_seqs": [0-9]*, "prompt_len": [0-9]*, "gen_len": [0-9]*'
}
run() { "$BIN" bench decode --model "$MODEL" --device cpu --threads 1 --no-bandwidth --json "$@"; }

expect "one prompt a step" '"batch": 3, "prefill_seqs": 1, "prompt_len": 8, "gen_len": 2' \
  "$(run --batch 3 --prompt-len 8 --gen-len 2 | shape)"
expect "two prompts a step" '"batch": 5, "prefill_seqs": 2, "prompt_len": 8, "gen_len": 2' \
  "$(run --batch 5 --prompt-len 8 --gen-len 2 --prefill-seqs 2 | shape)"
expect "clamped to the batch" '"batch": 2, "prefill_seqs": 2, "prompt_len": 4, "gen_len": 1' \
  "$(run --batch 2 --prompt-len 4 --gen-len 1 --prefill-seqs 9 | shape)"
tps="$(run --batch 4 --prompt-len 8 --gen-len 2 --prefill-seqs 4 |
  grep -o '"prefill_tokens_per_s": [0-9.]*' | grep -o '[0-9.]*$')"
if ! awk -v t="$tps" 'BEGIN { exit !(t > 0) }'; then
  echo "FAIL prefill rate: [$tps]"
  fails=$((fails + 1))
fi

status() { "$@" >/dev/null 2>&1; echo $?; }
expect "zero prompts a step" 2 "$(status run --prefill-seqs 0)"
expect "not a number" 2 "$(status run --prefill-seqs two)"
expect "unknown option" 2 "$(status run --prefill 2)"
expect "no model" 2 "$(status "$BIN" bench decode --prefill-seqs 2)"

# bench throughput: every request gets its output_len tokens, greedy or sampled
tp() { "$BIN" bench throughput --model "$MODEL" --device cpu --threads 1 --json "$@"; }
tshape() { grep -o '"num_prompts": [0-9]*, "input_len": [0-9]*, "output_len": [0-9]*, "prefix_len": [0-9]*, "temperature": [0-9.]*, "top_p": [0-9.]*, "output_tokens": [0-9]*'; }
expect "throughput greedy" \
  '"num_prompts": 3, "input_len": 8, "output_len": 5, "prefix_len": 0, "temperature": 0, "top_p": 1, "output_tokens": 15' \
  "$(tp --num-prompts 3 --input-len 8 --output-len 5 | tshape)"
expect "throughput sampled" \
  '"num_prompts": 4, "input_len": 6, "output_len": 7, "prefix_len": 0, "temperature": 0.8, "top_p": 0.9, "output_tokens": 28' \
  "$(tp --num-prompts 4 --input-len 6 --output-len 7 --temperature 0.8 --top-p 0.9 | tshape)"
expect "negative temperature" 2 "$(status tp --temperature -1)"
expect "top-p of 0" 2 "$(status tp --top-p 0)"
expect "top-p above 1" 2 "$(status tp --top-p 1.5)"

if [ "$fails" -ne 0 ]; then
  echo "bench_cli: $fails failed"
  exit 1
fi
echo "bench_cli: all passed"
