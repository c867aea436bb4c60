// FlashAttention-2 forward for Hopper (sm_90a): the tiling, copies, softmax and epilogue of
// fwd_sm80.cuh, with the two products on asynchronous warpgroup MMAs (wgmma.cuh) instead of
// mma.sync.
//
// One CTA is one warpgroup (4 warps) and computes 64 query rows of one (batch, head); with tile
// images (below) it is two warpgroups on 128 rows or three on 192. Q stays in registers (the A
// fragments, loaded with ldmatrix as in the mma.sync kernel); K and V tiles of 64 keys go through
// double-buffered shared memory (cp.async) in the swizzled layout of the mma.sync kernel, which
// is one of wgmma's own: channel-first K and token-major V are read transposed (MN-major),
// token-major K and channel-first V as they are (K-major).
//
// K and V may instead come as tile images (kKVRead != KVRead::kRows; copied first where the
// plan, plan.cpp, asks): each 64-key tile of K and V already in the order and swizzle of a
// shared stage, so that thread 0 fetches a step's tiles with one bulk copy completing an
// mbarrier, four stages deep, which every thread waits on; and the CTA is two warpgroups (128
// rows, KVRead::kTileImages2wg) that share every stage. Each CTA reads all of its head's K and
// V from L2, which at 64 rows per CTA keeps L2 busy at several TB/s on long rows; sharing the
// stages halves that. The copy pays for itself on long rows only, which is where the plan uses
// the images.
// KVRead::kTileImages3wg is the CTA shape of FlashAttention-4's Hopper forward for head dims up
// to 64: three warpgroups (192 rows, one CTA per SM, up to 168 registers) on steps of two tiles
// (128 keys; S is then 64 registers). Per SM and key it is somewhat faster than two warpgroups
// on long rows; what also changes is the last wave, and the plan weighs both
// (Sm90Fwd::image_kernel). A step's second tile may be missing at the end of a row: the
// prologue zeroes the stages, so that its keys (masked, P = 0) multiply zeros or an earlier
// tile's V (which, were it not finite, had made the output so already).
//
// Per key tile j the warpgroup issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1}, waits for
// the first, exponentiates S_j and waits for the second before packing P_j into the registers
// that product reads. ptxas places that second wait early among the exponentials (it does not
// model what the wait costs, and neither a dependency on the softmax's end nor a shared-memory
// store kept it later), so the overlap of one CTA's softmax with its own P V is small; the
// kernel relies on its 4 CTAs per SM (118-126 registers, 28 KB of shared memory; 2 CTAs at the
// 2-byte copies of odd N) to overlap one CTA's softmax with the others' MMAs.
//
// The softmax checks its max instead of taking it. The running row max moves only when it
// grows by more than 2^8 (mma_softmax::kLazyMaxSlack), which most tiles of a long row never
// make it do; so past the first tile the kernel exponentiates against the reference max it
// has, and only when a probability of a stored row comes out above 2^8 (after the bf16 / fp16
// rounding; inf and NaN included) does the warpgroup recompute S for that tile and take the
// lazy-max path (new max, rescaled O). The decision is taken by the barrier of the next step
// (__syncthreads_or), because the recomputation is a wgmma and so must be taken by all four
// warps together. That drops the max tree, its shuffles, the alpha exponentials and the
// rescale vote from the common step (about 40 of its 270 instructions per warp, 2 of its 34
// MUFU ops) and gives the same probabilities as taking the lazy max every tile, in less time.
// The three-warpgroup kernel decides per warp instead (kWarpRedo), where its barrier would
// publish no copies anyway: a warp whose rows need it recomputes their S on mma.sync
// (warp_scores, from the stage) right after packing P, so that the step has no warpgroup
// barrier at all. That measured faster for three warpgroups but not for two, so the
// two-warpgroup kernel keeps the warpgroup vote.
//
// At long rows a step is bound by its exponentials: the MUFU computes them at about two thirds
// of its rate while the products fill the tensor cores, and a warpgroup issuing its products
// waits while the others' run. The profiles, traces and GPU limits behind that, and the
// variants measured and not kept (ping-pong, S issued a step ahead, exponentials on the FMA
// pipe, offsets in the product, Q from shared memory, P V split, ...), are in
// bench/tune/sm90_experiments.md.
//
// The kernel body exists for sm_90a only; other targets compile an empty kernel that the plan
// never picks (plan.cpp: DeviceDesc::sm90_kernels, from the device and the build).
#pragma once

