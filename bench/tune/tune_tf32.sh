#!/usr/bin/env bash
# Builds and times the TF32 forward kernel's compile-time variants (needs a GPU and nvcc):
#   bash bench/tune/tune_tf32.sh [arch, default 90]
set -euo pipefail
cd "$(dirname "$0")"
arch=${1:-90}
declare -A variants=(
  [default]=""
  [block_n32]="-DPSA_FA2_TF32_BLOCK_N=32"
  [min_blocks1]="-DPSA_FA2_TF32_MIN_BLOCKS=1"
  [block_n128_min_blocks1]="-DPSA_FA2_TF32_BLOCK_N=128 -DPSA_FA2_TF32_MIN_BLOCKS=1"
)
for name in "${!variants[@]}"; do
  nvcc -std=c++17 -O3 -arch=sm_$arch ${variants[$name]} tune_tf32.cu -o "/tmp/tune_tf32_$name" &
done
wait
for name in default block_n32 min_blocks1 block_n128_min_blocks1; do
  echo "== $name (${variants[$name]:-defaults})"
  "/tmp/tune_tf32_$name"
done
