#!/usr/bin/env bash
# CLI test of `pagoda tokenize` / `pagoda detokenize`: exact ids and text for a few golden
# cases, exit statuses for bad input (1) and usage errors (2).
# Usage: tokenizer_cli.sh PAGODA_BINARY TESTDATA_DIR
set -uo pipefail
BIN="$1"
TD="$2"
[ -x "$BIN" ] || { echo "FAIL: no binary $BIN"; exit 1; }
[ -d "$TD/tokenizers/llama3" ] || { echo "FAIL: test data missing: $TD"; exit 1; }
fails=0
expect() { # expect NAME WANT GOT
  if [ "$2" != "$3" ]; then echo "FAIL $1: want [$2] got [$3]"; fails=$((fails + 1)); fi
}
L3="$TD/tokenizers/llama3"
L2="$TD/tokenizers/llama2"

expect "llama3 json" '{"ids": [128000, 9906, 1917]}' "$("$BIN" tokenize --model "$L3" --text "Hello world" --json)"
expect "llama3 plain" '9906 1917' "$("$BIN" tokenize --model "$L3" --text "Hello world" --no-special)"
expect "llama2 bos" '1 15043 3186' "$("$BIN" tokenize --model "$L2" --text "Hello world")"
expect "model folder" '{"ids": [1292, 308, 1057, 261, 618]}' \
  "$("$BIN" tokenize --model "$TD/models/llama-tiny" --text "Once upon a time" --json)"
tmp="$(mktemp)"
printf 'Hello world' > "$tmp"
expect "text file" '1 15043 3186' "$("$BIN" tokenize --model "$L2" --text-file "$tmp")"
expect "detokenize" 'Hello world' "$("$BIN" detokenize --model "$L2" --ids "15043 3186")"
expect "detokenize special" '<s> Hello' "$("$BIN" detokenize --model "$L2" --ids "1 15043")"
expect "detokenize skip" 'Hello' "$("$BIN" detokenize --model "$L2" --ids "1,15043" --skip-special)"

status() { "$@" >/dev/null 2>&1; echo $?; }
printf 'a\xff' > "$tmp"
expect "bad utf-8" 1 "$(status "$BIN" tokenize --model "$L3" --text-file "$tmp")"
expect "missing file" 1 "$(status "$BIN" tokenize --model "$L3" --text-file /nonexistent/file)"
expect "missing model" 1 "$(status "$BIN" tokenize --model /nonexistent --text x)"
expect "id out of range" 1 "$(status "$BIN" detokenize --model "$L2" --ids "1 32000")"
expect "bad id" 1 "$(status "$BIN" detokenize --model "$L2" --ids "1 x")"
expect "no text" 2 "$(status "$BIN" tokenize --model "$L3")"
expect "unknown flag" 2 "$(status "$BIN" tokenize --model "$L3" --text x --bogus)"
expect "no ids" 2 "$(status "$BIN" detokenize --model "$L3")"
err="$("$BIN" detokenize --model "$L2" --ids "99999" 2>&1 >/dev/null)"
expect "one error line" 1 "$(printf '%s\n' "$err" | wc -l)"
rm -f "$tmp"
[ "$fails" -eq 0 ] && echo "tokenizer CLI: ok" || exit 1