#include "bulk_copy.cuh"
#include "fwd_sm80.cuh"
#include "wgmma.cuh"

namespace psa_fa2 {
namespace flash_fwd_detail {

// kVecBytes: the access width of Q and out. kKVRead, kKVVecBytes: how K and V, which every CTA
// streams, are read: as rows of kKVVecBytes-wide vectors, or as tile images (KVRead in
// attention_params.h; kKVVecBytes is then 16 and unused): each 64-key tile of a head's K and V,
// in the order and swizzle of the kernel's shared stages, is then one contiguous block of global
// memory (copy_rows.cu's tiled mode) that one thread copies with a bulk copy (bulk_copy.cuh),
// which takes the copies' addressing and the cp.async waits out of the steps. The widths differ
// where the plan has K and V copied to 128-byte aligned rows or to tile images (launch.cpp
// makes the copies) and Q and out are left as they came.
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes, KVRead kKVRead, int kKVVecBytes>
struct Sm90FwdTraits : FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes> {
  using Base = FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes>;
  static constexpr bool kCF = Base::kCF;
  static_assert(kBlockM == 64, "one warpgroup of 64 query rows per CTA");
  static_assert(kDv == 64 || kDv == 32, "O += P V is wgmma m64n64k16 or m64n32k16");
  static_assert(kDk % 16 == 0, "k16 steps of Q K^T");
  static constexpr bool kKVImages = kKVRead != KVRead::kRows;
  static_assert(!kKVImages || kCF, "tile images of channel-first K and V");
  // 64-row warpgroups per CTA. With tile images, 2 or 3 (kTileImages2wg / kTileImages3wg): all
  // read each stage; each takes its lazy-max decision at its own named barrier (or each warp its
  // own, with kWarpRedo) and releases a stage through an "empty" mbarrier, which the copying
  // thread waits on before refilling it.
  static constexpr int kWarpgroups =
      kKVRead == KVRead::kTileImages3wg ? 3 : kKVRead == KVRead::kTileImages2wg ? 2 : 1;
  static constexpr int kCtaThreads = 128 * kWarpgroups;
  static constexpr bool kWarpRedo = kKVRead == KVRead::kTileImages3wg;
  static constexpr int kRowsPerCta = kBlockM * kWarpgroups;
  // Each lane's row sums of a tile, used only where the tile is not redone, are left by ptxas
  // after the redo vote, as a chain of dependent FADDs at the end of the step. With tile images
  // they are pinned among the exponentials instead (kEarlySums), the two-warpgroup kernel adding
  // them up as a tree (kSumTree), the three-warpgroup one in order: what measured fastest for
  // each. The row kernels keep the chain after the vote, where neither change gained.
  static constexpr bool kEarlySums = kKVImages;
  static constexpr bool kSumTree = kKVRead == KVRead::kTileImages2wg;
  // Tiles of 64 keys (one wgmma n64 / one 128-byte swizzle atom per row); one softmax step
  // takes kSubTiles of them: 2 with three warpgroups, else 1.
  static constexpr int kTileN = 64;
  static constexpr int kSubTiles = kKVRead == KVRead::kTileImages3wg ? 2 : 1;
  static constexpr int kBlockN = kTileN * kSubTiles;  // keys per step
  using QTile = typename Base::QTile;
  using OTile = typename Base::OTile;
  using KTile = std::conditional_t<kCF, SmemTile<kDk, kTileN>, SmemTile<kTileN, kDk>>;
  using VTile = std::conditional_t<kCF, SmemTile<kDv, kTileN>, SmemTile<kTileN, kDv>>;
  // Row copies (cp.async by every thread): Q | K stage 0 | K stage 1 | V stage 0 | V stage 1,
  // a stage being kSubTiles tiles, copied one step ahead.
  // Tile images (one bulk copy per stage): Q of each warpgroup | stage 0 .. stage kStages - 1 |
  // their "full" mbarriers | their "empty" ones; a stage being kSubTiles consecutive images
  // (K tile | V tile each), copied kStages - 2 steps ahead, since a stage is free again only
  // two steps after its keys' S (the next step's P V reads its V).
  // The output staging tiles (one per warpgroup) reuse the stages.
  static constexpr int kStages = kKVImages ? 4 : 2;
  static constexpr int kPrefetchSteps = kStages - 2;
  static constexpr int kImageTileBytes = KTile::kBytes + VTile::kBytes;
  // A step's tiles within a stage: consecutive K (V) tiles, or consecutive images.
  static constexpr int kKSubStride = kKVImages ? kImageTileBytes : KTile::kBytes;
  static constexpr int kVSubStride = kKVImages ? kImageTileBytes : VTile::kBytes;
  static constexpr int kKStageStride = kSubTiles * kKSubStride;
  static constexpr int kVStageStride = kSubTiles * kVSubStride;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kWarpgroups * QTile::kBytes;
  static constexpr int kVOffset =
      kKOffset + (kKVImages ? KTile::kBytes : kStages * kKStageStride);
  static constexpr int kStagesEnd =
      kKVImages ? kKOffset + kStages * kKStageStride : kVOffset + kStages * kVStageStride;
  static constexpr int kFullOffset = kStagesEnd;  // kStages mbarriers (tile images only)
  static constexpr int kEmptyOffset = kFullOffset + 8 * kStages;  // kStages more
  static constexpr int kBarrierBytes = kKVImages ? 2 * 8 * kStages : 0;
  static constexpr int kOOffset = kKOffset;
  static constexpr int kSmemBytes = kStagesEnd + kBarrierBytes;
  static_assert(kWarpgroups * OTile::kBytes <= kStagesEnd - kKOffset, "staging fits");
  // The swizzle atoms of the tiles (8 rows) start at multiples of 1024 bytes.
  static_assert(kKOffset % 1024 == 0 && kVOffset % 1024 == 0 && KTile::kBytes % 1024 == 0 &&
                    VTile::kBytes % 1024 == 0,
                "K / V tiles aligned to their swizzle atoms");
  // Step j's tiles are in stage j & kStageMask, at (j & kStageMask) * kKStageStride from the K
  // stage base and (j & kStageMask) * kVStageStride from the V one. (The kernel writes these
  // out: passed through a function, they made nvcc 13.0 schedule the row-copy steps
  // differently.)
  static_assert((kStages & (kStages - 1)) == 0, "a power-of-two count of stages");
  static constexpr int kStageMask = kStages - 1;
  // S = Q K^T: k = d. Channel-first K tiles are [d][key]: their columns run along n.
  using KOperand = wgmma::OperandB<KTile, !kCF>;
  // O = P V: k = key. Channel-first V tiles are [dv][key]: their columns run along k.
  using VOperand = wgmma::OperandB<VTile, kCF>;
  static_assert(KOperand::kNExtent == kTileN && VOperand::kNExtent == kDv,
                "each wgmma reads whole tiles: n = 64 keys for S, n = dv for O");
  static_assert(kKVVecBytes == kVecBytes || kKVVecBytes == 16 || kKVImages,
                "K / V as Q, on 16-byte rows or as tile images");
  // The access width the K / V row copiers are built for (unused with tile images).
  static constexpr int kKVRowVecBytes = kKVImages ? 16 : kKVVecBytes;
  // Resident CTAs per SM (__launch_bounds__): 4 (<= 128 registers; left at 3, ptxas spends
  // about 133, which is 3 CTAs per SM; at 4 it uses 118-126, no spills). The 2-byte loads of
  // K and V at odd N (32 in flight) and two tiles per step need 2 to stay free of spills. With
  // tile images: 2 CTAs of two warpgroups, or 1 of three (<= 168 registers: S of 128 keys is 64
  // of them).
  static constexpr int kMinBlocks =
      kWarpgroups == 3 ? 1 : (kSubTiles == 1 && kKVVecBytes != 2 ? 4 : 2) / kWarpgroups;
};

// Whether any of the 128 threads that meet at named barrier kId passes pred.
template <int kId>
__device__ __forceinline__ bool barrier_or(bool pred) {
  uint32_t any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbarrier.cta.red.or.pred q, %2, 128, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "n"(kId)
      : "memory");
  return any != 0;
}
// The same over warpgroup wg (0 .. kWarpgroups - 1) of the CTA, at barrier 1 + wg (0 is
// __syncthreads'). The ids are immediates: with a register id ptxas reserves all 16 barriers for
// the kernel.
template <int kWarpgroups>
__device__ __forceinline__ bool warpgroup_sync_or(int wg, bool pred) {
  if constexpr (kWarpgroups <= 2) {
    return wg == 0 ? barrier_or<1>(pred) : barrier_or<2>(pred);
  } else {
    switch (wg) {
      case 0: return barrier_or<1>(pred);
      case 1: return barrier_or<2>(pred);
      case 2: return barrier_or<3>(pred);
      default: return barrier_or<4>(pred);
    }
  }
}

// %laneid, read where it is used (volatile: not hoisted or merged with threadIdx.x % 32).
__device__ __forceinline__ int lane_id() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
  return lane;
}

