#!/usr/bin/env bash
# NOTE: runs against the tree of commit 28fac21 only (`git checkout 28fac21`, or a worktree of
# it): the last with the compile-time variants (the PSA_FA2_* macros below) and the old
# csrc/cuda file layout. The current tree has neither; this is not ported to it
# (bench/tune/README.md lists what runs there).
# Builds and times the fast forward kernels' compile-time variants (needs a GPU and nvcc):
#   bash bench/tune/tune_fwd.sh [bf16|sm90|sm90img|sm90img3|tf32] [arch, default 90; the sm90
#   kinds build for 90a; the image kinds time the tile-image kernels, with the warpgroup vote
#   and with the per-warp redo]
set -euo pipefail
cd "$(dirname "$0")"
kernel=${1:-bf16}
arch=${2:-90}
declare -A variants
if [ "$kernel" = tf32 ]; then
  variants=(
    [default]=""
    [block_n32]="-DPSA_FA2_TF32_BLOCK_N=32"
    [min_blocks1]="-DPSA_FA2_TF32_MIN_BLOCKS=1"
    [block_n128_min_blocks1]="-DPSA_FA2_TF32_BLOCK_N=128 -DPSA_FA2_TF32_MIN_BLOCKS=1"
  )
  order="default block_n32 min_blocks1 block_n128_min_blocks1"
elif [ "$kernel" = sm90img ] || [ "$kernel" = sm90img3 ]; then
  arch=90a
  variants=([default]="" [vote]="-DPSA_FA2_SM90_WARP_REDO=0" [warp_redo]="-DPSA_FA2_SM90_WARP_REDO=1")
  order="default vote warp_redo"
elif [ "$kernel" = sm90 ]; then
  arch=90a
  variants=(
    [default]=""
    [min_blocks3]="-DPSA_FA2_SM90_MIN_BLOCKS=3"
    [min_blocks2]="-DPSA_FA2_SM90_MIN_BLOCKS=2"
    [sub_tiles2]="-DPSA_FA2_SM90_SUB_TILES=2"
  )
  order="default min_blocks3 min_blocks2 sub_tiles2"
else
  variants=(
    [default]=""
    [min_blocks2]="-DPSA_FA2_FWD_MIN_BLOCKS=2"
    [block_n128_min_blocks2]="-DPSA_FA2_FWD_BLOCK_N=128 -DPSA_FA2_FWD_MIN_BLOCKS=2"
    [block_m128_min_blocks1]="-DPSA_FA2_FWD_BLOCK_M=128 -DPSA_FA2_FWD_MIN_BLOCKS=1"
    [block_m128_min_blocks2]="-DPSA_FA2_FWD_BLOCK_M=128 -DPSA_FA2_FWD_MIN_BLOCKS=2"
  )
  order="default min_blocks2 block_n128_min_blocks2 block_m128_min_blocks1 block_m128_min_blocks2"
fi
for name in $order; do
  nvcc -std=c++17 -O3 -arch=sm_$arch ${variants[$name]} tune_fwd.cu ../../csrc/cuda/copy_rows.cu \
    -o "/tmp/tune_fwd_${kernel}_$name" &
done
wait
for name in $order; do
  echo "== $kernel $name (${variants[$name]:-defaults})"
  "/tmp/tune_fwd_${kernel}_$name" "$kernel"
done
