#!/usr/bin/env bash
# docs/architecture.md's module map names every folder and source module that git tracks:
# each folder of src/, kernels/, bench/ and tests/, and each .c / .cu / .cuh stem of src/,
# kernels/ and bench/, verbatim or through a "<prefix>*" family (tokenizer*, tmpl*).
# usage: tests/integration/docs_map.sh (from the project root)
set -uo pipefail
cd "$(dirname "$0")/../.."
map=$(sed -n '/^```$/,/^```$/p' docs/architecture.md | head -200)
fail=0
for d in $(git ls-files src kernels bench tests | sed 's|/[^/]*$||' | sort -u); do
  case "$d" in tests/*/*) d=${d%%/*}/$(echo "$d" | cut -d/ -f2) ;; esac
  grep -qF "$d/" <<<"$map" || { echo "docs_map: folder $d/ is not in the module map"; fail=1; }
done
for f in $(git ls-files 'src/*.c' 'kernels/*.c' 'kernels/*.cu' 'kernels/*.cuh' 'bench/*.c'); do
  stem=$(basename "$f"); stem=${stem%.*}
  prefix=${stem%%_*}
  if ! grep -qw -- "$stem" <<<"$map" && ! grep -qF -- "$prefix*" <<<"$map"; then
    echo "docs_map: $f is not named in the module map"
    fail=1
  fi
done
[ $fail -eq 0 ] && echo "docs_map: every folder and module is in docs/architecture.md"
exit $fail
