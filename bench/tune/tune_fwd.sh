#!/usr/bin/env bash
# Builds and times the forward kernel's compile-time variants (needs a GPU and nvcc):
#   bash bench/tune/tune_fwd.sh [arch, default 90]
set -euo pipefail
cd "$(dirname "$0")"
arch=${1:-90}
declare -A variants=(
  [default]=""
  [min_blocks2]="-DPSA_FA2_FWD_MIN_BLOCKS=2"
  [block_n128_min_blocks2]="-DPSA_FA2_FWD_BLOCK_N=128 -DPSA_FA2_FWD_MIN_BLOCKS=2"
  [block_m128_min_blocks1]="-DPSA_FA2_FWD_BLOCK_M=128 -DPSA_FA2_FWD_MIN_BLOCKS=1"
  [block_m128_min_blocks2]="-DPSA_FA2_FWD_BLOCK_M=128 -DPSA_FA2_FWD_MIN_BLOCKS=2"
)
for name in "${!variants[@]}"; do
  nvcc -std=c++17 -O3 -arch=sm_$arch ${variants[$name]} tune_fwd.cu -o "/tmp/tune_fwd_$name" &
done
wait
for name in default min_blocks2 block_n128_min_blocks2 block_m128_min_blocks1 block_m128_min_blocks2; do
  echo "== $name (${variants[$name]:-defaults})"
  "/tmp/tune_fwd_$name"
done
