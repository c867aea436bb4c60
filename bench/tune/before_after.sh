#!/usr/bin/env bash
# Same kernels, same numbers: a refactor against the tree it started from, on one GPU in one
# call. Builds both trees at once, then for each: the launch trace of every benchmark row
# (launch_trace.py: kernel, grid, block, shared memory, registers) and our kernels' times at
# the standard shapes, bf16 and fp16, the two trees' runs alternating. Writes under $OUT:
# trace_before.txt, trace_after.txt, trace.diff, bench_{before,after}_{1,2}.md, plans.txt.
#
#   [ROUNDS=2] [STEPS="build trace bench"] [BLOCKS="psa aattn aifi"] \
#       bash bench/tune/before_after.sh BEFORE_SOURCE_TARBALL
#
# BLOCKS: the benchmark's blocks to time (default psa; aattn and aifi run (32, 32)).
#
# BEFORE_SOURCE_TARBALL: `git archive <commit>` of the earlier tree (bench/results left out
# keeps it small). A second call on the same machine finds both builds done (ninja rebuilds
# nothing), so the steps can be spread over calls.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-before-after}
mkdir -p "$OUT" /tmp/before
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-build trace bench}
[ -f /tmp/before/setup.py ] || tar -xf "$1" -C /tmp/before
start=$(date +%s)
(cd /tmp/before && MAX_JOBS=8 $PY setup.py build_ext --inplace >"$OUT/build_before.log" 2>&1) &
MAX_JOBS=8 $PY setup.py build_ext --inplace >"$OUT/build_after.log" 2>&1
after_rc=$?
wait $!
before_rc=$?
echo "builds: $(( $(date +%s) - start )) s (before exit $before_rc, after exit $after_rc)"
[ $before_rc = 0 ] && [ $after_rc = 0 ] || { tail -30 "$OUT"/build_*.log; exit 1; }

case " $STEPS " in *" trace "*) ;; *) SKIP_TRACE=1 ;; esac
trace() {  # $1: tree, $2: name
  (cd "$1" && PYTHONPATH=$1 $PY "$OLDPWD/bench/tune/launch_trace.py") >"$OUT/trace_$2.txt" \
    2>"$OUT/trace_$2.err" || { tail -20 "$OUT/trace_$2.err"; }
}
if [ -z "${SKIP_TRACE:-}" ]; then
trace /tmp/before before
trace "$PWD" after
if diff "$OUT/trace_before.txt" "$OUT/trace_after.txt" >"$OUT/trace.diff"; then
  echo "launch traces: identical ($(wc -l <"$OUT/trace_after.txt") launches)"
else
  echo "launch traces DIFFER: $(grep -c '^[<>]' "$OUT/trace.diff") lines"; head -40 "$OUT/trace.diff"
fi

# The plan of every benchmark row, as the after tree prints it.
for shape in "16 2 400" "16 4 400" "64 4 400" "1 4 400" "16 4 1600" "8 4 6400" "1 2 62500"; do
  for dtype in bf16 fp16; do
    PYTHONPATH=$PWD $PY -m psa_fa2_ext --plan $shape 32 64 $dtype psa
  done
done >"$OUT/plans.txt" 2>&1
fi

bench() {  # $1: tree, $2: name
  (cd "$1" && PYTHONPATH=$1 $PY bench/bench_attention.py --blocks ${BLOCKS:-psa} --peers ours \
    --dtypes bf16 fp16 --no-step --out "/tmp/bench_$2") >"$OUT/bench_$2.md" 2>"$OUT/bench_$2.err" \
    || tail -20 "$OUT/bench_$2.err"
}
case " $STEPS " in *" bench "*)
  for round in $(seq "${FIRST_ROUND:-1}" "${ROUNDS:-2}"); do
    bench /tmp/before "before_$round"
    bench "$PWD" "after_$round"
    echo "round $round: $(( $(date +%s) - start )) s"
  done ;;
esac
echo "total: $(( $(date +%s) - start )) s"
