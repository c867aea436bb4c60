// FlashAttention-2 backward for Hopper (sm_90a), schedule (a) of bwd_sm80.cuh on asynchronous
// warpgroup MMAs (wgmma.cuh).
//
// One CTA owns 128 keys of one (batch, head) and is two warpgroups, each owning 64 of them: their
// K and V rows stay in registers as wgmma A fragments, their dK and dV accumulate in registers.
// The CTA streams the Q, dO, lse and D of 64 query rows per step through a ring of five stages
// in shared memory (cp.async into the swizzled tiles of fwd_sm80.cuh, which wgmma reads as they
// are: a step's rows are requested four steps ahead). Per step, for its 64 keys, each
// warpgroup computes
//   S^T  = K Q^T,  dP^T = V dO^T                 (wgmma, A = K / V registers, B = Q / dO tile)
//   P^T  = exp2(S^T * scale log2 e - lse log2 e),  dS^T = P^T o (dP^T - D)
//   dV  += P^T dO,  dK += dS^T Q                  (wgmma, A = P^T / dS^T registers: the
//                                                  accumulator of S^T is their A fragment)
// and writes dS^T to shared memory. While dV and dK are in flight the CTA's 8 warps compute
// dQ (64 rows x dk) = dS K over all 128 keys with mma.sync (dS is read transposed, which
// ldmatrix.trans does and a register-A wgmma cannot) and add it to the fp32 dQ workspace with
// vector reductions, as the mma.sync kernel does. The preprocess (D, workspace zeroing), the
// dQ conversion and the dK / dV epilogue are that kernel's. The key tiles of a launch's last,
// partial wave are each shared by several CTAs, each streaming a run of the query rows
// (bwd_tail_split.h); they sum their dK / dV in the workspace before the epilogue.
//
// Where the plan (plan.cpp) has Q and dO copied to stream images (stream_tile_images.h;
// kStreamRead == StreamRead::kStreamImages), thread 0 instead fetches each step's Q, dO, lse
// and D with three bulk copies that complete the stage's "full" mbarrier, which every thread
// waits on before the step; the CTA barrier of each step still orders the stage's reads before
// its refill. That takes the copy addressing and cp.async out of the steps (about 100 of some
// 560 instructions per warp and step in the SASS), which alone gained little; what it gains is
// the registers it frees, with which these instances also compute dQ on wgmma (kDQWgmma,
// below: each warpgroup 16 of dQ's columns over all 128 keys, A = dS from a 128-byte swizzled
// dS^T tile), clearly faster. The row instances keep dQ on mma.sync, where wgmma was slower.
// Copy included, the images pay where Q and dO would be copied anyway and on long rows, which
// is where the plan uses them (measurements: docs/design.md, bench/tune/sm90_experiments.md).
//
// The kernel is latency-bound (one CTA of 8 warps per SM; Nsight Compute has the tensor pipe
// about a third busy and an instruction issued every 3 cycles per scheduler), so it spends its
// spare registers (up to 255 at one CTA per SM) and shared memory on shorter steps; each of
// these measured faster:
//   - Each warp keeps the K operand of dQ (the same every step, 32 registers) from the
//     prologue on, which takes 8 of the 16 ldmatrix off each step's dQ.
//   - One CTA barrier per step: the one that publishes both warpgroups' dS^T also publishes
//     the next step's rows, which the stage ring (three stages or more; the refilled stage is
//     the previous step's) and two dS^T buffers (the next step writes one while this step's
//     dQ reads the other) allow.
//   - lse and D read before the scores' wgmmas are issued, their latency hidden behind them.
//     They are stored in pairs, so that a thread reads those of its two columns in one 16-byte
//     load.
//   - Five stages, so that a step's rows are requested well ahead (right after the barrier:
//     requesting them after dQ was slower). Four and five are close: five is a little faster
//     at mid-length rows and a little slower at the longest.
//   - The last wave shared out along the query stream (bwd_tail_split.h), in pieces of at least
//     two steps, so that a partial last wave does not leave most SMs idle.
//
// The step is a chain in lockstep: S^T and dP^T, the exponentials, dV and dK, the CTA barrier,
// dQ. The trace, the ablations and the GPU limits behind that, and the variants measured and
// not kept (decoupled or turn-taking warpgroups, dQ on wgmma per warpgroup or on a third
// warpgroup, bulk dQ reductions, steps of 128 rows, exponentials on the FMA pipe, ...), are in
// bench/tune/sm90_experiments.md.
//
// The kernel body exists for sm_90a only; other targets compile an empty kernel that the plan
// never picks (plan.cpp: DeviceDesc::sm90_kernels, from the device and the build).
#pragma once

#include "bulk_copy.cuh"
#include "bwd_tail_split.h"
#include "bwd_sm80.cuh"
#include "fwd_sm80.cuh"
#include "launchers.h"
#include "stream_tile_images.h"
#include "wgmma.cuh"


