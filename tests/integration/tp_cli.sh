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
# Qwen3.5 (Gated DeltaNet and gated attention): the tiny model's 2 linear key heads split 2
# ways; random models of 4 key and 8 value heads (a rank's value heads read its key heads)
# 2 and 4 ways, in bf16, in MLX 8-bit and mxfp4 (in_proj_qkv's q, k and v shares copied with
# their scales); the bf16 one with an MTP module
for f in bf16 mlx8 mxfp4; do
  mtp=
  [ $f = bf16 ] && mtp="--mtp-layers 1"
  "$PAGODA" bench make-model --arch qwen3_5 --hidden 256 --layers 4 --heads 8 --kv-heads 2 \
    --head-dim 32 --ffn 512 --vocab 1024 --format $f --full-attention-interval 2 \
    --linear-key-heads 4 --linear-value-heads 8 --linear-key-dim 32 --linear-value-dim 64 \
    $mtp "$TMP/q35-$f" >/dev/null 2>&1 || fail "make-model qwen3_5 $f"
done
for mt in "$TD/models/llama-tiny:2 4" "$TD/models/qwen2-tiny:2 4" \
  "$TD/models/qwen3-tiny-mlx8:2 4" "$TD/models/gemma2-tiny:2 4" "$TD/models/gemma3-tiny:2 4" \
  "$TD/models/qwen3moe-tiny:2 4" "$TD/models/qwen3_5-tiny:2" "$TD/models/qwen3_5_moe-tiny:2" \
  "$TD/models/qwen3_5_moe-tiny-mlx8:2" "$TMP/q35-bf16:2 4" \
  "$TMP/q35-mlx8:2 4" "$TMP/q35-mxfp4:2 4"; do
  m=${mt%%:*}
  one=$(gen "$m" 1)
  for tp in ${mt#*:}; do
    got=$(gen "$m" $tp) || { fail "$m -tp $tp: $(cat "$TMP/err")"; continue; }
    python3 - "$one" "$got" <<'PY' || fail "$m -tp $tp differs from one rank"
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["ids"] == b["ids"], (a["ids"], b["ids"])
assert all(abs(x - y) <= 1e-4 for x, y in zip(a["logprobs"], b["logprobs"])), (a, b)
PY
  done
done

# Gemma 4 (batch-invariant products: it magnifies any rounding): the dense and the MoE model
# (head size 512 and partial rotary on global layers, KV-shared layers, K as V, per-layer
# inputs), and a copy of the MoE model whose global layers have 1 key-value head
# (num_global_key_value_heads) where the sliding ones have 2 (split 2 and 4 ways, their heads
# are shared out by each layer's own count) and whose KV-shared layers have an MLP twice as
# wide (use_double_wide_mlp: each matrix twice over). Prompt log-probabilities within 1e-3 of
# one rank.
G4=$TMP/gemma4-gkv1
mkdir -p "$G4"
python3 - "$TD/models/gemma4moe-tiny" "$G4" <<'PY' || fail "could not write $G4"
import json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
c = json.load(open(f"{src}/config.json"))
c["num_global_key_value_heads"] = 1
c["use_double_wide_mlp"] = True
json.dump(c, open(f"{dst}/config.json", "w"))
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    os.symlink(f"{src}/{f}", f"{dst}/{f}")
raw = open(f"{src}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
out, blobs, off = {}, [], 0
for name, t in head.items():
    if name == "__metadata__":
        continue
    b = data[t["data_offsets"][0] : t["data_offsets"][1]]
    if name.endswith("self_attn.k_proj.weight") and t["shape"][0] == 1024:  # a global layer
        t["shape"] = [512, t["shape"][1]]
        b = b[: len(b) // 2]  # its first key-value head
    shared = name.startswith(("model.layers.2.mlp.", "model.layers.3.mlp."))
    if shared and name.endswith(("gate_proj.weight", "up_proj.weight")):
        t["shape"], b = [2 * t["shape"][0], t["shape"][1]], b + b
    elif shared and name.endswith("down_proj.weight"):
        r = t["shape"][1] * 2  # bytes of a bf16 row
        b = b"".join(b[i : i + r] * 2 for i in range(0, len(b), r))
        t["shape"] = [t["shape"][0], 2 * t["shape"][1]]
    out[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(f"{dst}/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
G4_IDS='2 3 4 5 100 200 300 400 17 18 19 20 21 22 23 24 25 26 27 28'
for m in "$TD/models/gemma4-tiny" "$TD/models/gemma4moe-tiny" "$G4"; do
  one=$("$PAGODA" score --device cpu --model "$m" --prompt-ids "$G4_IDS" --batch-invariant \
    2>"$TMP/err") || { fail "score $m: $(cat "$TMP/err")"; continue; }
  for tp in 2 4; do
    got=$("$PAGODA" score --device cpu --model "$m" --prompt-ids "$G4_IDS" --batch-invariant \
      -tp $tp 2>"$TMP/err") || { fail "score $m -tp $tp: $(cat "$TMP/err")"; continue; }
    python3 - "$one" "$got" <<'PY' || fail "score $m -tp $tp differs from one rank"
import json, sys
a, b = json.loads(sys.argv[1])["prompt_logprobs"], json.loads(sys.argv[2])["prompt_logprobs"]
assert len(a) == len(b) == 20 and all(abs(x - y) <= 1e-3 for x, y in zip(a[1:], b[1:])), (a, b)
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

# the MTP module, whole on the lead (its layer at the whole model's 8 heads and 2 KV heads,
# which ranks share 4 ways), gives plain decoding's greedy tokens split 2 and 4 ways
mtp_ids() { # tp, generate args...
  local tp=$1
  shift
  "$PAGODA" generate --device cpu --model "$TMP/q35-bf16" --prompt-ids '1 2 3 1 2 3 1 2' -n 12 \
    --temperature 0 --ignore-eos --json -tp "$tp" "$@" 2>"$TMP/err" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["ids"])'
}
plain=$(mtp_ids 1)
for tp in 2 4; do
  got=$(mtp_ids $tp --speculative-method mtp)
  [ -n "$plain" ] && [ "$got" = "$plain" ] ||
    fail "qwen3_5 MTP -tp $tp: $got, want $plain ($(cat "$TMP/err"))"
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
refuse "2 linear_num_key_heads, which do not divide into --tensor-parallel-size 4 parts" \
  --model "$TD/models/qwen3_5-tiny" -tp 4
refuse "2 key-value heads, which do not divide into --tensor-parallel-size 3 parts" \
  --model "$M" -tp 3
refuse "moe_intermediate_size 64 split 4 ways (--tensor-parallel-size) leaves each rank 16 inputs" \
  --model "$TD/models/qwen3moe-tiny-mlx4" -tp 4
# Gemma 4's experts split by their width; a global layer's own key-value heads
G4C=$TMP/gemma4-odd
mkdir -p "$G4C"
g4conf() { # key=value...: gemma4moe-tiny's config.json with those fields, alone in $G4C
  python3 - "$TD/models/gemma4moe-tiny/config.json" "$G4C/config.json" "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split("=")
    c[k] = int(v)
json.dump(c, open(sys.argv[2], "w"))
PY
}
g4conf moe_intermediate_size=66
refuse "66 moe_intermediate_size, which do not divide into --tensor-parallel-size 4 parts" \
  --model "$G4C" -tp 4
g4conf num_attention_heads=12 num_key_value_heads=4 num_global_key_value_heads=3
refuse "3 key-value heads on layer 1 (num_global_key_value_heads or per_layer_config), which do \
not divide into --tensor-parallel-size 2 parts" --model "$G4C" -tp 2
refuse "has no multi-token-prediction module" --model "$M" -tp 2 --speculative-method mtp
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
