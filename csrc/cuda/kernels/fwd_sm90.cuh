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
// kernel relies on its 4 CTAs per SM (107-128 registers, 28 KB of shared memory; 2 CTAs at the
// 2-byte copies of odd N) to overlap one CTA's softmax with the others' MMAs.
//
// The softmax takes each row's exact running max on every tile (mma_softmax::
// softmax_probabilities), so a row's largest probability so far is exactly 1 and stays exact
// when P is rounded to bf16 / fp16 for P V. O is rescaled only where some row of the warp moved
// its max (alpha is exactly 1 elsewhere). An earlier version skipped the max (exponentiating
// against the first tile's, redoing a tile whose probabilities passed 2^8): 2-10% faster
// forwards, but probabilities up to 2^8 lost bits in that rounding and the output error doubled
// at head dim 32 (docs/numerics.md).
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
  // read each stage, and each warp releases a stage through an "empty" mbarrier, which the
  // copying thread waits on before refilling it.
  static constexpr int kWarpgroups =
      kKVRead == KVRead::kTileImages3wg ? 3 : kKVRead == KVRead::kTileImages2wg ? 2 : 1;
  static constexpr int kCtaThreads = 128 * kWarpgroups;
  static constexpr int kRowsPerCta = kBlockM * kWarpgroups;
  // Each lane's row sums of a tile: a tree of FADDs in the two-warpgroup image kernel, a chain
  // in the others (mma_softmax::exponentiate_row), as measured fastest for each.
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
  // about 133, which is 3 CTAs per SM; at 4 it uses 107-128, no spills). The 2-byte loads of
  // K and V at odd N (32 in flight) and two tiles per step need 2 to stay free of spills. With
  // tile images: 2 CTAs of two warpgroups, or 1 of three (<= 168 registers: S of 128 keys is 64
  // of them).
  static constexpr int kMinBlocks =
      kWarpgroups == 3 ? 1 : (kSubTiles == 1 && kKVVecBytes != 2 ? 4 : 2) / kWarpgroups;
};

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
  // A warp reads a stage only through wgmmas (the async proxy, done once their wait returns),
  // so it releases the stage with one arrival, from lane 0.
  auto release_image = [&](int j) {
    if (lane == 0) bulk_copy::arrive(empty_bars + 8 * (j & Tr::kStageMask));
  };

  if constexpr (Tr::kKVImages) {
    // Prologue: the barriers, then Q, and the images of the first kPrefetchSteps + 1 tiles.
    if (tid == 0) {
#pragma unroll
      for (int i = 0; i < Tr::kStages; ++i) {
        bulk_copy::init_barrier(full_bars + 8 * i, 1);
        bulk_copy::init_barrier(empty_bars + 8 * i, 4 * kWarpgroups);
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
  float s[kSTiles][4];
  float o[kOTiles][4];
#pragma unroll
  for (int i = 0; i < kOTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
  float alpha[2];

  wgmma::fence();
  issue_s(s, 0);
  wgmma::wait_group<0>();
  wgmma::pin(s);
  mma_softmax::mask_keys_from(s, 0, N, t);
  mma_softmax::softmax_probabilities<kSTiles, false, Tr::kSumTree>(s, row_max, row_sum,
                                                                  scale_log2, alpha);  // o = 0

  uint32_t pf[kPVSteps][4];
  pack_p(s, pf);
  // Row copies: every wgmma reads what other threads copied, so the copies in flight (K tile
  // j + 1, V tile j) must have landed (cp.async wait), be made visible to the async proxy and
  // be published by a barrier. Tile images need none of it: each thread waits on the stage's
  // mbarrier itself.
  auto publish_copies = [&] {
    if constexpr (!Tr::kKVImages) {
      cp_async_wait<0>();
      wgmma::fence_proxy_async_shared();
      __syncthreads();
    }
  };
  // Tile j >= 1. Only the last tile can be partial; the others take no branch between issue and
  // wait, which ptxas would otherwise answer by waiting for every product at the branch.
  auto tile_step = [&](int j, auto is_last) {
    constexpr bool kLast = decltype(is_last)::value;
    // Row copies: K tile j and V tile j-1 landed; every thread is past tile j-1's products, so
    // K stage (j+1) % 2 and V stage j % 2 may be refilled.
    publish_copies();
    if constexpr (Tr::kKVImages) {
      // Once every warp is past tile j - 2's P V (the stage's empty barrier), its stage takes
      // tile j + kPrefetchSteps.
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
    mma_softmax::softmax_probabilities<kSTiles, false, Tr::kSumTree>(s, row_max, row_sum,
                                                                    scale_log2, alpha);
    wgmma::wait_group<0>();  // P_{j-1} V_{j-1} is done with pf, and O may be rescaled
    wgmma::pin(o);
    wgmma::pin(pf);
    if constexpr (Tr::kKVImages) release_image(j - 1);
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
      mma_softmax::rescale_rows(o, alpha);
    pack_p(s, pf);
  };
  for (int j = 1; j + 1 < n_tiles; ++j) tile_step(j, std::false_type{});
  if (n_tiles > 1) tile_step(n_tiles - 1, std::true_type{});

  // The last tile's P V.
  publish_copies();
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
