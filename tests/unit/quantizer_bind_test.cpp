// rt::Quantizer::bind: the argument checks of every quantize call and the launch arguments they
// yield, on the CPU (fake device addresses; nothing is launched). Every shipped recipe's buffers
// land in the right argument slots; each kind of bad argument is refused with a message naming
// it; the per-shape layouts bind() keeps give the same answer as a fresh quantizer across more
// shapes than it keeps, from several threads at once, and a shape refused once is refused again.
#include <gtest/gtest.h>

#include "error_of.h"

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "runtime/quantizer.h"

namespace {

using namespace qf;

using qf::testing::error_of;

Plan plan_of(const std::string& recipe, const char* role = "linear:input", Usage u = Usage::Training) {
  return compile_plan(load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/" + recipe + ".json"),
                      PlanRequest{role, DType::BF16, u, false});
}

// A call with every buffer at its own 256-aligned fake address, each exactly the size asked for.
struct FakeCall {
  rt::QuantizeCall call;
  std::vector<BufferDesc> outs, ins;
};
FakeCall fake_call(const rt::Quantizer& q, Shape2D shape) {
  FakeCall f;
  uint64_t next = uint64_t(1) << 40;
  auto take = [&](int64_t bytes) {
    const uint64_t p = next;
    next += (uint64_t(bytes) + 511) / 256 * 256;
    return p;
  };
  f.call.shape = shape;
  f.call.input = rt::TensorView{take(shape.m * shape.k * 2), shape.m * shape.k * 2, DType::BF16, {}};
  f.outs = q.outputs(shape);
  f.ins = q.inputs();
  for (const auto& b : f.outs) f.call.buffers[b.name] = rt::TensorView{take(b.bytes), b.bytes, std::nullopt, {}};
  for (const auto& b : f.ins) f.call.buffers[b.name] = rt::TensorView{take(4), 4, std::nullopt, {}};
  const int64_t ws = q.workspace_bytes(shape);
  if (ws > 0) f.call.workspace = rt::TensorView{take(ws), ws, std::nullopt, {}};
  return f;
}

TEST(QuantizerBind, EveryShippedRecipeFillsItsArgumentSlots) {
  int plans = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(QF_SOURCE_DIR) + "/recipes")) {
    const auto path = entry.path();
    if (path.extension() != ".json" || path.filename() == "recipe.schema.json") continue;
    for (const char* role : {"linear:input", "linear:weight", "linear:grad_output"}) {
      Plan plan;
      try {
        plan = plan_of(path.stem().string(), role);
      } catch (const UserError&) {
        continue;
      }
      SCOPED_TRACE(path.stem().string() + " " + role);
      const rt::Quantizer q(plan);
      const FakeCall f = fake_call(q, Shape2D{256, 512});
      const rt::BoundCall bc = q.bind(f.call);
      EXPECT_EQ(uint64_t(reinterpret_cast<uintptr_t>(bc.args.x)), f.call.input.ptr);
      EXPECT_EQ(bc.args.m, 256);
      EXPECT_EQ(bc.args.k, 512);
      EXPECT_EQ(bc.args.num_members, 1);
      int zeroed = 0;
      for (const auto& b : f.outs) {
        const uint64_t given = f.call.buffers.at(b.name).ptr;
        if (b.kind == BufferKind::Data) {
          EXPECT_EQ(reinterpret_cast<uintptr_t>(bc.args.streams[b.stream].data), given) << b.name;
        }
        if (b.kind == BufferKind::ScaleInv) {
          EXPECT_EQ(reinterpret_cast<uintptr_t>(bc.args.streams[b.stream].scale_inv), given) << b.name;
        }
        if (b.kind == BufferKind::Amax) {
          bool found = false;
          for (float* a : bc.args.amax) found |= reinterpret_cast<uintptr_t>(a) == given;
          EXPECT_TRUE(found) << b.name << " is no amax argument";
        }
        const bool zero = b.kind == BufferKind::Amax || (b.kind == BufferKind::ScaleInv && b.zero_padding);
        bool listed = false;
        for (int i = 0; i < bc.num_zero; ++i) listed |= bc.zero[size_t(i)].ptr == given && bc.zero[size_t(i)].bytes == b.bytes;
        EXPECT_EQ(listed, zero) << b.name;
        zeroed += zero;
      }
      EXPECT_EQ(bc.num_zero, zeroed + (f.call.workspace.bytes > 0));
      for (size_t i = 0; i < plan.streams.size(); ++i) {
        const bool delayed = std::holds_alternative<PerTensorDelayed>(plan.streams[i].scaling);
        const uint64_t want = delayed ? f.call.buffers.at(scale_input_name(plan, plan.streams[i])).ptr : 0;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(bc.args.streams[i].scale_in), want) << "stream " << i;
      }
      ++plans;
    }
  }
  EXPECT_GT(plans, 20);
}

