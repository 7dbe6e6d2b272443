// What a grouped GEMM config (the generated Cfg) implies (Traits): the MMA operand types (and the
// 16-bit operands' format traits), the producer / consumer warpgroups and their setmaxnreg split,
// the shared-memory layout, barrier offsets and arrival counts, transaction bytes, and every
// static check of a config.
#pragma once
#include "qforge/gemm_smem.cuh"
#include "qforge/types.cuh"

namespace qf {
namespace gemm {

template <bool C, class X, class Y>
struct Pick {
  using type = X;
};
template <class X, class Y>
struct Pick<false, X, Y> {
  using type = Y;
};

// 16-bit MMA operands (the quantize kernels' identity copies, as they are): the format traits
// the wgmma wrappers dispatch on (kBits 16; bf16 has 8 exponent bits, fp16 5).
struct Bf16Operand {
  static constexpr int kBits = 16, kExpBits = 8;
  static constexpr bool kIsInt = false;
};
struct Fp16Operand {
  static constexpr int kBits = 16, kExpBits = 5;
  static constexpr bool kIsInt = false;
};

// Whether the producer warp fills the stages' scale slots by bulk copies (SlotScaling::kBulk).
template <class S, class Cfg>
__device__ constexpr bool gemm_bulk_scales() {
  if constexpr (S::kScaleWriters > 0) return S::template kBulk<Cfg>;
  return false;
}

template <class Cfg>
struct Traits {
  using Scaling = typename Cfg::Scaling;
  static constexpr bool kBulkScales = gemm_bulk_scales<Scaling, Cfg>();
  static constexpr int kScaleWriters = kBulkScales ? 0 : Scaling::kScaleWriters;  // writer threads that run
  static constexpr int kBM = int(Cfg::kBlockM), kBN = int(Cfg::kBlockN);
  static constexpr int kConsumers = int(Cfg::kConsumers);
  static constexpr bool kFp4 = Cfg::kScaling == kGemmNvfp4;
  // int8 x int8: s32 tensor-core sums (exact), converted to fp32 where they are promoted or stored.
  static constexpr bool kInt8 = Cfg::AFormat::kIsInt;
  // bf16 / fp16 (identity) operands: 64 of K per stage, m64nNk16 MMAs, fp32 sums, no scales.
  static constexpr bool k16Bit = Cfg::AFormat::kBits == 16;
  // Weight-only int8 (channel scaling): the producer warpgroup converts B's int8 to A's 16-bit type
  // in shared memory (i8_producer); the MMAs take A's type for both.
  static constexpr bool kConvertB = Cfg::kScaling == kGemmChannel;
  using MmaB = typename Pick<kConvertB, typename Cfg::AFormat, typename Cfg::BFormat>::type;
  // NVFP4 with two consumer warpgroups: two producer warpgroups, eight warps dequantizing B (one
  // warp per scheduler is latency bound there; measured).
  // (Weight-only int8 keeps one: with 512 threads ptxas has 128 registers for the 128 x 256 tile's
  // 128 accumulators, C7602, and one consumer with two producer warpgroups serializes, C7518.)
  static constexpr int kProducerGroups = kFp4 ? 2 : 1;
  static constexpr int kThreads = 128 * (kConsumers + kProducerGroups);
  static constexpr int kStages = int(Cfg::kStages);
  static constexpr int kMc = int(Cfg::kMulticast);
  static constexpr int kAcc = kBN / 2;  // accumulator registers per thread
  static constexpr int kOutBytes = Cfg::kOutFp32 ? 4 : 2;
  static constexpr int kEpiCols = gemm_epi_cols(kBN, kOutBytes, int(Cfg::kScaling));
  static constexpr int kPitch = gemm_staging_pitch(kEpiCols, kOutBytes);
  static constexpr GemmSmem kSmem =
      gemm_smem(kBM, kBN, kStages, kConsumers, int(Cfg::kScaling), Scaling::kColScales, kOutBytes, Cfg::kKGrouped,
                Cfg::kMembers);
  static constexpr int kLoadSlots = int(kSmem.load_slots);
  // Barrier offsets from the aligned base (after full[stages], empty[stages], turn[2]; GemmSmem::
  // bar_off): loaded[load slots] (NVFP4, weight-only int8), then free[load slots] (NVFP4).
  static constexpr u32 kLoadedBar = kSmem.bar_off + 8u * u32(2 * kStages + 2);
  static constexpr u32 kFreeBar = kLoadedBar + 8u * u32(kLoadSlots);
  static constexpr u32 kTxBytes = kConvertB ? u32(kBM) * 128u + u32(kBN) * 64u : u32(kBM + kBN) * (kFp4 ? 64u : 128u);
  // NVFP4: the TMA bytes complete loaded[slot]; full[stage] takes the B dequantizing warps; every
  // thread of the CTA frees a load slot (the consumers once they have read its A, the producers
  // once they have dequantized its B).
  static constexpr u32 kLoadFreeArrivals = u32(kThreads);
  static constexpr u32 kFullArrivals =
      kFp4 || kConvertB ? 4u * kProducerGroups : 1u + (kScaleWriters ? 32u : 0u);
  // Every lane of every consumer warp (of each CTA of the multicast group) releases the stage.
  static constexpr u32 kEmptyArrivals = u32(kConsumers * 4 * 32 * kMc);
  // Registers per thread after setmaxnreg (2 or 3 consumer warpgroups; one keeps its entry count).
  // The pool is the launch's 168 x 384 registers (setmaxnreg.inc waits until the pool has them):
  // 2 x 232 + 40 = 504 = 3 x 168. Per-32 promotion keeps three accumulators: 2 x 240 + 24.
  // NVFP4 (512 threads, 128 each): 2 x 168 + 2 x 88. K-grouped with scale writers (their byte-wise
  // MX loads spill at 40): 2 x 224 + 56 (at 2 x 216 + 72 the consumers' three accumulators spill);
  // so do the M-grouped ones on mn_major grids (the group's grid prefix and pitch: 12-20 bytes at 40).
  static constexpr bool kWideWriters = (Cfg::kKGrouped || Cfg::kScaleMnMajor) && kScaleWriters > 0;
  // Weight-only int8: the B converters (and their load issue) take 56 as well.
  static constexpr u32 kProducerRegs = kConsumers == 3 ? 24 : kFp4 ? 88 : kWideWriters || kConvertB ? 56 : 40;
  static constexpr u32 kConsumerRegs = kConsumers == 3 ? 160 : kFp4 ? 168 : kWideWriters || kConvertB ? 224 : 232;

