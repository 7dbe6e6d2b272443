// rt::grouped_scale_capacity, the one rule that sizes a grouped call's scale buffers (Quantizer::
// grouped_capacity allocates by it, rt::dequantize_grouped checks its scale input against it),
// against what the grouped quantize's layout really fills: each member's dense scale buffer
// (output_buffers of its rows, rt::Quantizer::grouped_outputs, equal to the CPU reference's:
// grouped_outputs_test) back to back, for the worst splits of edge shapes (M and K not multiples
// of the block, a single row, no rows), for every scaling mode, element format, block shape and
// scale layout of the format table. CPU only (no kernel is built or launched).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "error_of.h"
#include "runtime/dequantize_grouped.h"
#include "runtime/quantizer.h"

namespace {

using namespace qf;

template <size_t... I>
std::vector<Scaling> every_mode(std::index_sequence<I...>) {
  return {Scaling(std::in_place_index<I>)...};
}

std::string block_json(BlockShape b) { return "[" + std::to_string(b.rows) + ", " + std::to_string(b.cols) + "]"; }

// One plan per (mode, format, block, layout, scale layout) the format table allows: a training
// plan of a rowwise and a columnwise stream (a recipe the parser rejects as a combination is
// skipped), grouped.
struct Case {
  std::string label;
  Plan plan;
};
std::vector<Case> every_grouped_plan(std::set<std::pair<std::string, std::string>>& covered) {
  std::vector<Case> out;
  for (const Scaling& mode : every_mode(std::make_index_sequence<std::variant_size_v<Scaling>>())) {
    const ScalingTraits& t = traits(mode);
    for (ElemFormat f : t.formats) {
      const std::string fmt(traits(f).name);
      std::vector<std::pair<std::string, std::string>> dirs;  // (rowwise, columnwise) scaling JSON
      if (t.has_block) {
        const BlockShape b = *block_of(mode);  // the mode's default: 1D along K
        const int n = std::max(b.rows, b.cols);
        const std::string m = "\"mode\": \"" + std::string(t.name) + "\", \"block\": ";
        dirs.push_back({"{" + m + block_json({1, n}) + "}", "{" + m + block_json({n, 1}) + "}"});
        dirs.push_back({"{" + m + block_json({n, n}) + "}", "{" + m + block_json({n, n}) + "}"});
      } else {
        const std::string m = "{\"mode\": \"" + std::string(t.name) + "\"}";
        dirs.push_back({m, m});
      }
      std::vector<std::string> scale_layouts = {"compact"};
      if (t.swizzle_ok) scale_layouts.push_back("swizzled");
      if (t.mn_major_ok) scale_layouts.push_back("mn_major");
      for (const auto& [row, col] : dirs)
        for (const char* layout : {"same", "transposed"})
          for (const std::string& sl : scale_layouts) {
            // (rowwise data is always [M, K]; a scale layout other than compact is named.)
            auto spec = [&](const std::string& scaling, const char* lay) {
              std::string s = "{\"format\": \"" + fmt + "\"";
              if (lay) s += ", \"layout\": \"" + std::string(lay) + "\"";
              if (f == ElemFormat::Identity) return s + ", \"dtype\": \"input\"}";
              s += ", \"scaling\": " + scaling;
              if (sl != "compact") s += ", \"scale_layout\": \"" + sl + "\"";
              return s + "}";
            };
            const std::string json = R"({"qforge_recipe": 1, "name": "t", "usage": "training", "roles": [{"match": "*:*", "rowwise": )" +
                                     spec(row, nullptr) + R"(, "columnwise": )" + spec(col, layout) + "}]}";
            try {
              const Plan p = compile_plan(parse_recipe(json), PlanRequest{"grouped_linear:input", DType::BF16, Usage::Training, true});
              out.push_back({std::string(t.name) + " " + fmt + " " + row + " / " + col + " columnwise " + layout + " " + sl, p});
              covered.insert({std::string(t.name), fmt});
            } catch (const UserError&) {
              // a combination the recipe rules refuse (mn_major with 2D blocks, a same-layout e2m1 copy, ...)
            }
            if (f == ElemFormat::Identity) break;  // no scales: one layout serves
          }
    }
  }
  return out;
}

// Splits of m rows into `members` members of multiples of `q` rows (the last one takes the rest):
// all in one member (first, last), empty members between, and members of one granule each, of a
// block and a granule each (a partial block per member), of a block less a granule each.
std::vector<std::vector<int64_t>> worst_splits(int64_t m, int members, int64_t q, int64_t block) {
  std::vector<std::vector<int64_t>> out;
  auto even = [&](int64_t size) {
    std::vector<int64_t> s;
    int64_t left = m;
    for (int g = 0; g + 1 < members; ++g) {
      const int64_t r = std::min(left, size);
      s.push_back(r);
      left -= r;
    }
    s.push_back(left);
    return s;
  };
  std::vector<int64_t> first(size_t(members), 0), last(size_t(members), 0), middle(size_t(members), 0);
  first[0] = m;
  last.back() = m;
  middle[size_t(members) / 2] = m;
  out.push_back(first);
  out.push_back(last);
  out.push_back(middle);
  for (int64_t size : {q, block + q, block - q, 2 * block + q, 128 + q})
    if (size > 0) out.push_back(even(size));
  return out;
}

// For each stream with scales and each split that the plan's member rules allow, the members'
// scales back to back (grouped_outputs) fit the capacity, which is what grouped_capacity
// reports; a rule not bounding every split fails here.
TEST(GroupedScaleCapacity, HoldsTheMembersScalesOfEverySplitForEveryModeAndFormat) {
  std::set<std::pair<std::string, std::string>> covered;
  const std::vector<Case> cases = every_grouped_plan(covered);
  // Every (mode, format) pair of the table compiles into at least one plan.
  for (const Scaling& mode : every_mode(std::make_index_sequence<std::variant_size_v<Scaling>>()))
    for (ElemFormat f : traits(mode).formats)
      EXPECT_TRUE(covered.count({std::string(traits(mode).name), std::string(traits(f).name)}))
          << traits(mode).name << " " << traits(f).name;
  // Edge shapes: none a multiple of a block along M or K but 0 / 1-row extremes and one aligned.
  const std::vector<Shape2D> shapes = {{0, 64}, {1, 2}, {2, 34}, {33, 66}, {130, 18}, {200, 320}, {257, 96}, {256, 256}};
  int checked = 0, bounded = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    const rt::Quantizer q(c.plan);
    for (const Shape2D total : shapes) {
      for (int members : {1, 2, 3, 7}) {
        std::vector<BufferDesc> cap;
        try {
          cap = q.grouped_capacity(total, members);
        } catch (const UserError&) {
          continue;  // K the plan refuses (odd K for packed data)
        }
        for (const BufferDesc& b : cap) {
          if (b.kind != BufferKind::ScaleInv) continue;
          const Stream& s = c.plan.streams[size_t(b.stream)];
          const int64_t want = rt::grouped_scale_capacity(s, total, members);
          ASSERT_EQ(b.bytes, want) << b.name << " [" << total.m << ", " << total.k << "] x " << members;
          ++checked;
          const std::optional<BlockShape> blk = block_of(s.scaling);
          const int64_t block = blk ? std::max(blk->rows, blk->cols) : 1;
          for (int64_t granule : {1, 2, 16}) {
            if (total.m % granule) continue;
            for (const auto& split : worst_splits(total.m / granule, members, 1, std::max<int64_t>(1, block / granule))) {
              std::vector<int64_t> rows;
              for (int64_t r : split) rows.push_back(r * granule);
              std::vector<BufferDesc> filled;
              try {
                filled = q.grouped_outputs(rows, total.k);
              } catch (const UserError&) {
                continue;  // member rows the plan refuses (odd rows of a packed transposed copy)
              }
              for (const BufferDesc& d : filled)
                if (d.name == b.name) {
                  EXPECT_LE(d.bytes, want) << b.name << " [" << total.m << ", " << total.k << "] split " << ::testing::PrintToString(rows);
                  ++bounded;
                }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases.size(), 30u);
  EXPECT_GT(checked, 1000);
  EXPECT_GT(bounded, 10000);
}

// A per-tensor scale (and a per-channel grid of one entry) is one per member, however many rows:
// the capacity is exactly what G members fill.
TEST(GroupedScaleCapacity, OneEntryGridsAreOnePerMember) {
  std::set<std::pair<std::string, std::string>> covered;
  int checked = 0;
  for (const Case& c : every_grouped_plan(covered))
    for (const Stream& s : c.plan.streams) {
      const ScalingTraits& t = traits(s.scaling);
      if (t.has_block || t.scale_storage == ScaleStorage::None) continue;
      const int64_t sb = traits(t.scale_storage).bytes;
      EXPECT_EQ(sb, 4) << c.label;
      if (t.amax_scope == AmaxScope::Tensor) {
        for (int64_t m : {0, 1, 1000}) EXPECT_EQ(rt::grouped_scale_capacity(s, {m, 64}, 5), 5 * sb) << c.label;
        ++checked;
      } else {
        // Per-channel: one entry per channel of a member; with one channel, one per member.
        const Shape2D one = s.dir == Direction::Rowwise ? Shape2D{1, 64} : Shape2D{64, 1};
        EXPECT_EQ(rt::grouped_scale_capacity(s, one, 5), 5 * sb) << c.label;
        ++checked;
      }
    }
  EXPECT_GT(checked, 4);
}

// The scale bytes come from the format table: fp32 scales take 4 bytes, e8m0 and e4m3 one, and
// a stream without scales needs none.
TEST(GroupedScaleCapacity, ScaleBytesFromTheFormatTable) {
  EXPECT_EQ(traits(ScaleStorage::None).bytes, 0);
  EXPECT_EQ(traits(ScaleStorage::F32).bytes, 4);
  EXPECT_EQ(traits(ScaleStorage::E8M0).bytes, 1);
  EXPECT_EQ(traits(ScaleStorage::E4M3).bytes, 1);
  for (ScaleStorage s : {ScaleStorage::None, ScaleStorage::F32, ScaleStorage::E8M0, ScaleStorage::E4M3})
    EXPECT_EQ(traits(s).id, s);
  EXPECT_EQ(name(ScaleStorage::E8M0), "e8m0");
  Stream identity;
  EXPECT_EQ(rt::grouped_scale_capacity(identity, {100, 64}, 3), 0);
}

// dequantize_grouped's scale check is the same rule: a scale buffer of exactly the capacity
// passes it (the call then stops at a too-small output, before any device work), one scale less
// fails it, for every stream with scales of every plan above.
TEST(GroupedScaleCapacity, DequantizeGroupedChecksTheScalesAgainstIt) {
  std::set<std::pair<std::string, std::string>> covered;
  int checked = 0;
  for (const Case& c : every_grouped_plan(covered)) {
    SCOPED_TRACE(c.label);
    for (const Shape2D total : {Shape2D{33, 66}, Shape2D{1, 2}, Shape2D{200, 320}}) {
      const int G = 3;
      for (const Stream& s : c.plan.streams) {
        const ScaleStorage storage = traits(s.scaling).scale_storage;
        if (storage == ScaleStorage::None) continue;
        const int64_t cap = rt::grouped_scale_capacity(s, total, G);
        const int64_t sb = traits(storage).bytes;
        uint64_t next = 0x10000000;
        auto buf = [&](int64_t bytes) {
          const rt::TensorView v{next, bytes, std::nullopt, {}};
          next += uint64_t(bytes + 4096) / 4096 * 4096;
          return v;
        };
        rt::DequantizeGroupedCall call;
        call.data = buf(1 << 20);
        call.scale = buf(cap);
        call.amax = buf(4 * G);
        call.member_rows = buf(8 * (G + 1));
        call.workspace = buf(rt::dequantize_grouped_workspace_bytes(G));
        call.out = buf(1);  // too small for any shape: the last check before the device
        call.num_members = G;
        auto run = [&](const rt::DequantizeGroupedCall& k) {
          return qf::testing::error_of([&] { rt::dequantize_grouped(s, total, k, DType::BF16, nullptr); });
        };
        const std::string fits = run(call);
        EXPECT_NE(fits.find("the dequantized"), std::string::npos) << fits;
        call.scale.bytes = cap - sb;
        const std::string short_by_one = run(call);
        EXPECT_NE(short_by_one.find("scales of a grouped input"), std::string::npos) << short_by_one;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
