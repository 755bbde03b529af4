#!/usr/bin/env bash
# Builds every libFuzzer target tests/fuzz/fuzz_*.c with clang (fuzzer + ASan + UBSan) against
# the core sources (everything under src/ except the CLI and the h2o transport, plus kernels/cpu) and
# runs each for a bounded time. Usage: tests/fuzz/run.sh [SECONDS_PER_TARGET] (default:
# $FUZZ_SECONDS or 20).
# Exits non-zero when a target fails to build or finds a crash.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET="${1:-${FUZZ_SECONDS:-20}}"
OUT="${FUZZ_BUILD:-build-fuzz}"
CC="${CC_FUZZ:-clang}"
export PAGODA_TESTDATA="${PAGODA_TESTDATA:-$(pwd)/../shared/testdata}"
[ -d "$PAGODA_TESTDATA" ] || { echo "fuzz: test data missing: $PAGODA_TESTDATA" >&2; exit 1; }
command -v "$CC" >/dev/null || { echo "fuzz: $CC not found" >&2; exit 1; }

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CFLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -Isrc -I. $SAN $(pkg-config --cflags libcjson libpcre2-8 libxxhash)"
# x86-64 builds carry the SIMD tables as CMake builds them (the dispatch picks one at run time)
case "$(uname -m)" in x86_64 | amd64) CFLAGS="$CFLAGS -DPAGODA_X86=1 -DPAGODA_AVXVNNI=1 -DPAGODA_AVX512=1" ;; esac
LIBS="$(pkg-config --libs libcjson libpcre2-8 libxxhash libzstd liburing) -lm -lpthread"
mkdir -p "$OUT/obj"

# the core library, compiled once with coverage instrumentation for the fuzzers
objs=()
while IFS= read -r src; do
  obj="$OUT/obj/$(echo "$src" | tr '/' '_').o"
  extra=""
  # the same instruction-set flags CMake gives these files (they run only where the CPU has them)
  case "$src" in
    *_vnni_avx2.c) extra="-mavx2 -mfma -mf16c -mavxvnni" ;;
    *_avx2.c) extra="-mavx2 -mfma -mf16c" ;;
    *_avx512.c) extra="-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512bf16" ;;
  esac
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then
    "$CC" $CFLAGS -fsanitize=fuzzer-no-link $extra -c "$src" -o "$obj"
  fi
  objs+=("$obj")
done < <(find src kernels/cpu -name '*.c' -not -path 'src/cli/*' -not -path 'src/main.c' \
  -not -path 'src/http/server.c' -not -path 'src/http/routes.c' -not -path 'src/http/job.c' \
  -not -path 'src/http/embed_job.c' -not -path 'src/http/conns.c' \
  -not -path 'src/http/models_routes.c' -not -path 'src/http/transport.c' \
  2>/dev/null | sort)

status=0
shopt -s nullglob
targets=(tests/fuzz/fuzz_*.c)
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets in tests/fuzz" >&2; exit 1; }
for t in "${targets[@]}"; do
  name="$(basename "$t" .c)"
  echo "== $name: build"
  if ! "$CC" $CFLAGS -fsanitize=fuzzer "$t" "${objs[@]}" $LIBS -o "$OUT/$name"; then
    echo "fuzz: $name failed to build" >&2
    status=1
    continue
  fi
  corpus="$OUT/corpus/$name"
  mkdir -p "$corpus"
  seeds=()
  [ -d "tests/fuzz/corpus/$name" ] && seeds+=("tests/fuzz/corpus/$name")
  echo "== $name: run ${SECONDS_PER_TARGET}s"
  if ! "$OUT/$name" "$corpus" "${seeds[@]}" -max_total_time="$SECONDS_PER_TARGET" -max_len=4096 \
      -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$OUT/$name-" 2>"$OUT/$name.log"; then
    tail -n 40 "$OUT/$name.log" >&2
    echo "fuzz: $name FAILED (log: $OUT/$name.log)" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|Done [0-9]+ runs" "$OUT/$name.log" | tail -n 2 || true
  fi
done
exit $status
