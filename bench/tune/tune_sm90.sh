#!/usr/bin/env bash
# NOTE: runs against the tree of commit 28fac21 only (`git checkout 28fac21`, or a worktree of
# it): the last with the compile-time variants (the PSA_FA2_* macros below) and the old
# csrc/cuda file layout. The current tree has neither; this is not ported to it
# (bench/tune/README.md lists what runs there).
# Checks and times compile-time variants of the Hopper (wgmma) kernels through the extension
# (needs a Hopper GPU, nvcc and the build's torch), from the project root:
#   bash bench/tune/tune_sm90.sh fwd|bwd [variant...]
#   (default: every variant of that kernel; shapes: SHAPES="16x4x400 ..." in the environment)
# Each variant rebuilds that kernel's flash_{fwd,bwd}_sm90_*.cu and dispatch files with its -D
# flags (NVCC_APPEND_FLAGS; the touch makes ninja rebuild them), runs that kernel's tests on it
# (their summary line and the failures), then times it, bf16: bench/fwd_kernels.py or
# bench/bwd_schedules.py.
# The last build is the default one again, so the tree is left as it was.
set -euo pipefail
cd "$(dirname "$0")/../.."
kernel=${1:?usage: tune_sm90.sh fwd|bwd [variant...]}
shift
shapes=${SHAPES:-16x4x400 16x4x1600 8x4x6400 1x2x62500}
declare -A variants
if [ "$kernel" = fwd ]; then
  variants=(
    [default]=""
    [kv_as_given]="-DPSA_FA2_ALIGNED_KV_MIN_SEQLEN=2147483647"
  )
  # (Timing-only variants of the forward, without torch: bench/tune/tune_fwd.sh sm90.)
  order="default kv_as_given"
  tests="test_forward_fast and not fp32 and not tf32"
  timing="bench/fwd_kernels.py"
elif [ "$kernel" = bwd ]; then
  variants=(
    [default]=""
    [two_barriers]="-DPSA_FA2_BWD90_ONE_BARRIER=0"
    [late_lse]="-DPSA_FA2_BWD90_EARLY_LSE=0"
    [two_dq_chains]="-DPSA_FA2_BWD90_DQ_CHAINS=2"
    [three_stages]="-DPSA_FA2_BWD90_STAGES=3"
    [four_stages]="-DPSA_FA2_BWD90_STAGES=4"
    [no_tail_split]="-DPSA_FA2_BWD90_TAIL_SPLIT=0"
    [pieces_of_four_steps]="-DPSA_FA2_BWD90_MIN_STEPS=4"
    [dq_red_in_step]="-DPSA_FA2_BWD90_LATE_DQ_RED=0"
    [dq_wgmma_on_images]="-DPSA_FA2_BWD90_DQ_WGMMA=2"
    [dq_wgmma]="-DPSA_FA2_BWD90_DQ_WGMMA=1"
  )
  order="default two_barriers late_lse two_dq_chains three_stages four_stages no_tail_split
    pieces_of_four_steps dq_red_in_step dq_wgmma_on_images dq_wgmma"
  tests="wgmma_on_hopper or wgmma_tail_split or backward_fast_rising_scores or stream_images"
  timing="bench/bwd_schedules.py"
else
  echo "usage: tune_sm90.sh fwd|bwd [variant...]" >&2
  exit 2
fi
build() {
  # The backward's dispatch sizes the workspace of the tail split: it sees the same flags.
  touch csrc/cuda/flash_"$kernel"_sm90_*.cu csrc/cuda/flash_"$kernel"_dispatch.cu
  NVCC_APPEND_FLAGS="$1" python3 setup.py build_ext --inplace >/tmp/tune_sm90_build.log 2>&1 \
    || { tail -30 /tmp/tune_sm90_build.log; exit 1; }
}
for name in ${*:-$order}; do
  [ -v "variants[$name]" ] || { echo "unknown $kernel variant: $name" >&2; exit 2; }
  echo "== $name (${variants[$name]:-defaults})"
  build "${variants[$name]}"
  # The summary line, and which tests failed (with their assertion), if any.
  python3 -m pytest tests/test_fast_kernels.py -q -p no:cacheprovider -rf -k "$tests" \
    | grep -E "^FAILED|passed|failed|error" || true
  # shellcheck disable=SC2086
  python3 "$timing" --dtypes bf16 --shapes $shapes | tail -n +3
done
build ""