template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes, KVRead kKVRead, int kKVVecBytes>
__global__ void __launch_bounds__(
    (Sm90FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes, kKVRead, kKVVecBytes>::kCtaThreads),
    (Sm90FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes, kKVRead, kKVVecBytes>::kMinBlocks))
    flash_fwd_sm90_kernel(const FwdParams params, const float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = Sm90FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes, kKVRead, kKVVecBytes>;
  constexpr int kWarpgroups = Tr::kWarpgroups;
  using QTile = typename Tr::QTile;
  using KTile = typename Tr::KTile;
  using VTile = typename Tr::VTile;
  using KOp = typename Tr::KOperand;
  using VOp = typename Tr::VOperand;
  constexpr bool kCF = Tr::kCF;
  constexpr int kKSteps = kDk / 16;      // k16 steps of S = Q K^T
  constexpr int kBlockN = Tr::kBlockN;   // keys per step
  constexpr int kSub = Tr::kSubTiles;    // 64-key tiles per step
  constexpr int kTileN = Tr::kTileN;
  constexpr int kSTiles = kBlockN / 8;   // n8 blocks of S per warp
  constexpr int kPVSteps = kBlockN / 16; // k16 steps of O += P V
  constexpr int kOTiles = kDv / 8;       // n8 blocks of O per warp

  // Named apart from the mma.sync kernel's (128-byte aligned) array, with which it may share a
  // translation unit (bench/tune/tune_fwd.cu).
  extern __shared__ __align__(1024) unsigned char sm90_smem[];
  unsigned char* const smem = sm90_smem;
  const uint32_t smem_base = smem_u32(smem);
  const int tid = threadIdx.x;                           // in the CTA
  const int wg = kWarpgroups == 1 ? 0 : tid / 128;       // this thread's warpgroup
  const uint32_t sQ = smem_base + Tr::kQOffset + wg * QTile::kBytes;
  const uint32_t sK = smem_base + Tr::kKOffset;
  const uint32_t sV = smem_base + Tr::kVOffset;
  // The swizzle atoms must be where wgmma expects them; a misplaced window would give wrong
  // products, so fail loudly instead (the runtime has always placed it at a multiple of 1 KB).
  if (smem_base % 1024 != 0) __trap();

  const int wtid = kWarpgroups == 1 ? tid : tid % 128;  // in the warpgroup
  const int warp = wtid / 32;  // in the warpgroup: it owns rows 16 warp .. of the warpgroup's
  const int lane = tid % 32;
  const int t = lane % 4;

  const int N = params.seqlen;
  const int bh = blockIdx.y;
  const int b = bh / params.heads;
  const int h = bh % params.heads;
  const int m0 = blockIdx.x * Tr::kRowsPerCta + wg * kBlockM;  // this warpgroup's rows

  const int n_tiles = (N + kBlockN - 1) / kBlockN;
  const TileSources<Tr, kVecBytes, Tr::kKVRowVecBytes> src(params, b, h, wtid);
  // Row copies: step j's keys into stage j % 2; the range checks only where the step reaches N.
  auto copy_tiles = [&](const auto& copier, uint32_t stage, int tile_bytes, const uint16_t* head,
                        int64_t rs, int j) {
    const bool full = (j + 1) * kBlockN <= N;
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      const int n0 = j * kBlockN + u * kTileN;
      const uint32_t dst = stage + u * tile_bytes;
      if (full) {
        copier.copy_full(dst, src.at(head, rs, n0));
      } else {
        copier.copy(dst, src.at(head, rs, n0), N - n0);
      }
    }
  };
  auto copy_k = [&](int j) {
    copy_tiles(src.k_copier, sK + (j & Tr::kStageMask) * Tr::kKStageStride, KTile::kBytes, src.k,
               src.k_rs, j);
  };
  auto copy_v = [&](int j) {
    copy_tiles(src.v_copier, sV + (j & Tr::kStageMask) * Tr::kVStageStride, VTile::kBytes, src.v,
               src.v_rs, j);
  };
  // Tile images: thread 0 copies tile j (K then V, as the stage holds them) into stage
  // j % kStages, whose barrier every thread waits on before its wgmmas read the tile.
  const uint32_t full_bars = smem_base + Tr::kFullOffset;
  const uint32_t empty_bars = smem_base + Tr::kEmptyOffset;
  const int n_images = (N + kTileN - 1) / kTileN;  // of this head
  const unsigned char* const images =
      static_cast<const unsigned char*>(params.k.ptr) +
      static_cast<int64_t>(bh) * n_images * Tr::kImageTileBytes;
  // Step j's images, kSub of them but at the last step, whose missing one leaves the zeros of
  // the prologue or an earlier tile in the stage (its keys are masked).
  auto copy_image = [&](int j) {
    const int count = kSub == 1 || n_images - j * kSub >= kSub ? kSub : n_images - j * kSub;
    bulk_copy::copy_block(sK + (j & Tr::kStageMask) * Tr::kKStageStride,
                          images + static_cast<int64_t>(j) * kSub * Tr::kImageTileBytes,
                          count * Tr::kImageTileBytes, full_bars + 8 * (j & Tr::kStageMask));
  };
  auto wait_image = [&](int j) {
    bulk_copy::wait(full_bars + 8 * (j & Tr::kStageMask), (j / Tr::kStages) & 1);
  };
  // Tile j goes into its stage once every warp of the CTA has released the stage's
  // previous tile, j - kStages (release_image).
  auto wait_stage_free = [&](int j) {
    if (j >= Tr::kStages) {
      bulk_copy::wait(empty_bars + 8 * (j & Tr::kStageMask), ((j / Tr::kStages) & 1) ^ 1);
    }
  };
  // A warp that only ran wgmmas on a stage (the async proxy, done once their wait returns)
  // releases it with one arrival, from lane 0. With kWarpRedo a stage's empty barrier counts
  // 32 arrivals per warp instead: lane 0 makes all 32 at once, but a warp that also read the
  // stage on mma.sync (the redo's ldmatrix, whose lanes read for each other) arrives from every
  // lane, each after its own reads, so that each read is ordered before the bulk copy that
  // refills the stage. (Lane 0 arriving for all after a __syncwarp is ordered too, but
  // compute-sanitizer's racecheck does not follow that chain and reports the reads.)
  constexpr uint32_t kArrivalsPerWarp = Tr::kWarpRedo ? 32 : 1;
  bool warp_read_stage = false;  // kWarpRedo: this warp redid the tile it releases next
  auto release_image = [&](int j) {
    const uint32_t bar = empty_bars + 8 * (j & Tr::kStageMask);
    if constexpr (Tr::kWarpRedo) {
      if (warp_read_stage) {
        bulk_copy::arrive(bar, 1);
        warp_read_stage = false;
      } else if (lane == 0) {
        bulk_copy::arrive(bar, kArrivalsPerWarp);
      }
    } else if (lane == 0) {
      bulk_copy::arrive(bar);
    }
  };

  if constexpr (Tr::kKVImages) {
    // Prologue: the barriers, then Q, and the images of the first kPrefetchSteps + 1 tiles.
    if (tid == 0) {
#pragma unroll
      for (int i = 0; i < Tr::kStages; ++i) {
        bulk_copy::init_barrier(full_bars + 8 * i, 1);
        bulk_copy::init_barrier(empty_bars + 8 * i, kArrivalsPerWarp * 4 * kWarpgroups);
      }
      bulk_copy::fence_barrier_init();
    }
    if constexpr (kSub > 1) {
      // Zeros in every stage, for the images missing from the last step: 0 * V stays 0.
      for (int i = tid; i < Tr::kStages * Tr::kKStageStride / 16; i += Tr::kCtaThreads) {
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(sK + 16 * i), "r"(0)
                     : "memory");
      }
      wgmma::fence_proxy_async_shared();  // ordered before the bulk copies that overwrite them
    }
    // A warpgroup wholly past N (in the last CTA) copies zeros from a valid address.
    const bool any_rows = m0 < N;
    src.q_copier.copy(sQ, src.q_at(any_rows ? m0 : 0), any_rows ? N - m0 : 0);
    cp_async_commit();
    __syncthreads();  // the barriers are initialised
    if (tid == 0) {
      for (int j = 0; j <= Tr::kPrefetchSteps && j < n_tiles; ++j) copy_image(j);
    }
    cp_async_wait<0>();
    __syncthreads();  // Q landed
    wait_image(0);
  } else {
    // Prologue: Q and K tile 0 first; K tile 1 and V tile 0 arrive while S_0 is computed.
    src.q_copier.copy(sQ, src.q_at(m0), N - m0);
    copy_k(0);
    cp_async_commit();
    if (n_tiles > 1) copy_k(1);
    copy_v(0);
    cp_async_commit();
    cp_async_wait<1>();
    wgmma::fence_proxy_async_shared();
    __syncthreads();
  }

  // Q fragments (A operand, 16 rows of this warp x kDk), as in the mma.sync kernel.
  uint32_t qf[kKSteps][4];
  load_a_fragments<QTile, kCF>(qf, sQ, warp, lane);

  const uint64_t k_desc = KOp::descriptor(sK);
  const uint64_t v_desc = VOp::descriptor(sV);
  // S = Q K_j^T into s (previous contents dropped): one n64 product per 64-key tile.
  auto issue_s = [&](float (&s)[kSTiles][4], int j) {
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      const uint64_t desc =
          k_desc + KOp::advance((j & Tr::kStageMask) * Tr::kKStageStride + u * Tr::kKSubStride);
      auto& su = *reinterpret_cast<float(*)[kTileN / 8][4]>(&s[u * kTileN / 8]);
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        const uint64_t dk = desc + KOp::advance(kk * KOp::kKStepBytes);
        if (kk == 0) {
          wgmma::mma_m64n64k16<kDtype, false, KOp::kTranspose>(su, qf[kk], dk);
        } else {
          wgmma::mma_m64n64k16<kDtype, true, KOp::kTranspose>(su, qf[kk], dk);
        }
      }
    }
    wgmma::commit_group();
  };
  // O += P V_j.
  auto issue_pv = [&](float (&o)[kOTiles][4], const uint32_t (&pf)[kPVSteps][4], int j) {
    constexpr int kStepsPerTile = kTileN / 16;
#pragma unroll
    for (int kk = 0; kk < kPVSteps; ++kk) {
      const int stage_bytes = (j & Tr::kStageMask) * Tr::kVStageStride;
      const uint32_t step_bytes =
          (kk / kStepsPerTile) * Tr::kVSubStride + (kk % kStepsPerTile) * VOp::kKStepBytes;
      uint64_t desc;
      if constexpr (Tr::kKVImages) {
        // The stage's descriptor plus each step's constant: nvcc 13.0 shifts the sum of the two
        // for every step otherwise (13 more uniform instructions per step). The row-copy
        // instantiations keep the single sum, the form their schedule was tuned with.
        desc = v_desc + VOp::advance(stage_bytes) + VOp::advance(step_bytes);
      } else {
        desc = v_desc + VOp::advance(stage_bytes + step_bytes);
      }
      wgmma::mma_m64k16<kDv, kDtype, true, VOp::kTranspose>(o, pf[kk], desc);
    }
    wgmma::commit_group();
  };
  auto pack_p = [&](const float (&s)[kSTiles][4], uint32_t (&pf)[kPVSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kPVSteps; ++kk) pack_a_fragment<kDtype>(pf[kk], s, kk);
  };
  // Whether a packed probability of this thread's stored rows (rows past N, whose Q may be
  // anything, do not count) is above 2^kLazyMaxSlack, inf or NaN. A tree of 16-bit maxima over
  // the bit patterns, which order like the values (all are >= +0). pf[kk][0] and pf[kk][2]
  // hold row g, pf[kk][1] and pf[kk][3] row g + 8.
  const bool row_g_stored = m0 + warp * 16 + lane / 4 < N;
  const bool row_g8_stored = m0 + warp * 16 + lane / 4 + 8 < N;
  auto above_slack = [&](const uint32_t (&pf)[kPVSteps][4]) {
    constexpr uint32_t kLimit = kDtype == DType::kBFloat16 ? 0x4380u : 0x5C00u;  // 2^8
    static_assert(mma_softmax::kLazyMaxSlack == 8.f, "kLimit is 2^8");
    uint32_t m[2][2 * kPVSteps];  // [row g / g + 8][register]
#pragma unroll
    for (int kk = 0; kk < kPVSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m[r][2 * kk] = pf[kk][r];
        m[r][2 * kk + 1] = pf[kk][r + 2];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int w = 1; w < 2 * kPVSteps; w *= 2) {
#pragma unroll
        for (int i = 0; i + w < 2 * kPVSteps; i += 2 * w) {
          asm("max.u16x2 %0, %0, %1;\n" : "+r"(m[r][i]) : "r"(m[r][i + w]));
        }
      }
    }
    auto above = [](uint32_t x) { return (x & 0xffffu) > kLimit || (x >> 16) > kLimit; };
    return (row_g_stored && above(m[0][0])) || (row_g8_stored && above(m[1][0]));
  };

  float s[kSTiles][4];
  float o[kOTiles][4];