TEST(QuantizerBind, BadArgumentsAreNamed) {
  const rt::Quantizer q(plan_of("delayed_scaling"));
  const Shape2D shape{256, 512};
  {
    FakeCall f = fake_call(q, shape);
    f.call.buffers.erase("rowwise_scale_inv");
    EXPECT_EQ(error_of([&] { q.bind(f.call); }), "rowwise_scale_inv: missing buffer argument \"rowwise_scale_inv\"");
  }
  {
    FakeCall f = fake_call(q, shape);
    f.call.buffers.erase("scale");
    EXPECT_EQ(error_of([&] { q.bind(f.call); }), "scale: missing buffer argument \"scale\"");
  }
  {
    // An unknown name is reported before a missing one.
    FakeCall f = fake_call(q, shape);
    f.call.buffers.erase("rowwise_data");
    f.call.buffers["rowwise_dat"] = rt::TensorView{uint64_t(1) << 44, 16, std::nullopt, {}};
    EXPECT_EQ(error_of([&] { q.bind(f.call); }), "rowwise_dat: this plan has no buffer named \"rowwise_dat\"");
  }
  {
    FakeCall f = fake_call(q, shape);
    f.call.buffers["columnwise_data"].bytes -= 1;
    EXPECT_EQ(error_of([&] { q.bind(f.call); }),
              "argument columnwise_data: buffer of 131071 bytes is smaller than the 131072 bytes required");
  }
  {
    FakeCall f = fake_call(q, shape);
    f.call.input.bytes -= 2;
    EXPECT_EQ(error_of([&] { q.bind(f.call); }),
              "argument input: buffer of 262142 bytes is smaller than the 262144 bytes required for input [256, 512]");
  }
  {
    FakeCall f = fake_call(q, shape);
    f.call.input.dtype = DType::FP16;
    EXPECT_EQ(error_of([&] { q.bind(f.call); }), "argument input: holds fp16, expected bf16");
  }
  {
    FakeCall f = fake_call(q, shape);
    f.call.buffers["rowwise_data"].ptr += 8;
    EXPECT_EQ(error_of([&] { q.bind(f.call); }),
              "argument rowwise_data: pointer " + rt::format_pointer(f.call.buffers["rowwise_data"].ptr) +
                  " is not 16-byte aligned");
  }
  {
    // An output overlapping another output, and one overlapping the input.
    FakeCall f = fake_call(q, shape);
    f.call.buffers["columnwise_data"].ptr = f.call.buffers["rowwise_data"].ptr + 256;
    EXPECT_NE(error_of([&] { q.bind(f.call); }).find("overlaps argument"), std::string::npos);
    FakeCall g = fake_call(q, shape);
    g.call.buffers["rowwise_data"].ptr = g.call.input.ptr;
    EXPECT_EQ(error_of([&] { q.bind(g.call); }).rfind("argument rowwise_data: buffer [", 0), 0u);
    EXPECT_NE(error_of([&] { q.bind(g.call); }).find("overlaps argument"), std::string::npos);
  }
  {
    FakeCall f = fake_call(q, shape);
    f.call.member_rows = 0x1000;
    f.call.num_members = 0;
    EXPECT_EQ(error_of([&] { q.bind(f.call); }), "num_members: expected 1..2^20 members, got 0");
  }
}

