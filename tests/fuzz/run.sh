#!/usr/bin/env bash
# Minimal fuzz runner: builds each tests/fuzz/fuzz_*.c with clang (libFuzzer + ASan + UBSan)
# linked with the core sources (src/common, src/model) and runs it for N seconds (default 20),
# seeded from tests/fuzz/corpus/<target>/ when present. Non-zero exit on a build failure or
# a crash. Usage: tests/fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-20}"
out="build-fuzz"
mkdir -p "$out"
flags="-std=c11 -D_GNU_SOURCE -g -O1 -Isrc -fsanitize=fuzzer,address,undefined"
flags="$flags -fno-sanitize-recover=undefined $(pkg-config --cflags libcjson libpcre2-8 libxxhash)"
libs="$(pkg-config --libs libcjson libpcre2-8 libxxhash) -lm -lpthread"
mapfile -t core < <(ls src/common/*.c src/model/*.c)
rc=0
for t in tests/fuzz/fuzz_*.c; do
  name="$(basename "$t" .c)"
  echo "== $name"
  clang $flags "$t" "${core[@]}" $libs -o "$out/$name" || { rc=1; continue; }
  mkdir -p "$out/corpus-$name"
  seeds=()
  [ -d "tests/fuzz/corpus/$name" ] && seeds=("tests/fuzz/corpus/$name")
  if ! "$out/$name" "$out/corpus-$name" "${seeds[@]}" -max_total_time="$secs" -max_len=4096 \
      -timeout=10 -artifact_prefix="$out/$name-" 2>"$out/$name.log"; then
    tail -n 40 "$out/$name.log" >&2
    rc=1
  else
    grep -E "Done [0-9]+ runs" "$out/$name.log" || true
  fi
done
exit $rc