namespace psa_fa2 {
namespace fbwd_sm90 {

namespace ffwd = flash_fwd_detail;

// The cp.async groups but the kPending newest land, become visible to wgmma's async proxy, and
// are published to the CTA by a barrier.
template <int kPending>
__device__ __forceinline__ void publish_copies() {
  ffwd::cp_async_wait<kPending>();
  wgmma::fence_proxy_async_shared();
  __syncthreads();
}

// stmatrix x4 (sm_90): the inverse of ldmatrix x4. Lanes 8i .. 8i+7 give the row addresses of
// 8x8 matrix i, whose row lane / 4, columns 2 (lane % 4) .. + 1 come from r[i] of each lane.
__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// kVecBytes: the global copy width of K and V; kStreamRead, kStreamVecBytes: how the streamed Q
// and dO are read: as rows of that width (16 where the plan has them copied to 128-byte aligned
// rows; launch.cpp makes the copies), or as stream images.
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes, StreamRead kStreamRead,
          int kStreamVecBytes>
struct Sm90BwdTraits {
  // The preprocess, dQ conversion and epilogue kernels, and the workspace layout.
  using C = fbwd::Config<kDtype, kDk, kDv, kLayout>;
  static constexpr bool kCF = kLayout == Layout::kChannelFirst;
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kKeys = 64;                    // per warpgroup
  static constexpr int kBlockN = kKeys * kWarpgroups;  // per CTA
  static constexpr int kBlockM = 64;                  // streamed query rows per step
  static constexpr int kStages = 5;  // of the Q / dO / lse / D stream
  // One barrier per step publishes both the step's dS^T and the next step's rows: the stage it
  // refills is the previous step's, and the next step writes the other dS^T buffer while this
  // one's dQ may still read.
  static_assert(kStages >= 3, "one barrier per step needs three stages");
  static constexpr int kDSBuffers = 2;
  static_assert(kDk == 32 && (kDv == 64 || kDv == 32),
                "the wgmma shapes below are those of (32, 64) and (32, 32)");
  static_assert(C::kThreads == kThreads && C::kBlockN == kBlockN && C::kBlockM == kBlockM,
                "the epilogue and workspace of the mma.sync kernel's configuration");
  static_assert(kBlockN == kSm90BwdKeysPerCta && kBlockM == kSm90BwdRowsPerStep,
                "the tail split's plan (bwd_tail_split.h) counts these tiles and steps");
  // A shared tile's partial sum: each thread's dK and dV registers as float4s, [float4][thread].
  static constexpr int kPartialFloats = (kDk / 8 + kDv / 8) * 4 * kThreads;
  static_assert(kPartialFloats == kBlockN * (kDk + kDv), "one float per key and channel");

  // Tiles of 64 tokens: [d][token] channel-first, [token][d] token-major.
  template <int kD>
  using TokenTile = std::conditional_t<kCF, ffwd::SmemTile<kD, 64>, ffwd::SmemTile<64, kD>>;
  using KTile = TokenTile<kDk>;   // one per warpgroup
  using VTile = TokenTile<kDv>;   // one per warpgroup
  using QTile = TokenTile<kDk>;   // kStages of them
  using DOTile = TokenTile<kDv>;  // kStages of them
  // dS^T [owned key][streamed row], padded rows: the layout the mma.sync kernel's dQ reads
  // (128-byte swizzled rows instead where dQ is on wgmma).
  // dQ on wgmma with stream images: each warpgroup computes 16 of dQ's 32 columns over all
  // 128 keys after the step's barrier. The row kernels keep it on mma.sync, where wgmma left
  // them short of registers.
  static constexpr bool kDQWgmma = kCF && kStreamRead == StreamRead::kStreamImages;
  using DSTile = std::conditional_t<kDQWgmma, ffwd::SmemTile<kBlockN, kBlockM>,
                                    fbwd::Tile<kBlockN, kBlockM, true>>;
  // dQ on wgmma: A = dS from dS^T [key][row] (rows along the tile's 128-byte lines: MN-major),
  // B = this warpgroup's 16 columns of both K tiles ([d][key]: K-major).
  using DSForDQ = wgmma::OperandB<ffwd::SmemTile<kBlockN, kBlockM>, false>;
  using KForDQ = wgmma::OperandB<KTile, true>;

  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kWarpgroups * KTile::kBytes;
  static constexpr int kQOffset = kVOffset + kWarpgroups * VTile::kBytes;
  static constexpr int kDOOffset = kQOffset + kStages * QTile::kBytes;
  // lse and D: [stage][row pair][lse of the pair, D of the pair], so that a thread reads those
  // of its two columns j * 8 + 2t, + 1 in one 16-byte load.
  static constexpr int kRowStatsOffset = kDOOffset + kStages * DOTile::kBytes;
  static constexpr int kDSOffset =  // dQ on wgmma: swizzle atoms of dS^T aligned
      kDQWgmma ? (kRowStatsOffset + kStages * kBlockM * 8 + 1023) / 1024 * 1024
               : kRowStatsOffset + kStages * kBlockM * 8;
  // Q, dO, lse and D from stream images (stream_tile_images.h; kStreamRead ==
  // StreamRead::kStreamImages): thread 0 fetches a step's with three bulk copies that complete the
  // stage's "full" mbarrier, on which every thread waits, instead of every thread copying rows.
  static constexpr bool kStreamImages = kStreamRead == StreamRead::kStreamImages;
  static_assert(!kStreamImages || kCF, "stream images of channel-first Q and dO");
  static_assert(!kStreamImages || (kBlockM == kStreamImageTokens && kDk % 8 == 0),
                "an image step is a stage; dO's rows keep the swizzle of Q's");
  static constexpr int64_t kImageStepBytes = stream_image_step_bytes(kDk, kDv);
  static constexpr int64_t kImageStatsOffset = stream_image_stats_offset_bytes(kDk, kDv);
  static constexpr int kFullBarOffset = (kDSOffset + kDSBuffers * DSTile::kElems * 2 + 7) / 8 * 8;
  static constexpr int kPassBytes = kFullBarOffset + (kStreamImages ? 8 * kStages : 0);
  static constexpr int kSmemBytes =
      kPassBytes > int(C::kStageBytes) ? kPassBytes : int(C::kStageBytes);
  static_assert(kVOffset % 1024 == 0 && kQOffset % 1024 == 0 && kDOOffset % 1024 == 0 &&
                    KTile::kBytes % 1024 == 0 && VTile::kBytes % 1024 == 0 &&
                    QTile::kBytes % 1024 == 0 && DOTile::kBytes % 1024 == 0,
                "tiles aligned to their swizzle atoms");

