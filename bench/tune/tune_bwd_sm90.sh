#!/usr/bin/env bash
# Times compile-time variants of the Hopper (wgmma) backward through the extension (needs a
# Hopper GPU, nvcc and the build's torch), from the project root:
#   bash bench/tune/tune_bwd_sm90.sh [shapes...]   (default 16x4x400 16x4x1600 8x4x6400 1x2x62500)
# Each variant rebuilds the flash_bwd_sm90_*.cu files with its -D flags (NVCC_APPEND_FLAGS; the
# touch makes ninja rebuild them), runs the wgmma backward's tests on it (their summary line),
# then bench/bwd_schedules.py, bf16; the last build is the default one again, so the tree is
# left as it was.
set -euo pipefail
cd "$(dirname "$0")/../.."
shapes=${*:-16x4x400 16x4x1600 8x4x6400 1x2x62500}
declare -A variants=(
  [default]=""
  [three_stages]="-DPSA_FA2_BWD90_STAGES=3"
  [early_lse]="-DPSA_FA2_BWD90_EARLY_LSE=1"
  [two_dq_chains]="-DPSA_FA2_BWD90_DQ_CHAINS=2"
  [all_three]="-DPSA_FA2_BWD90_STAGES=3 -DPSA_FA2_BWD90_EARLY_LSE=1 -DPSA_FA2_BWD90_DQ_CHAINS=2"
  [dq_wgmma]="-DPSA_FA2_BWD90_DQ_WGMMA=1"
)
build() {
  touch csrc/cuda/flash_bwd_sm90_*.cu
  NVCC_APPEND_FLAGS="$1" python3 setup.py build_ext --inplace >/tmp/tune_bwd_sm90_build.log 2>&1 \
    || { tail -30 /tmp/tune_bwd_sm90_build.log; exit 1; }
}
for name in default dq_wgmma three_stages early_lse two_dq_chains all_three; do
  echo "== $name (${variants[$name]:-defaults})"
  build "${variants[$name]}"
  python3 -m pytest tests/test_fast_kernels.py -q -p no:cacheprovider -k wgmma_on_hopper | tail -1 || true
  # shellcheck disable=SC2086
  python3 bench/bwd_schedules.py --dtypes bf16 --shapes $shapes | tail -n +3
done
build ""
