#!/usr/bin/env bash
# A kernel patch timed against the tree it applies to, on one GPU in one call: the current
# tree is copied as "before", the patches are applied to the current tree ("after"), both are
# built at once, our kernels are timed in both (before_after.sh, rounds alternating) and the
# after tree's tests run. Prints the comparison table (compare_runs.py) last.
#
#   [ROUNDS=2] [BLOCKS="psa aattn"] [TESTS="tests/test_fast_kernels.py ..."] \
#       bash bench/tune/patch_ab.sh bench/tune/patches/A.patch [B.patch ...]
#
# Run it on a copy of the tree (the GPU host's): it leaves the patches applied. Logs and
# results go under $OUT (default patch-ab/). Where one call cannot hold the builds, the rounds
# and the tests, run ROUNDS=1 first: a second call on the same warm machine (the tree copied
# afresh) reuses the before tree's build and adds a round with FIRST_ROUND=2 ROUNDS=2.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n 2,13p "$0"; exit 2; }
OUT=${OUT:-patch-ab}
mkdir -p "$OUT"
PY=${PY:-python3}
# The same tree gives the same bytes, so that a second call on a warm machine finds its build
# of the before tree (in /tmp/before) still good and rebuilds nothing.
tar -cf /tmp/patch-ab-before.tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
  --exclude=./build --exclude=./bench/results --exclude="./$OUT" --exclude='*.so' .
cmp -s /tmp/patch-ab-before.tar /tmp/patch-ab-built.tar || rm -rf /tmp/before
cp /tmp/patch-ab-before.tar /tmp/patch-ab-built.tar
# GNU patch, or git apply (which works outside a repository too). Lacking both, apply the
# patches where they are at hand and time the tree with before_after.sh against a tarball
# (git archive) of the tree before them.
apply_patch() {
  if command -v patch >/dev/null; then
    patch -p1 --forward --silent <"$1"
  elif command -v git >/dev/null; then
    git apply "$1"
  else
    echo "neither patch nor git here to apply $1"; return 1
  fi
}
for patch in "$@"; do
  apply_patch "$patch" || { echo "$patch does not apply"; exit 1; }
  echo "applied $patch"
done
OUT=$OUT STEPS="build bench" BLOCKS=${BLOCKS:-psa aattn} bash bench/tune/before_after.sh \
  /tmp/patch-ab-before.tar || exit 1
cp /tmp/bench_before_*.json /tmp/bench_after_*.json "$OUT"/ 2>/dev/null
TESTS=${TESTS:-tests/test_fast_kernels.py tests/test_attention.py tests/test_area_attention.py}
# shellcheck disable=SC2086
PYTHONPATH=$PWD $PY -m pytest $TESTS -q -rfE -p no:cacheprovider >"$OUT/tests.log" 2>&1
echo "tests of the patched tree: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
$PY bench/tune/compare_runs.py --before "$OUT"/bench_before_*.json \
  --after "$OUT"/bench_after_*.json | tee "$OUT/compare.md"