  // The B operands; "K-major" where the tile's columns run along the product's k.
  using QForS = wgmma::OperandB<QTile, !kCF>;     // S^T = K Q^T:   k = d,   n = rows
  using DOForDP = wgmma::OperandB<DOTile, !kCF>;  // dP^T = V dO^T: k = dv,  n = rows
  using DOForDV = wgmma::OperandB<DOTile, kCF>;   // dV += P^T dO:  k = rows, n = dv
  using QForDK = wgmma::OperandB<QTile, kCF>;     // dK += dS^T Q:  k = rows, n = dk
  static_assert(QForS::kNExtent == kBlockM && DOForDP::kNExtent == kBlockM &&
                    DOForDV::kNExtent == kDv && QForDK::kNExtent == kDk,
                "each wgmma reads whole tiles");
};

template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes, StreamRead kStreamRead,
          int kStreamVecBytes>
__global__ void __launch_bounds__(
    Sm90BwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes, kStreamRead, kStreamVecBytes>::kThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ BwdParams p, float* ws, int n_pad, int gran,
                          const BwdTailSplit split) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = Sm90BwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes, kStreamRead, kStreamVecBytes>;
  using C = typename Tr::C;
  using KTile = typename Tr::KTile;
  using VTile = typename Tr::VTile;
  using QTile = typename Tr::QTile;
  using DOTile = typename Tr::DOTile;
  using DSTile = typename Tr::DSTile;
  using QS = typename Tr::QForS;
  using DOP = typename Tr::DOForDP;
  using DOV = typename Tr::DOForDV;
  using QK = typename Tr::QForDK;
  constexpr bool kCF = Tr::kCF;
  constexpr int kBlockM = Tr::kBlockM;
  constexpr int kKeys = Tr::kKeys;

  extern __shared__ __align__(1024) unsigned char bwd_sm90_smem[];
  const uint32_t smem_base = ffwd::smem_u32(bwd_sm90_smem);
  // A misplaced swizzle atom would give wrong products: fail loudly instead.
  if (smem_base % 1024 != 0) __trap();

  const int tid = threadIdx.x;
  const int wg = tid / 128;     // warpgroup: owns keys own0 + 64 wg ..
  const int wtid = tid % 128;   // thread within the warpgroup
  const int warp = tid / 32;    // 0..7: owns keys own0 + 16 warp .. (both wgmma and mma.sync)
  const int lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

  // This CTA's key tile, and its steps: all of them, or a run of them when the tile is one of
  // the last wave's, shared by split.pieces CTAs (bwd_tail_split.h).
  const int n = p.seqlen;
  const int n_steps = (n + kBlockM - 1) / kBlockM;
  int tile_x = blockIdx.x, bh = blockIdx.y, it_begin = 0, it_end = n_steps, shared_tile = -1;
  if (split.pieces > 1) {  // the linear CTA index counts the tiles (below 2^31 then)
    const int cta = blockIdx.x + blockIdx.y * gridDim.x;
    if (cta >= split.ctas) return;
    int tile = cta;
    if (cta >= split.whole) {
      const int piece = (cta - split.whole) % split.pieces;
      shared_tile = (cta - split.whole) / split.pieces;
      tile = split.whole + shared_tile;
      it_begin = piece * n_steps / split.pieces;
      it_end = (piece + 1) * n_steps / split.pieces;
    }
    tile_x = tile % split.tiles;
    bh = tile / split.tiles;
  }
  const int b = bh / p.heads, h = bh % p.heads;
  const int own0 = tile_x * Tr::kBlockN;
  const int key0 = own0 + wg * kKeys;