TEST(QuantizerBind, WorkspaceIsCheckedAndZeroed) {
  const rt::Quantizer q(plan_of("fp8_rowwise"));
  const Shape2D shape{256, 512};
  FakeCall f = fake_call(q, shape);
  ASSERT_GT(f.call.workspace.bytes, 0);
  const rt::BoundCall bc = q.bind(f.call);
  EXPECT_EQ(bc.zero[size_t(bc.num_zero - 1)].ptr, f.call.workspace.ptr);
  EXPECT_EQ(bc.zero[size_t(bc.num_zero - 1)].bytes, f.call.workspace.bytes);
  EXPECT_TRUE(bc.zero[size_t(bc.num_zero - 1)].fused_zeroes);  // the one-launch form zeroes it itself
  f.call.workspace.bytes -= 1;
  EXPECT_NE(error_of([&] { q.bind(f.call); }).find("argument workspace: buffer of"), std::string::npos);
}

// More shapes than the quantizer keeps, round-robin, twice: each call is checked against its own
// shape's sizes (a buffer one byte short of that shape's size is refused, with that size).
TEST(QuantizerBind, KeptLayoutsMatchEachShape) {
  const Plan plan = plan_of("nvfp4");
  const rt::Quantizer q(plan);
  std::vector<Shape2D> shapes;
  for (int i = 1; i <= 24; ++i) shapes.push_back(Shape2D{16 * i, 64 * (1 + i % 5)});
  for (int round = 0; round < 2; ++round)
    for (const Shape2D s : shapes) {
      SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.k));
      FakeCall f = fake_call(q, s);
      EXPECT_EQ(q.bind(f.call).args.m, s.m);
      const rt::Quantizer fresh(plan);
      const BufferDesc want = fresh.outputs(s).back();
      f.call.buffers[want.name].bytes = want.bytes - 1;
      EXPECT_EQ(error_of([&] { q.bind(f.call); }),
                "argument " + want.name + ": buffer of " + std::to_string(want.bytes - 1) +
                    (want.bytes - 1 == 1 ? " byte" : " bytes") + " is smaller than the " +
                    std::to_string(want.bytes) + " bytes required");
    }
}

TEST(QuantizerBind, RefusedShapeStaysRefused) {
  const rt::Quantizer q(plan_of("nvfp4"));  // RHT on the columnwise copy: M a multiple of 16
  FakeCall f = fake_call(q, Shape2D{64, 64});
  f.call.shape = Shape2D{40, 64};
  const std::string first = error_of([&] { q.bind(f.call); });
  EXPECT_NE(first.find("must be a multiple of 16"), std::string::npos) << first;
  EXPECT_EQ(error_of([&] { q.bind(f.call); }), first);
}

TEST(QuantizerBind, ConcurrentCallsOfManyShapes) {
  const rt::Quantizer q(plan_of("mxfp8"));
  std::vector<std::thread> threads;
  std::vector<int> bad(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const Shape2D s{32 * (1 + (i + t) % 20), 64};
        FakeCall f = fake_call(q, s);
        try {
          const rt::BoundCall bc = q.bind(f.call);
          bad[size_t(t)] += bc.args.m != s.m || reinterpret_cast<uintptr_t>(bc.args.streams[0].data) !=
                                                    f.call.buffers.at("rowwise_data").ptr;
        } catch (const std::exception&) {
          ++bad[size_t(t)];
        }
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(bad[size_t(t)], 0) << "thread " << t;
}

}  // namespace
