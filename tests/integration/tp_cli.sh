#!/usr/bin/env bash
# CLI test of --tensor-parallel-size on CPU backends: generate, score, bench decode and serve
# split 2 and 4 ways give the tokens of one rank (log-probabilities within 1e-4: only the order
# of the partial sums differs); what a split cannot run is refused at load time, naming why.
# usage: tp_cli.sh PAGODA TESTDATA
set -uo pipefail
PAGODA=$1
TD=$2
M=$TD/models/llama-tiny
TMP=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

gen() { # model, tp
  "$PAGODA" generate --device cpu --threads 2 --model "$1" -tp "$2" --prompt-ids '1 5 9 14 2' \
    -n 12 --temperature 0 --ignore-eos --json 2>"$TMP/err"
}
for m in llama-tiny qwen2-tiny qwen3-tiny-mlx8 gemma2-tiny gemma3-tiny qwen3moe-tiny; do
  one=$(gen "$TD/models/$m" 1)
  for tp in 2 4; do
    got=$(gen "$TD/models/$m" $tp) || { fail "$m -tp $tp: $(cat "$TMP/err")"; continue; }
    python3 - "$one" "$got" <<'PY' || fail "$m -tp $tp differs from one rank"
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["ids"] == b["ids"], (a["ids"], b["ids"])
assert all(abs(x - y) <= 1e-4 for x, y in zip(a["logprobs"], b["logprobs"])), (a, b)
PY
  done
done

# score: prompt log-probabilities split 2 ways
s1=$("$PAGODA" score --device cpu --model "$M" --prompt-ids '1 5 9 14 2 7' --json)
s2=$("$PAGODA" score --device cpu --model "$M" --prompt-ids '1 5 9 14 2 7' --json -tp 2)
python3 - "$s1" "$s2" <<'PY' || fail "score -tp 2: $s2"
import json, sys
a, b = json.loads(sys.argv[1])["prompt_logprobs"], json.loads(sys.argv[2])["prompt_logprobs"]
assert a[0] is None and b[0] is None and len(a) == len(b) == 6, (a, b)
assert all(abs(x - y) <= 1e-4 for x, y in zip(a[1:], b[1:])), (a, b)
PY

# bench decode split 2 ways: runs, steps not overlapped
out=$("$PAGODA" bench decode --device cpu --model "$M" --batch 2 --prompt-len 16 --gen-len 4 \
  --no-bandwidth --json -tp 2 2>"$TMP/err")
python3 - "$out" <<'PY' || fail "bench decode -tp 2: $out $(cat "$TMP/err")"
import json, sys
j = json.loads(sys.argv[1])
assert j["decode_tokens_per_s"] > 0 and j["overlap_schedule"] is False, j
PY

# speculative decoding split 2 ways: n-gram drafts (a repeating prompt, so some are kept)
# and the model as its own draft give plain split decoding's tokens
ids() { # generate args...: the greedy ids of 12 tokens
  "$PAGODA" generate --device cpu --model "$M" --prompt-ids '1 2 3 1 2 3 1 2' -n 12 \
    --temperature 0 --ignore-eos --json -tp 2 "$@" 2>"$TMP/err" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["ids"])'
}
plain=$(ids)
[ -n "$plain" ] || fail "generate -tp 2: $(cat "$TMP/err")"
for s in "--speculative-method ngram" "--speculative-method draft --speculative-model $M"; do
  got=$(ids $s)
  [ "$got" = "$plain" ] || fail "generate -tp 2 $s: $got, want $plain ($(cat "$TMP/err"))"
done
# a disk KV tier split 2 ways: written, then read back by the next run (the same tokens)
for run in 1 2; do
  got=$(ids --kv-disk-dir "$TMP/kv")
  [ "$got" = "$plain" ] || fail "generate -tp 2 --kv-disk-dir, run $run: $got ($(cat "$TMP/err"))"
done

# refused at load time, exit 1, with the reason
refuse() { # want, args...
  local want=$1
  shift
  local out
  out=$("$PAGODA" generate --device cpu --prompt-ids '1 2' -n 1 "$@" 2>&1)
  local rc=$?
  [ $rc -eq 1 ] && grep -qF -- "$want" <<<"$out" || fail "$* -> rc $rc: $out (want: $want)"
}
refuse "does not run split over GPUs yet" --model "$TD/models/qwen3_5-tiny" -tp 2
refuse "2 key-value heads, which do not divide into --tensor-parallel-size 3 parts" \
  --model "$M" -tp 3
refuse "moe_intermediate_size 64 split 4 ways (--tensor-parallel-size) leaves each rank 16 inputs" \
  --model "$TD/models/qwen3moe-tiny-mlx4" -tp 4
refuse "--speculative-method mtp is not supported with a split model" --model "$M" -tp 2 \
  --speculative-method mtp
out=$("$PAGODA" generate --device cpu --model "$M" --prompt-ids '1 2' -tp 9 2>&1)
[ $? -eq 2 ] || fail "-tp 9: want exit 2: $out"

# serve split 2 ways: the completion of one rank
complete() { # tp: prints the completion's text
  "$PAGODA" serve --model "$M" --device cpu --port 0 --threads 2 --http-threads 2 -tp "$1" \
    2>"$TMP/log" &
  PID=$!
  local port=
  for _ in $(seq 150); do
    port=$(grep -o 'listening on [a-z]*://127.0.0.1:[0-9]*' "$TMP/log" | grep -o '[0-9]*$' || true)
    grep -q ready "$TMP/log" && [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { fail "serve -tp $1 did not start: $(cat "$TMP/log")"; return; }
  curl -sS "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
    -d '{"model":"llama-tiny","prompt":[1,2,3],"max_tokens":8,"temperature":0,"ignore_eos":true}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
  kill -TERM "$PID"
  wait "$PID"
  PID=
}
a=$(complete 1)
b=$(complete 2)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "serve -tp 2: '$b', one rank: '$a'"

[ $fails -eq 0 ] && echo "tp_cli: ok"
exit $((fails > 0))