  const uint32_t sK = smem_base + Tr::kKOffset + wg * KTile::kBytes;  // this warpgroup's
  const uint32_t sV = smem_base + Tr::kVOffset + wg * VTile::kBytes;
  const uint32_t sK0 = smem_base + Tr::kKOffset;                       // both, for dQ
  const uint32_t sQ = smem_base + Tr::kQOffset;
  const uint32_t sDO = smem_base + Tr::kDOOffset;
  const float* sRowStats = reinterpret_cast<const float*>(bwd_sm90_smem + Tr::kRowStatsOffset);
  uint16_t* const sDS = reinterpret_cast<uint16_t*>(bwd_sm90_smem + Tr::kDSOffset);

  auto head = [&](const Strided4& s) {
    return static_cast<const uint16_t*>(s.ptr) + b * s.stride_b + h * s.stride_h;
  };
  auto row_stride = [](const Strided4& s) { return kCF ? s.stride_d : s.stride_n; };
  // Token `tok` of a head: along the rows channel-first, rows down token-major.
  auto at = [](const uint16_t* hd, int64_t rs, int tok) { return kCF ? hd + tok : hd + tok * rs; };
  const uint32_t full_bars = smem_base + Tr::kFullBarOffset;  // stream images only
  const char* const g_images =
      Tr::kStreamImages ? static_cast<const char*>(p.stream_tile_images) +
                              int64_t(bh) * n_steps * Tr::kImageStepBytes
                        : nullptr;
  const float* g_lse = static_cast<const float*>(p.lse) + int64_t(bh) * n;
  const float* g_del = static_cast<const float*>(p.delta) + int64_t(bh) * n;

  // Rows str0 .. str0 + 63 of s into a tile; the range checks only where the tile reaches N.
  auto copy_rows = [&](const auto& copier, uint32_t dst, const Strided4& s, int str0) {
    const uint16_t* src = at(head(s), row_stride(s), str0);
    if (str0 + kBlockM <= n) {
      copier.copy_full(dst, src);
    } else {
      copier.copy(dst, src, n - str0);
    }
  };
  // Step `it`'s rows into stage (it - it_begin) % kStages: from stream images, thread 0's bulk
  // copies (nothing past the last step); else warpgroup 0 copies Q, lse and D, warpgroup 1 dO,
  // and past the last step it commits an empty group, so that the groups are the steps' in
  // order.
  auto issue_stream = [&](int it) {
    const int stage = (it - it_begin) % Tr::kStages;
    if constexpr (Tr::kStreamImages) {
      if (tid == 0 && it < it_end) {
        const uint32_t bar = full_bars + 8 * stage;
        const char* const image = g_images + int64_t(it) * Tr::kImageStepBytes;
        bulk_copy::copy_block(sQ + stage * QTile::kBytes, image, QTile::kBytes, bar);
        bulk_copy::copy_block(sDO + stage * DOTile::kBytes, image + QTile::kBytes, DOTile::kBytes,
                              bar);
        bulk_copy::copy_block(smem_base + Tr::kRowStatsOffset + stage * kBlockM * 8,
                              image + Tr::kImageStatsOffset, kBlockM * 8, bar);
      }
    } else {
      const int str0 = it * kBlockM;
      if (it < it_end && wg == 0) {
        const ffwd::CopierFor<QTile, kCF, kStreamVecBytes> copier(wtid, row_stride(p.q));
        copy_rows(copier, sQ + stage * QTile::kBytes, p.q, str0);
        // Rows past N get lse = D = 0 (finite); their P is masked to 0.
        const int r = wtid % kBlockM, tok = str0 + r;
        const bool ok = tok < n;
        const bool is_lse = wtid < kBlockM;
        const float* src = is_lse ? g_lse : g_del;
        const int offset = Tr::kRowStatsOffset +
                           (stage * kBlockM * 2 + (r / 2) * 4 + (is_lse ? 0 : 2) + r % 2) * 4;
        ffwd::cp_async<4>(smem_base + offset, ok ? src + tok : src, ok ? 4 : 0);
      } else if (it < it_end) {
        const ffwd::CopierFor<DOTile, kCF, kStreamVecBytes> copier(wtid, row_stride(p.dout));
        copy_rows(copier, sDO + stage * DOTile::kBytes, p.dout, str0);
      }
      ffwd::cp_async_commit();
    }
  };
  if constexpr (Tr::kStreamImages) {
    if (tid == 0) {  // three copies per phase, each arriving once
      for (int i = 0; i < Tr::kStages; ++i) bulk_copy::init_barrier(full_bars + 8 * i, 3);
      bulk_copy::fence_barrier_init();
    }
  }
  // Prologue: this warpgroup's K and V rows (a warpgroup wholly past N copies nothing and
  // points at the head, a valid address), then the rows of steps 0 .. kStages - 2; step 0's
  // (with K and V) are published.
  {
    const int valid = key0 < n ? n - key0 : 0;
    const int first = key0 < n ? key0 : 0;
    const ffwd::CopierFor<KTile, kCF, kVecBytes> k_copier(wtid, row_stride(p.k));
    const ffwd::CopierFor<VTile, kCF, kVecBytes> v_copier(wtid, row_stride(p.v));
    k_copier.copy(sK, at(head(p.k), row_stride(p.k), first), valid);
    v_copier.copy(sV, at(head(p.v), row_stride(p.v), first), valid);
  }
  // The barriers are initialised before any copy completes on them, as in the forward. (Thread
  // 0 both initialises them and copies, yet without this barrier racecheck reports each
  // initialisation and the first arrival on it as a possible race.)
  if constexpr (Tr::kStreamImages) __syncthreads();
  issue_stream(it_begin);  // one group with K and V
  for (int i = 1; i < Tr::kStages - 1; ++i) issue_stream(it_begin + i);
  if constexpr (Tr::kStreamImages) {
    ffwd::cp_async_commit();  // K and V
    publish_copies<0>();
  } else {
    publish_copies<Tr::kStages - 2>();  // the younger steps' rows may stay in flight
  }