#pragma unroll
  for (int i = 0; i < kOTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
  float alpha[2];
  // The exponentials' offsets (-(the rows' reference max)), this lane's row sums of the last
  // tile and whether that tile must be redone, which the next barrier (or, with kWarpRedo, the
  // warp itself) settles.
  float neg_m[2];
  float sums[2] = {0.f, 0.f};
  bool above = false;

  wgmma::fence();
  issue_s(s, 0);
  wgmma::wait_group<0>();
  wgmma::pin(s);
  mma_softmax::mask_keys_from(s, 0, N, t);
  mma_softmax::softmax_probabilities<kSTiles, false, Tr::kSumTree>(s, row_max, row_sum,
                                                                  scale_log2, alpha);  // o = 0

  uint32_t pf[kPVSteps][4];
  // The reference max: the first tile's. The steps pack P as they finish.
  auto set_offsets = [&] {
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_m[r] = row_max[r] == -INFINITY ? 0.f : -row_max[r];
  };
  set_offsets();
  pack_p(s, pf);
  // Tile i's scores, in s, through the lazy-max path: a new max where it grew by more than the
  // slack, O rescaled, P packed again.
  auto take_lazy_max = [&](int i, auto is_last) {
    if constexpr (decltype(is_last)::value) mma_softmax::mask_keys_past(s, i * kBlockN, N, t);
    mma_softmax::softmax_probabilities<kSTiles, true, Tr::kSumTree>(s, row_max, row_sum,
                                                                    scale_log2, alpha);
    set_offsets();
    mma_softmax::rescale_rows(o, alpha);
    pack_p(s, pf);
  };
  auto count_sums = [&] {
    row_sum[0] += sums[0];
    row_sum[1] += sums[1];
  };
  // Every wgmma reads what other threads copied: the copies in flight (K tile i + 1, V tile i)
  // must have landed (cp.async wait), be made visible to the async proxy and be published by a
  // barrier. That barrier also decides, for the whole warpgroup (the wgmmas are
  // warpgroup-wide), whether tile i (the last one exponentiated) must be redone: then S_i again
  // (K_i is still in its stage: the copies that refill it come after this), the lazy-max path
  // and O (which holds the products of the tiles before i) rescaled. Else its sums count.
  // (With kWarpRedo the warps decide at the end of each step instead: redo_warp_rows.)
  auto settle_tile = [&](int i, auto is_last) {
    if constexpr (Tr::kWarpRedo) return;
    if constexpr (!Tr::kKVImages) {
      cp_async_wait<0>();
      wgmma::fence_proxy_async_shared();
    }
    const bool redo = kWarpgroups == 1 ? __syncthreads_or(above)
                                       : warpgroup_sync_or<kWarpgroups>(wg, above);
    if (!redo) {
      count_sums();
      return;
    }
    wgmma::fence();
    issue_s(s, i);
    wgmma::wait_group<0>();
    wgmma::pin(s);
    take_lazy_max(i, is_last);
  };
  // kWarpRedo: with tile images nothing else needs the warpgroup's warps together at the
  // step's start, so each warp decides for its own 16 rows as soon as it has packed P_j, and
  // redoes them on mma.sync (the products are warpgroup-wide): S_j of its rows again from the
  // stage (which the warp releases only in the next step), the lazy-max path, its rows of O
  // (every product before P_j V_j has landed) rescaled. A row's probabilities are those of the
  // warpgroup-wide redo; only S_j's rounding may differ, mma.sync summing its k16 steps its own
  // way.
  auto redo_warp_rows = [&](int j, auto is_last) {
    if (!__any_sync(0xffffffffu, above)) {
      count_sums();
      return;
    }
    // The lane index read again here keeps ptxas from computing this rare path's ldmatrix
    // addresses ahead of the loop, where they took registers (and spilled, at 168).
    const int lane_here = lane_id();
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      auto& su = *reinterpret_cast<float(*)[kTileN / 8][4]>(&s[u * kTileN / 8]);
      warp_scores<KTile, kCF, kDtype>(
          su, qf, sK + (j & Tr::kStageMask) * Tr::kKStageStride + u * Tr::kKSubStride,
          lane_here);
    }
    // Those were generic-proxy reads of a stage that a bulk copy (the async proxy) refills once
    // the warp has released it: ordered before that release, which every lane makes.
    wgmma::fence_proxy_async_shared();
    warp_read_stage = true;
    take_lazy_max(j, is_last);
  };
  // Tile j >= 1. Only the last tile can be partial; the others take no branch between issue and
  // wait, which ptxas would otherwise answer by waiting for every product at the branch.
  auto tile_step = [&](int j, auto is_last) {
    constexpr bool kLast = decltype(is_last)::value;
    // Row copies: K tile j and V tile j-1 landed; every thread is past tile j-1's products, so
    // K stage (j+1) % 2 and V stage j % 2 may be refilled.
    settle_tile(j - 1, std::false_type{});
    if constexpr (Tr::kKVImages) {
      // Every thread is past tile j - 2's P V (this warpgroup's: the barrier above, or with
      // kWarpRedo the empty barrier; the others': the empty barrier): its stage takes tile
      // j + kPrefetchSteps.
      if (tid == 0 && j + Tr::kPrefetchSteps < n_tiles) {
        wait_stage_free(j + Tr::kPrefetchSteps);
        copy_image(j + Tr::kPrefetchSteps);
      }
      wait_image(j);
    } else {
      if constexpr (!kLast) copy_k(j + 1);
      copy_v(j);
      cp_async_commit();
    }

    wgmma::pin(o);
    wgmma::fence();
    issue_s(s, j);
    issue_pv(o, pf, j - 1);
    // S_j landed; P_{j-1} V_{j-1} may still be in flight.
    wgmma::wait_group<1>();
    wgmma::pin(s);
    if constexpr (kLast) mma_softmax::mask_keys_past(s, j * kBlockN, N, t);
    mma_softmax::exponentiate<kSTiles, Tr::kSumTree>(s, neg_m, scale_log2, sums);
    if constexpr (Tr::kEarlySums) asm volatile("" : "+f"(sums[0]), "+f"(sums[1]));
    wgmma::wait_group<0>();  // P_{j-1} V_{j-1} is done with pf
    wgmma::pin(o);
    wgmma::pin(pf);
    if constexpr (Tr::kKVImages) release_image(j - 1);  // its S was redone, if at all, above
    pack_p(s, pf);
    above = above_slack(pf);
    if constexpr (Tr::kWarpRedo) redo_warp_rows(j, is_last);
  };
  for (int j = 1; j + 1 < n_tiles; ++j) tile_step(j, std::false_type{});
  if (n_tiles > 1) tile_step(n_tiles - 1, std::true_type{});

  // The last tile's P V.
  settle_tile(n_tiles - 1, std::true_type{});
  wgmma::pin(o);
  wgmma::fence();
  issue_pv(o, pf, n_tiles - 1);
  wgmma::wait_group<0>();
  wgmma::pin(o);
  // Every thread is done reading K / V, which the output staging tiles reuse.
  __syncthreads();
  if constexpr (kWarpgroups == 1) {
    store_out_lse<Tr, kDtype, kVecBytes>(params, o, row_max, row_sum, smem, bh, m0);
  } else {
    store_out_lse<Tr, kDtype, kVecBytes>(params, o, row_max, row_sum,
                                         smem + Tr::kOOffset + wg * Tr::OTile::kBytes, bh, m0,
                                         wtid);
  }
#endif
}

}  // namespace flash_fwd_detail

// Instantiated in instances/sm90_fwd_*.cu (generate_instances.py), declared in launchers.h.
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes, KVRead kKVRead,
          int kKVVecBytes>
void launch_fwd_sm90(const FwdParams& params, cudaStream_t stream) {
  using namespace flash_fwd_detail;
  launch_row_tiles<Sm90FwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes, kKVRead, kKVVecBytes>,
                   flash_fwd_sm90_kernel<kDtype, kDk, kDv, kLayout, kVecBytes, kKVRead, kKVVecBytes>>(
      params, stream);
}

}  // namespace psa_fa2
