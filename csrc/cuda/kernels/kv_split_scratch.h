// The fp32 forward's key-split scratch (FwdParams::kv_splits, kv_split_scratch), laid out in
// one place for the host that sizes it and the kernels that fill and combine it. In floats:
// first every split's normalized output, [split][batch * heads][dv][N], then every split's row
// sums as log2 of sum_j 2^(s_j * scale log2 e), [split][batch * heads][N].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../attention_params.h"

namespace psa_fa2 {

struct KvSplitScratch {
  int64_t rows;    // of one split: B * H * N
  int64_t seqlen;  // N
  int64_t dv;
  int64_t splits;

  __host__ __device__ KvSplitScratch(const FwdParams& p, int kv_splits)
      : rows(int64_t(p.batch) * p.heads * p.seqlen),
        seqlen(p.seqlen),
        dv(p.head_dim_v),
        splits(kv_splits) {}

  __host__ __device__ int64_t floats() const { return splits * rows * (dv + 1); }
  // Split s's log2 row sum of row n of (batch, head) bh.
  __host__ __device__ int64_t lse2_at(int64_t s, int64_t bh, int64_t n) const {
    return (splits * dv + s) * rows + bh * seqlen + n;
  }
  // Split s's output of row n of (batch, head) bh, channel 0; the channels are N apart.
  __host__ __device__ int64_t out_at(int64_t s, int64_t bh, int64_t n) const {
    return (s * rows + bh * seqlen) * dv + n;
  }
};

}  // namespace psa_fa2