  uint32_t kf[kDk / 16][4];  // A fragments of this warp's 16 keys
  uint32_t vf[kDv / 16][4];
  ffwd::load_a_fragments<KTile, kCF>(kf, sK, warp % 4, lane);
  ffwd::load_a_fragments<VTile, kCF>(vf, sV, warp % 4, lane);
  // B fragments of dQ = dS K for this warp's 16 dQ columns (np = warp % 2) over the CTA's 128
  // keys, k16 step ks: the same every step, so loaded once. kq[ks][0], [1]: keys lo, hi of
  // columns 16 np .. + 8; [2], [3]: of the next 8.
  uint32_t kq[Tr::kBlockN / 16][4];
  if constexpr (!Tr::kDQWgmma) {
    const int np = warp % (kDk / 16);
    const int li = lane / 8, lr = lane % 8;
#pragma unroll
    for (int ks = 0; ks < Tr::kBlockN / 16; ++ks) {
      const uint32_t tile = sK0 + (ks / (kKeys / 16)) * KTile::kBytes;  // the owner's K tile
      const int kk = ks % (kKeys / 16);
      if constexpr (kCF) {
        // Stored [d][key] = B^T: plain ldmatrix gives the "col" fragment.
        const int row = np * 16 + (li / 2) * 8 + lr;
        const int chunk = kk * 2 + (li % 2);
        ffwd::ldsm_x4(kq[ks], tile + 2u * KTile::offset(row, chunk));
      } else {
        // Stored [key][d] = B: transpose 8 keys x 8 d per block.
        const int row = kk * 16 + (li % 2) * 8 + lr;
        const int chunk = np * 2 + (li / 2);
        ffwd::ldsm_x4_trans(kq[ks], tile + 2u * KTile::offset(row, chunk));
      }
    }
  }

  const uint64_t q_s_desc = QS::descriptor(sQ);
  const uint64_t do_p_desc = DOP::descriptor(sDO);
  const uint64_t do_v_desc = DOV::descriptor(sDO);
  const uint64_t q_k_desc = QK::descriptor(sQ);

  const float scale_log2 = float(p.scale) * fbwd::kLog2e;
  float dk_acc[kDk / 8][4], dv_acc[kDv / 8][4];
#pragma unroll
  for (int i = 0; i < kDk / 8; ++i) dk_acc[i][0] = dk_acc[i][1] = dk_acc[i][2] = dk_acc[i][3] = 0.f;
#pragma unroll
  for (int i = 0; i < kDv / 8; ++i) dv_acc[i][0] = dv_acc[i][1] = dv_acc[i][2] = dv_acc[i][3] = 0.f;

  // The keys of this thread's accumulator rows g and g + 8, and whether they are below N.
  const int my_key = key0 + (warp % 4) * 16 + g;
  const bool key_ok[2] = {my_key < n, my_key + 8 < n};

