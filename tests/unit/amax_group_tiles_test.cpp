// rt::amax_group_tiles, the host's choice of how many tiles of a tile row one CTA of the amax
// pre-pass reduces (cast.cuh amax_kernel reads it back from the grid as
// ceil(tile columns / grid columns)). The measured choices for fp8 per channel training on an
// H200 (132 SMs, 4-tile segments of 128 x 128 tiles), and for every grid up to 600 x 600 tiles
// the invariants the kernel relies on. CPU only.
#include <gtest/gtest.h>

#include <cstdint>

#include "runtime/quantizer.h"

namespace {

using qf::rt::amax_group_tiles;

constexpr int kH200Sms = 132;

// Grid of 128 x 128 tiles for an M x K input.
uint64_t tiles(int64_t n) { return uint64_t((n + 127) / 128); }

TEST(AmaxGroupTiles, MeasuredShapesOnAnH200) {
  // One wave of tiles (at most 4 CTAs per SM): one tile per CTA.
  EXPECT_EQ(amax_group_tiles(tiles(1024), tiles(1024), 4, kH200Sms), 1u);
  EXPECT_EQ(amax_group_tiles(1, tiles(4224), 4, kH200Sms), 1u);
  // Past one wave, few segments a tile row: one segment.
  EXPECT_EQ(amax_group_tiles(tiles(4096), tiles(4096), 4, kH200Sms), 4u);
  EXPECT_EQ(amax_group_tiles(tiles(8192), tiles(8192), 4, kH200Sms), 4u);
  EXPECT_EQ(amax_group_tiles(tiles(65536), tiles(7168), 4, kH200Sms), 4u);
  // More than 16 segments a tile row and enough CTAs left: two.
  EXPECT_EQ(amax_group_tiles(tiles(16384), tiles(16384), 4, kH200Sms), 8u);
  EXPECT_EQ(amax_group_tiles(tiles(4096), tiles(32768), 4, kH200Sms), 8u);
  EXPECT_EQ(amax_group_tiles(tiles(8100), tiles(17008), 4, kH200Sms), 8u);
  // Many segments a row but too few tile rows to keep 4 CTAs per SM at two: one.
  EXPECT_EQ(amax_group_tiles(tiles(1024), tiles(65536), 4, kH200Sms), 4u);
}

TEST(AmaxGroupTiles, OneTilePerCtaWithoutSegments) {
  for (uint64_t r : {1u, 7u, 128u, 512u})
    for (uint64_t c : {1u, 33u, 128u, 4096u}) EXPECT_EQ(amax_group_tiles(r, c, 1, kH200Sms), 1u) << r << " x " << c;
}

TEST(AmaxGroupTiles, EveryCtaStartsWithinTheRowAndTheKernelReadsBackNoMore) {
  for (int sms : {1, 8, 132})
    for (uint64_t r = 1; r <= 600; r += 13)
      for (uint64_t c = 1; c <= 600; c += 7) {
        const uint64_t per = amax_group_tiles(r, c, 4, sms);
        ASSERT_TRUE(per == 1 || per == 4 || per == 8) << r << " x " << c << ": " << per;
        const uint64_t grid_cols = (c + per - 1) / per;         // the host's pre-pass grid
        const uint64_t read_back = (c + grid_cols - 1) / grid_cols;  // cast.cuh amax_kernel's `per`
        ASSERT_LE(read_back, per) << r << " x " << c;
        ASSERT_LT((grid_cols - 1) * read_back, c) << r << " x " << c << ": the last CTA starts past the row";
        ASSERT_GE(grid_cols * read_back, c) << r << " x " << c << ": tiles no CTA covers";
        if (r * c <= 4 * uint64_t(sms)) ASSERT_EQ(per, 1u) << r << " x " << c;
      }
}

}  // namespace