  static_assert(kBM == 64 * kConsumers, "one consumer warpgroup per 64 rows");
  static_assert(kConsumers == 1 || kConsumers * kConsumerRegs + kProducerGroups * kProducerRegs <=
                                       (kConsumers + kProducerGroups) * (65536 / kThreads / 8 * 8),
                "the setmaxnreg split must fit the launch's register pool (or the increase never returns)");
  static_assert(kBN % 64 == 0 && kBN <= 256, "block_n: 64, 128, 192 or 256");
  static_assert(!Cfg::kPromote || kBN <= 128, "promotion keeps two accumulators: block_n <= 128");
  static_assert(Cfg::kScaling != kGemmBlock128 || (kBN <= 128 && 128 % kBN == 0 && Cfg::kPromote),
                "128x128 B blocks: a tile's columns share one B scale");
  static_assert(kMc == 1 || (kMc == 2 && (Cfg::kN + kBN - 1) / kBN % 2 == 0), "multicast pairs n-blocks");
  static_assert(Cfg::kN % 8 == 0 && Cfg::kK % 16 == 0, "N % 8 == 0, K % 16 == 0");
  static_assert(!Cfg::kAccumulate || Cfg::kOutFp32, "accumulation is into fp32");
  static_assert(u32(Cfg::kSmemBytes) == kSmem.total && kSmem.total <= kGemmSmemLimit, "shared memory");
  static_assert(kBN % kEpiCols == 0, "epilogue passes");
  static_assert(!Cfg::kOrderedIssue || kConsumers == 2, "ordered issue alternates two warpgroups");
  static_assert(Scaling::kSteps == 1 || (Scaling::kSteps == 4 && Cfg::kPromote && !Cfg::kOrderedIssue),
                "per-32 promotion: promoted, unordered");
  static_assert(!Cfg::kKGrouped || ((Cfg::kScaling == kGemmPerTensor || Cfg::kScaling == kGemmRowChannel ||
                                      Cfg::kScaling == kGemmBlock128K || Cfg::kScaling == kGemmMx32 ||
                                      Cfg::kScaling == kGemmNvfp4 || Cfg::kScaling == kGemmNone) && kMc == 1),
                "K-grouped: per-tensor, per-channel, blockwise (1x128 along the tokens), MX, NVFP4 or no scaling, no multicast");
  static_assert(k16Bit == (Cfg::kScaling == kGemmNone || kConvertB) && Cfg::AFormat::kBits == MmaB::kBits &&
                    (!k16Bit || Cfg::AFormat::kExpBits == MmaB::kExpBits) &&
                    int(Cfg::kElemBytes) == (k16Bit ? 2 : 1) && !(k16Bit && Cfg::kPromote),
                "bf16 / fp16 operands: both of one type (or B int8, converted), no promotion");
  static_assert(!kConvertB || (Cfg::BFormat::kIsInt && !Cfg::kKGrouped && kMc == 1 && !Cfg::kOrderedIssue),
                "weight-only int8: int8 B, M-grouped, no multicast or ordered issue");
  static_assert(!Cfg::kMembers || Cfg::kKGrouped, "per-member operands: the K-grouped layout");
  static_assert(Cfg::kScaling != kGemmBlock128K || (Cfg::kKGrouped && Cfg::kPromote),
                "Block128KScaling: the K-grouped layout, promoted");
  static_assert(Cfg::AFormat::kIsInt == Cfg::BFormat::kIsInt || kConvertB, "int8 operands: both (or weight-only int8 B)");
  static_assert(!kInt8 || (Cfg::kScaling == kGemmPerTensor || Cfg::kScaling == kGemmRowChannel ||
                           Cfg::kScaling == kGemmBlock128 || Cfg::kScaling == kGemmBlock128K),
                "int8: per-tensor, per-row x per-channel or 1x128 blockwise scaling");
  static_assert(!kInt8 || Cfg::kPromote || (!Cfg::kKGrouped && Cfg::kK < (i64(1) << 17)),
                "int8 unpromoted: K * 2^14 < 2^31, so that no s32 sum over all of K overflows");
  static_assert(!kFp4 || (kBN == 128 && kBM == 128 && kMc == 1 && !Cfg::kOrderedIssue && !Cfg::kPromote &&
                          (Cfg::kKGrouped || Cfg::kK % 128 == 0)),
                "NVFP4: 128 x 128 tiles, no multicast, ordered issue or promotion, K % 128 == 0");
};

}  // namespace gemm
}  // namespace qf