  // One step: the 64 streamed rows at str0, in stage `stage`. kMasked: some owned key or some
  // streamed row is past N. The caller branches once per step, so the other steps carry no
  // range checks (ptxas would otherwise turn them into selects on every score).
  // Deferred dQ reductions (dQ on mma.sync): the dQ block of the previous step and where it
  // goes (nullptr: none).
  float dq_pending[2][4];
  float* dq_pending_row0 = nullptr;
  const int dq_np = warp % (kDk / 16);
  const int dq_col0 = Tr::kDQWgmma ? wg * 16 : dq_np * 16;
  float dqa[2][4];  // dQ on wgmma: this warp's 16 x 16 block, in flight until the step's end
  const uint64_t ds_desc0 = Tr::DSForDQ::descriptor(ffwd::smem_u32(sDS));
  const uint64_t k_dq_desc = Tr::KForDQ::descriptor(sK0 + wg * 16 * 128);
  auto step = [&](int it, int stage, auto masked) {
    const int str0 = it * kBlockM;
    uint16_t* const ds_buf = sDS + (Tr::kDSBuffers == 2 ? (it & 1) * DSTile::kElems : 0);
    constexpr bool kMasked = decltype(masked)::value;
    // -lse log2 e and D of the columns (query rows) 8j + 2t, 8j + 2t + 1 of this thread: read
    // before the wgmmas, which hides their latency behind them at the cost of 32 registers live
    // across them.
    if constexpr (Tr::kStreamImages) {
      bulk_copy::wait(full_bars + 8 * stage, ((it - it_begin) / Tr::kStages) & 1);
    }
    float nl[kBlockM / 8][2], del[kBlockM / 8][2];
    auto read_row_stats = [&] {
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) {
        const float4 ld = *reinterpret_cast<const float4*>(
            sRowStats + stage * kBlockM * 2 + (j * 4 + t) * 4);  // lse, lse, D, D
        nl[j][0] = -ld.x * fbwd::kLog2e;
        nl[j][1] = -ld.y * fbwd::kLog2e;
        del[j][0] = ld.z;
        del[j][1] = ld.w;
      }
    };
    read_row_stats();
    // S^T and dP^T.
    float s[kBlockM / 8][4], dp[kBlockM / 8][4];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      const uint64_t desc = q_s_desc + QS::advance(stage * QTile::kBytes + kk * QS::kKStepBytes);
      if (kk == 0) {
        wgmma::mma_m64n64k16<kDtype, false, QS::kTranspose>(s, kf[kk], desc);
      } else {
        wgmma::mma_m64n64k16<kDtype, true, QS::kTranspose>(s, kf[kk], desc);
      }
    }
    wgmma::commit_group();
#pragma unroll
    for (int kk = 0; kk < kDv / 16; ++kk) {
      const uint64_t desc =
          do_p_desc + DOP::advance(stage * DOTile::kBytes + kk * DOP::kKStepBytes);
      if (kk == 0) {
        wgmma::mma_m64n64k16<kDtype, false, DOP::kTranspose>(dp, vf[kk], desc);
      } else {
        wgmma::mma_m64n64k16<kDtype, true, DOP::kTranspose>(dp, vf[kk], desc);
      }
    }
    wgmma::commit_group();
    if constexpr (!Tr::kDQWgmma) {
      if (dq_pending_row0 != nullptr) {
        fbwd::red_add_dq_block<kDk>(dq_pending_row0, dq_pending, dq_col0);
      }
    }

