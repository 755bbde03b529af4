#!/usr/bin/env bash
# CLI test of `pagoda perplexity`: the JSON fields, the scored token count (windows of --ctx,
# second halves), KL 0 and full top-1 agreement of a format against itself, a quantized
# format that moves the distributions but little (fp8: mean KL under 0.01 on the tiny
# Llama), the KV cache options refused when bad (exit 2) and a missing file (exit 1).
# Usage: perplexity_cli.sh PAGODA_BINARY TESTDATA_DIR
set -uo pipefail
BIN="$1"
TD="$2"
M="$TD/models/llama-tiny"
TXT="$TD/corpus/tinyshakespeare.txt"
[ -x "$BIN" ] || { echo "FAIL: no binary $BIN"; exit 1; }
[ -d "$M" ] && [ -f "$TXT" ] || { echo "FAIL: test data missing: $TD"; exit 1; }
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 20000 "$TXT" > "$tmp/t.txt"

out=$("$BIN" perplexity --model "$M" --file "$tmp/t.txt" --ctx 64 --chunks 3 --kv-cache-dtype bf16 \
  --kl-base bf16 --json 2>/dev/null)
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
j = json.loads(sys.argv[1])
assert j["tokens"] == 3 * 31, j            # 3 windows, positions 32..62 predict the next
assert j["chunks"] == 3 and j["ctx"] == 64, j
assert j["kl_divergence"] == 0 and j["top1_agreement"] == 1, j
assert j["perplexity"] == j["base_perplexity"] and j["perplexity"] > 1, j
PY
out=$("$BIN" perplexity --model "$M" --file "$tmp/t.txt" --ctx 64 --chunks 3 --kv-cache-dtype fp8 \
  --kl-base bf16 --json 2>/dev/null)
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
j = json.loads(sys.argv[1])
assert j["kv_cache_dtype_k"] == "fp8" and j["kl_base"] == "bf16", j
assert 0 < j["kl_divergence"] < 0.01 and j["top1_agreement"] > 0.8, j
PY
"$BIN" perplexity --model "$M" --file "$tmp/t.txt" --kv-cache-dtype int3 >/dev/null 2>&1
[ $? -eq 2 ] || fail "bad format: want exit 2"
"$BIN" perplexity --model "$M" --file "$tmp/t.txt" --kv-cache-skip-layers 1,x >/dev/null 2>&1
[ $? -eq 2 ] || fail "bad skip list: want exit 2"
"$BIN" perplexity --model "$M" --file "$tmp/none.txt" >/dev/null 2>&1
[ $? -eq 1 ] || fail "missing file: want exit 1"
"$BIN" perplexity --model "$M" --file "$tmp/t.txt" --kv-cache-skip-layers 9 --kv-cache-dtype fp8 \
  >/dev/null 2>&1
[ $? -eq 1 ] || fail "skip of a layer the model lacks: want exit 1"
[ $fails -eq 0 ] && echo "perplexity_cli: ok"
exit $fails