    // P^T while dP^T is in flight. Columns are query rows: 8j + 2t and 8j + 2t + 1.
    wgmma::wait_group<1>();
    wgmma::pin(s);
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
      const int col = j * 8 + 2 * t;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pv = fbwd::ex2(fmaf(s[j][e], scale_log2, nl[j][e & 1]));
        // Zero-filled rows and keys give S = 0, whose exp may overflow for extreme lse: the
        // select keeps every value finite.
        if constexpr (kMasked) pv = (key_ok[e >> 1] && str0 + col + (e & 1) < n) ? pv : 0.f;
        s[j][e] = pv;
      }
    }
    wgmma::wait_group<0>();
    wgmma::pin(dp);
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[j][e] = s[j][e] * (dp[j][e] - del[j][e & 1]);
    }

    // A fragments of k16 step kk over the streamed rows (16kk ..).
    uint32_t pf[kBlockM / 16][4], df[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ffwd::pack_a_fragment<kDtype>(pf[kk], s, kk);
      ffwd::pack_a_fragment<kDtype>(df[kk], dp, kk);
      // dS^T rows (keys) x columns (query rows): the fragment's four 8x8 blocks in one
      // stmatrix. Lanes 8i .. 8i+7 address the rows of block i (keys (i % 2) * 8 .., columns
      // kk * 16 + (i / 2) * 8 ..); rows 144 bytes apart put each 16-byte row in its own banks.
      const int ds_key = warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
      const int ds_col = kk * 16 + (lane / 16) * 8;
      if constexpr (Tr::kDQWgmma) {
        stsm_x4(ffwd::smem_u32(ds_buf + DSTile::offset(ds_key, ds_col / 8)), df[kk]);
      } else {
        stsm_x4(ffwd::smem_u32(ds_buf + DSTile::off(ds_key, ds_col)), df[kk]);
      }
    }

    // dV += P^T dO and dK += dS^T Q, in flight during dQ below.
    wgmma::pin(dv_acc);
    wgmma::pin(dk_acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      wgmma::mma_m64k16<kDv, kDtype, true, DOV::kTranspose>(
          dv_acc, pf[kk], do_v_desc + DOV::advance(stage * DOTile::kBytes + kk * DOV::kKStepBytes));
    }
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      wgmma::mma_m64n32k16<kDtype, true, QK::kTranspose>(
          dk_acc, df[kk], q_k_desc + QK::advance(stage * QTile::kBytes + kk * QK::kKStepBytes));
    }
    wgmma::commit_group();

    // Both warpgroups' dS^T are in shared memory. With one barrier per step it also publishes
    // the next step's rows (landed: every group issued so far; visible to the async proxy),
    // and every thread is past the waits on the products that read the previous step's stage,
    // which is refilled.
    publish_copies<Tr::kStages - 3>();  // step it + 1's rows; younger ones may stay in flight
    issue_stream(it + Tr::kStages - 1);

    if constexpr (Tr::kDQWgmma) {
      // dQ[str0 .. + 64, 16 wg .. + 16] = dS K over the CTA's 128 keys: A = dS^T's tile, B =
      // rows 16 wg .. of the K tiles (keys 0 .. 63 in the first, 64 .. 127 in the second).
      // In flight until the step's end, where it is reduced.
      using DSA = typename Tr::DSForDQ;
      using KB = typename Tr::KForDQ;
      const uint64_t ds_desc =
          ds_desc0 + DSA::advance(Tr::kDSBuffers == 2 ? (it & 1) * DSTile::kBytes : 0);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < Tr::kBlockN / 16; ++ks) {
        const uint64_t a = ds_desc + DSA::advance(ks * DSA::kKStepBytes);
        const uint64_t b =
            k_dq_desc + KB::advance((ks / 4) * KTile::kBytes + (ks % 4) * KB::kKStepBytes);
        if (ks == 0) {
          wgmma::mma_ss_m64n16k16<kDtype, false, DSA::kTranspose, KB::kTranspose>(dqa, a, b);
        } else {
          wgmma::mma_ss_m64n16k16<kDtype, true, DSA::kTranspose, KB::kTranspose>(dqa, a, b);
        }
      }
      wgmma::commit_group();
    } else {
      // dQ[str0 .. + 64] += dS K over the CTA's 128 keys: warp w computes the 16 x 16 block
      // (rows 16 (w / 2), columns 16 (w % 2)).
      static_assert(kBlockM / 16 * (kDk / 16) == Tr::kThreads / 32, "one dQ block per warp");
      const int mt = warp / (kDk / 16);
      float q[2][4] = {};  // [n8 half][fragment]
#pragma unroll
      for (int ks = 0; ks < Tr::kBlockN / 16; ++ks) {
        // A = dS[row][key] from dS^T[key][row]: transposed load (rows = keys, chunks of rows).
        uint32_t a[4];
        {
          const int jj = ks * 16 + (lane & 7) + ((lane >> 4) << 3);
          const int ii = mt * 16 + ((lane >> 3) & 1) * 8;
          ffwd::ldsm_x4_trans(a, ffwd::smem_u32(ds_buf + DSTile::off(jj, ii)));
        }
        ffwd::mma_16816<kDtype>(q[0], a, kq[ks][0], kq[ks][1]);
        ffwd::mma_16816<kDtype>(q[1], a, kq[ks][2], kq[ks][3]);
      }
      // Reduced in the next step, once its S^T / dP^T wgmmas are issued, so that the warp
      // does not wait for these MMAs at the end of this step.
#pragma unroll
      for (int h8 = 0; h8 < 2; ++h8) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dq_pending[h8][e] = q[h8][e];
      }
      dq_pending_row0 = ws + (int64_t(bh) * n_pad + str0 + mt * 16) * kDk;
    }

    // dV and dK landed: their A fragments and this stage may be reused.
    wgmma::wait_group<0>();
    wgmma::pin(dv_acc);
    wgmma::pin(dk_acc);
    wgmma::pin(pf);
    wgmma::pin(df);
    if constexpr (Tr::kDQWgmma) {
      // Reduced here, on no branch: ptxas serializes every wgmma of the kernel when an
      // accumulator's registers are read on a path it cannot prove uniform.
      wgmma::pin(dqa);
      fbwd::red_add_dq_block<kDk>(ws + (int64_t(bh) * n_pad + str0 + (warp % 4) * 16) * kDk, dqa,
                                  dq_col0);
    }
  };

  const bool own_tail = own0 + Tr::kBlockN > n;
  int stage = 0;
  for (int it = it_begin; it < it_end; ++it) {
    const int str0 = it * kBlockM;
    if (own_tail || str0 + kBlockM > n) {
      step(it, stage, std::true_type{});
    } else {
      step(it, stage, std::false_type{});
    }
    stage = stage + 1 == Tr::kStages ? 0 : stage + 1;
  }
  if constexpr (!Tr::kDQWgmma) {  // the last step's
    if (dq_pending_row0 != nullptr) {
      fbwd::red_add_dq_block<kDk>(dq_pending_row0, dq_pending, dq_col0);
    }
  }
  ffwd::cp_async_wait<0>();  // the empty groups, before the epilogue reuses shared memory

  if (shared_tile >= 0) {
    // Add this CTA's dK / dV to the tile's partial sum; the last of its CTAs to arrive takes
    // the sum (its own included) to the epilogue, the others are done.
    float4* sum = reinterpret_cast<float4*>(split.partial) +
                  int64_t(shared_tile) * (Tr::kPartialFloats / 4) + tid;
    // acc[i] is float4 `first + i` of this thread's part of the sum.
    auto add_to_sum = [&](const auto& acc, int first) {
#pragma unroll
      for (int i = 0; i < int(sizeof(acc) / sizeof(acc[0])); ++i) {
        fbwd::red_add4(reinterpret_cast<float*>(sum + (first + i) * Tr::kThreads), acc[i][0],
                       acc[i][1], acc[i][2], acc[i][3]);
      }
    };
    auto take_sum = [&](auto& acc, int first) {
#pragma unroll
      for (int i = 0; i < int(sizeof(acc) / sizeof(acc[0])); ++i) {
        const float4 v = __ldcg(sum + (first + i) * Tr::kThreads);
        acc[i][0] = v.x;
        acc[i][1] = v.y;
        acc[i][2] = v.z;
        acc[i][3] = v.w;
      }
    };
    add_to_sum(dk_acc, 0);
    add_to_sum(dv_acc, kDk / 8);
    __threadfence();  // the additions are visible device-wide before the arrival is counted
    __syncthreads();
    const bool last = tid == 0 && atomicAdd(split.arrivals + shared_tile, 1) == split.pieces - 1;
    if (!__syncthreads_or(last)) return;
    __threadfence();
    take_sum(dk_acc, 0);
    take_sum(dv_acc, kDk / 8);
  }

  fbwd::epilogue_kv<C>(p, reinterpret_cast<char*>(bwd_sm90_smem), b, h, own0, dk_acc, dv_acc, gran);
#endif
}

}  // namespace fbwd_sm90

// Instantiated in instances/sm90_bwd_*.cu: the preprocess, this kernel and the dQ conversion,
// on the workspace plan_bwd sizes: the dQ accumulators of the mma.sync kernel's atomic-dQ
// schedule, then the tail split's partial sums and counters (plan.tail).
template <DType kDtype, int kDk, int kDv, Layout kLayout, int kVecBytes, StreamRead kStreamRead,
          int kStreamVecBytes>
void launch_bwd_sm90(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  using Tr = fbwd_sm90::Sm90BwdTraits<kDtype, kDk, kDv, kLayout, kVecBytes, kStreamRead,
                                      kStreamVecBytes>;
  using C = typename Tr::C;
  const int bh = p.batch * p.heads, n = p.seqlen;
  if (bh == 0 || n == 0) return;
  const int n_pad = fbwd::round_up(n, C::kPadRows);
  const int gran = C::kTM ? 16 : fbwd::channel_first_granularity(p);
  float* ws = static_cast<float*>(p.workspace);
  BwdTailSplit split = plan.tail;
  split.partial = ws + int64_t(bh) * n_pad * kDk;
  split.arrivals = reinterpret_cast<int*>(split.partial +
                                          int64_t(bwd_tail_split_tiles(split)) * Tr::kPartialFloats);
  const int tail_vec4 = int(bwd_tail_split_bytes(split, Tr::kPartialFloats) / 16);
  const dim3 grid_rows(n_pad / C::kPreRows, bh);
  const dim3 grid_own(split.tiles, split.pieces > 1 ? (split.ctas + split.tiles - 1) / split.tiles : bh);
  fbwd::bwd_preprocess_kernel<C><<<grid_rows, 256, 0, stream>>>(
      p, ws, n_pad, reinterpret_cast<float4*>(split.partial), tail_vec4,
      Tr::kStreamImages ? static_cast<char*>(p.stream_tile_images) : nullptr);
  constexpr auto kernel =
      fbwd_sm90::flash_bwd_sm90_kernel<kDtype, kDk, kDv, kLayout, kVecBytes, kStreamRead, kStreamVecBytes>;
  constexpr int smem = Tr::kSmemBytes;
  allow_dynamic_smem_once<kernel>(smem);
  kernel<<<grid_own, Tr::kThreads, smem, stream>>>(p, ws, n_pad, gran, split);
  fbwd::bwd_convert_dq_kernel<C><<<grid_rows, 256, 0, stream>>>(p, ws, n_pad, gran);
}

}  // namespace psa_fa2
