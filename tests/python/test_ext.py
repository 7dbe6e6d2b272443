"""qforge._C, the compiled core of the Python package, without torch or a GPU.

Layouts (every shipped recipe's quantizers: the same buffers as the C API reports, each in its own
aligned, disjoint range of one allocation), grouped member layouts, GEMM plans and their routes
(fused where a kernel reads both formats, the mixed dequant route for the hybrid's dgrad, the
transposing dequant route for copies kept in the input's layout; docs/python.md's route table), the
CPU reference dequantize (near the input by each format's step; exact for identity copies), and
errors raised as the package's own classes with the argument named.

Run:  QFORGE_EXTENSION=BUILD/python/qforge/_C*.so QFORGE_LIBRARY=BUILD/runtime/libqforge.so \
      python3 -m pytest -q tests/python/test_ext.py
"""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import qforge  # noqa: E402
from qforge import _ext  # noqa: E402

try:
    C = _ext.load()
except ImportError as e:  # a build without nanobind: nothing to test here
    pytest.skip(f"qforge._C not built: {e}", allow_module_level=True)

RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.json") if p.name != "recipe.schema.json")
ROLES = ["linear:input", "linear:weight", "linear:grad_output"]


def quantizers():
    for path in RECIPES:
        ctx = C.Context([str(path)])
        for role in ROLES:
            for usage in ("training", "inference"):
                try:
                    yield path.stem, role, usage, ctx.quantizer(role, None, "bf16", usage)
                except qforge.UserError as e:
                    assert "role" in str(e) or "no rule" in str(e), e  # a recipe without that role


def test_layouts_match_the_c_api():
    seen = 0
    for name, role, usage, q in quantizers():
        cq = qforge.Context(str(ROOT / "recipes" / f"{name}.json")).quantizer(role, usage=usage)
        L = q.layout(256, 512)
        want = [(b.name, b.bytes, list(b.shape)) for b in cq.outputs(256, 512)]
        got = [(b[0], b[7], b[5]) for b in L.buffers]
        assert got == want, (name, role, usage)
        end = 0
        for b in L.buffers:  # aligned, disjoint, inside the allocation
            assert b[6] % 256 == 0 and b[6] >= end
            end = b[6] + b[7]
        assert L.nbytes >= end + L.workspace_bytes
        assert q.layout(256, 512) is L  # kept per shape
        seen += 1
    assert seen >= 30


def test_grouped_member_layouts_tile_the_capacity():
    ctx = C.Context([str(ROOT / "recipes" / "mxfp8_hopper.json")])
    q = ctx.quantizer("grouped_linear:input", None, "bf16", "training", True)
    L = q.layout(384, 256, 3)
    members = q.member_layouts(L, [128, 0, 256])
    assert [m.m for m in members] == [128, 0, 256]
    for name in ("rowwise_data", "columnwise_data"):
        base = L.buffers[L.index(name)][6]
        offs = [m.buffers[m.index(name)][6] for m in members]
        sizes = [m.buffers[m.index(name)][7] for m in members]
        assert offs[0] == base and offs[1] == base + sizes[0] and offs[2] == offs[1] + sizes[1]
    with pytest.raises(qforge.UserError, match="split: the members' rows sum to 300"):
        q.member_layouts(L, [100, 100, 100])
    with pytest.raises(qforge.UserError, match="split: expected 3 member row counts"):
        q.member_layouts(L, [384])


def bf16_input(m, k, seed=0):
    import ml_dtypes
    x = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32) * 3
    x[0, :4] = [0.0, 1e-30, 448.0, -500.0]
    return x.astype(ml_dtypes.bfloat16)


# Largest |dequantized - input| allowed, as a fraction of the block's (tensor's, channel's) amax: the
# format's half step at the top of its range plus the scale's own rounding.
STEP = {"e4m3": 2 ** -3, "e5m2": 2 ** -2, "e2m1": 0.34, "int8": 1 / 100, "bf16": 0, "fp16": 2 ** -10}


def test_reference_dequantize_is_near_the_input():
    m, k = 128, 256
    xb = bf16_input(m, k)
    x = xb.astype(np.float32)
    checked = set()
    for name, role, usage, q in quantizers():
        outs = dict(C.reference_quantize(q, xb.tobytes(), m, k, scales=[448.0 / 512] * len(q.inputs)))
        for s in q.streams:
            if s.rht or s.stochastic and s.format == "e2m1":
                continue  # Hadamard-domain values; covered on the GPU against the same reference
            d = s.direction
            amax = outs.get(f"{d}_amax", outs.get("amax", np.zeros(1, np.float32).tobytes()))
            y = np.frombuffer(C.reference_dequantize(q, s.index, m, k, outs[f"{d}_data"],
                                                     outs.get(f"{d}_scale_inv", b""),
                                                     float(np.frombuffer(amax, np.float32)[0]), "fp32"),
                              np.float32)
            y = y.reshape((k, m)).T if s.layout == "transposed" else y.reshape((m, k))
            bound = STEP[s.data_dtype] * np.abs(x).max()
            assert np.abs(y - x).max() <= bound, (name, role, usage, d, np.abs(y - x).max(), bound)
            checked.add((s.format, s.scaling))
    assert {("e4m3", "mx"), ("e2m1", "nvfp4"), ("int8", "per_channel"), ("e4m3", "block")} <= checked


def test_gemm_plans_pick_their_route():
    hy = C.Context([str(ROOT / "recipes" / "hybrid_mxfp8_fwd_nvfp4_bwd.json")])
    x, w, dy = (hy.quantizer(r) for r in ROLES)
    M, N, K = 256, 128, 512
    Lx, Lw, Ldy = x.layout(M, K), w.layout(N, K), dy.layout(M, N)
    fprop = C.GemmPlan(x, Lx, 0, w, Lw, 0)
    assert (fprop.m, fprop.n, fprop.k) == (M, N, K) and fprop.route == "auto"
    dgrad = C.GemmPlan(dy, Ldy, 0, w, Lw, 1)  # MXFP8 rowwise x NVFP4 columnwise: mixed formats
    assert (dgrad.m, dgrad.n, dgrad.k) == (M, K, N) and dgrad.route == "dequant_mixed"
    wgrad = C.GemmPlan(dy, Ldy, 1, x, Lx, 1)  # NVFP4 x NVFP4, both transposed: the fused kernel
    assert (wgrad.m, wgrad.n, wgrad.k) == (N, K, M) and wgrad.route == "auto"
    bw = C.Context([str(ROOT / "recipes" / "float8_block_scaling.json")])
    bx, bwt, bdy = (bw.quantizer(r) for r in ROLES)
    wg = C.GemmPlan(bdy, bdy.layout(M, N), 1, bx, bx.layout(M, K), 1)  # 1x128 x 1x128: K-grouped, one group
    assert wg.route == "fused" and "k-grouped" in wg.describe()
    mx = C.Context([str(ROOT / "recipes" / "mxfp8.json")])  # columnwise copies in the input's layout
    mx_x, mw, mg = (mx.quantizer(r) for r in ROLES)
    # dgrad reads W's [N, K] copy as its transpose B = W^T [K, N]; wgrad both [M, .] copies as
    # A = dY^T [N, M], B = X^T [K, M]: dequantized transposed, then the bf16 GEMM.
    mdgrad = C.GemmPlan(mg, mg.layout(M, N), 0, mw, mw.layout(N, K), 1)
    assert (mdgrad.m, mdgrad.n, mdgrad.k) == (M, K, N) and mdgrad.route == "dequant_transpose"
    mwgrad = C.GemmPlan(mg, mg.layout(M, N), 1, mx_x, mx_x.layout(M, K), 1)
    assert (mwgrad.m, mwgrad.n, mwgrad.k) == (N, K, M) and mwgrad.route == "dequant_transpose"
    assert "bf16 x bf16" in mwgrad.describe()
    # Both bf16 copies live in the workspace ahead of the GEMM's own: 2 bytes per element each.
    assert mwgrad.workspace_bytes() >= 2 * (N * M + K * M)
    mx_gx = mx.quantizer("grouped_linear:input", None, "bf16", "training", True)
    mx_gg = mx.quantizer("grouped_linear:grad_output", None, "bf16", "training", True)
    with pytest.raises(qforge.UserError, match="a_direction: the columnwise copy has the input's own"):
        C.GroupedGemmPlan(mx_gg, mx_gg.layout(512, N, 4), 1, mx_gx, mx_gx.layout(512, K, 4), 1, True)
    with pytest.raises(qforge.UserError, match="b: the operands' reduction lengths differ"):
        C.GemmPlan(x, Lx, 0, w, Lw, 1)
    with pytest.raises(qforge.UserError, match="out_dtype: expected bf16 or fp32, got fp16"):
        C.GemmPlan(x, Lx, 0, w, Lw, 0, "fp16")


def test_mixed_route_keeps_an_alpha_slot_and_fused_linear_calls_check_first():
    # The hybrid's dgrad (MXFP8 x NVFP4): both bf16 copies, then one aligned slot for NVFP4's decode
    # scale S_dec, which the dequantize writes and the bf16 GEMM takes as its alpha (the copies stay
    # exact). mxfp8.json's transposing route has no NVFP4 operand and no slot.
    M, N, K = 256, 128, 512
    hy = C.Context([str(ROOT / "recipes" / "hybrid_mxfp8_fwd_nvfp4_bwd.json")])
    x, w, dy = (hy.quantizer(r) for r in ROLES)
    Lx, Lw, Ldy = x.layout(M, K), w.layout(N, K), dy.layout(M, N)
    dgrad = C.GemmPlan(dy, Ldy, 0, w, Lw, 1)
    copies = 2 * M * N + 2 * K * N
    assert dgrad.route == "dequant_mixed" and dgrad.workspace_bytes() == copies + 256
    mx = C.Context([str(ROOT / "recipes" / "mxfp8.json")])
    mg, mw = mx.quantizer("linear:grad_output"), mx.quantizer("linear:weight")
    mdgrad = C.GemmPlan(mg, mg.layout(M, N), 0, mw, mw.layout(N, K), 1)
    assert mdgrad.route == "dequant_transpose" and mdgrad.workspace_bytes() == copies
    # linear_backward refuses a plan whose A is not the grad_output quantize it runs, before any launch.
    zeros = [0] * 14
    with pytest.raises(qforge.UserError, match="dgrad: the plan's A is not this grad_output quantize"):
        C.linear_backward(x, Lx, dgrad, None, *zeros, 0, 0)
    with pytest.raises(qforge.UserError, match="wgrad: the plan's A is not this grad_output quantize"):
        C.linear_backward(dy, dy.layout(128, N), None, dgrad, *zeros, 0, 0)
    # A history update needs the quantize's one per-tensor amax: refused before the quantize.
    bs = C.Context([str(ROOT / "recipes" / "float8_block_scaling.json")])
    bx, bw = bs.quantizer("linear:input"), bs.quantizer("linear:weight")
    fprop = C.GemmPlan(bx, bx.layout(M, K), 0, bw, bw.layout(N, K), 0)
    with pytest.raises(qforge.UserError, match="history: the quantizer writes no single per-tensor amax"):
        fprop.linear_forward(1 << 32, 1 << 33, 0, 0, 0, 0, 0, 1 << 34, 0, 1 << 35, 0, 0, 0, 0, 0, 0, 1 << 36, 0, 0, 0)


def test_errors_name_the_argument():
    with pytest.raises(qforge.UserError, match="nope.json"):
        C.Context([str(ROOT / "recipes" / "nope.json")])
    ctx = C.Context([str(ROOT / "recipes" / "nvfp4.json")])
    with pytest.raises(qforge.UserError, match="dtype: expected bf16, fp16 or fp32"):
        ctx.quantizer("linear:input", None, "int4")
    with pytest.raises(qforge.UserError, match="usage"):
        ctx.quantizer("linear:input", None, "bf16", "sometimes")
    q = ctx.quantizer("linear:input")
    with pytest.raises(qforge.UserError, match="even"):
        q.layout(3, 7)
    with pytest.raises(qforge.UserError, match="members: only grouped quantizers"):
        q.layout(16, 16, 2)
    with pytest.raises(qforge.UserError, match="x: expected 512 bytes"):
        C.reference_quantize(q, b"\0" * 8, 16, 16)


def test_plans_refuse_what_would_be_silently_wrong():
    import json
    nv = {"format": "e2m1", "scaling": {"mode": "nvfp4", "block": [16, 1]}, "layout": "transposed"}
    row = {"format": "e2m1", "scaling": {"mode": "nvfp4", "block": [1, 16]}}
    text = json.dumps({"qforge_recipe": 1, "name": "rht_on_inputs_only", "usage": "training", "roles": [
        {"match": "*:input", "rowwise": row, "columnwise": dict(nv, rht=True)},
        {"match": ["*:weight", "*:grad_output"], "rowwise": row, "columnwise": nv}]})
    ctx = C.Context.from_json(text)
    x, g = ctx.quantizer("linear:input"), ctx.quantizer("linear:grad_output")
    M, N, K = 256, 128, 512
    # wgrad of a Hadamard-transformed input against an untransformed gradient: not dY^T X.
    with pytest.raises(qforge.UserError, match="b_direction: the operands were transformed differently"):
        C.GemmPlan(g, g.layout(M, N), 1, x, x.layout(M, K), 1)
    hy = C.Context([str(ROOT / "recipes" / "hybrid_mxfp8_fwd_nvfp4_bwd.json")])
    gx = hy.quantizer("grouped_linear:input", None, "bf16", "training", True)
    gw = hy.quantizer("grouped_linear:weight", None, "bf16", "training", True)
    Lgx, Lgw = gx.layout(512, K, 4), gw.layout(4 * N, K, 4)
    with pytest.raises(qforge.UserError, match="a: a grouped quantize: its members take GroupedGemmPlan"):
        C.GemmPlan(gx, Lgx, 0, gw, Lgw, 0)
    with pytest.raises(qforge.UserError, match="a_direction: the M-grouped GEMMs read A's tokens along its rows"):
        C.GroupedGemmPlan(gw, Lgw, 1, gw, Lgw, 0)
    with pytest.raises(qforge.UserError, match="layout: a grouped quantize dequantizes per member"):
        gx.dequantize(Lgx, 0, 0x1000, 0x2000, "fp32", 0, 0)
    with pytest.raises(qforge.UserError, match="data: expected the rowwise_data buffer of 65536 bytes, got 3"):
        C.reference_dequantize(x, 0, M, K, b"abc", b"", 0.0, "fp32")
    with pytest.raises(qforge.UserError, match="m, k"):
        C.reference_dequantize(x, 0, -1, -1, b"", b"", 0.0, "fp32")


def _route_rows():
    """(recipe, gemm, operands, route, kernel) of every shipped recipe's fprop, dgrad and wgrad at
    M = N = K = 1024, as docs/python.md's route table lists them."""
    M = N = K = 1024
    gemms = (("fprop", "linear:input", 0, (M, K), "linear:weight", 0, (N, K)),
             ("dgrad", "linear:grad_output", 0, (M, N), "linear:weight", 1, (N, K)),
             ("wgrad", "linear:grad_output", 1, (M, N), "linear:input", 1, (M, K)))
    for path in RECIPES:
        ctx = C.Context([str(path)])
        for gemm, ra, da, sa, rb, db, sb in gemms:
            try:
                qa, qb = ctx.quantizer(ra), ctx.quantizer(rb)
            except qforge.UserError:
                yield path.stem, gemm, "role missing", "-", "-"
                continue
            a, b = qa.streams[da], qb.streams[db]
            plan = C.GemmPlan(qa, qa.layout(*sa), da, qb, qb.layout(*sb), db)
            yield (path.stem, gemm, f"{a.format}/{a.scaling} x {b.format}/{b.scaling}", plan.route, plan.describe())


def test_every_shipped_recipes_gemms_are_constructible_as_the_docs_list_them():
    rows = list(_route_rows())
    for recipe, gemm, operands, route, kernel in rows:
        assert route in ("fused", "auto", "dequant_mixed", "dequant_transpose", "-"), (recipe, gemm, route)
    mx = {g: r for rec, g, _, r, _ in rows if rec == "mxfp8"}
    assert mx == {"fprop": "auto", "dgrad": "dequant_transpose", "wgrad": "dequant_transpose"}
    text = (ROOT / "docs" / "python.md").read_text()
    table = text[text.index("| recipe | GEMM | operands | route | kernel |"):].split("\n\n")[0].splitlines()[2:]
    documented = [tuple(c.strip() for c in line.strip("|").split("|")) for line in table]
    assert documented == rows, "docs/python.md's route table differs from the plans:\n" + "\n".join(
        "| " + " | ".join(r) + " |" for r in rows)


def test_history_batch_checks_its_items_without_a_gpu():
    ctx = C.Context([str(ROOT / "recipes" / "delayed_scaling.json")])
    x, g = ctx.quantizer("linear:input"), ctx.quantizer("linear:grad_output")
    n = x.history_length(0)

    def item(q, base):  # device addresses: (quantizer, input, history, amax, scale, scale_inv)
        return (q, 0, base, base + 0x10000, base + 0x10100, 0)

    with pytest.raises(qforge.UserError, match=r"items: expected at least one"):
        C.HistoryBatch([], 0)
    a, b = item(x, 0x100000), item(g, 0x200000)
    with pytest.raises(qforge.UserError, match=r"items\[1\]\.history: overlaps items\[0\]\.history, which the same"):
        C.HistoryBatch([a, (g, 0, a[2] + 4 * (n - 1), b[3], b[4], 0)], 0)
    with pytest.raises(qforge.UserError, match=r"items\[1\]\.amax: overlaps items\[0\]\.scale"):
        C.HistoryBatch([a, (g, 0, b[2], a[4], b[4], 0)], 0)
    with pytest.raises(qforge.UserError, match=r"items\[0\]\.scale"):
        C.HistoryBatch([(x, 0, a[2], a[3], 0x100001, 0)], 0)  # misaligned
    with pytest.raises(qforge.UserError, match=r"scale: the quantizer has no scale input 3"):
        C.HistoryBatch([(x, 3, a[2], a[3], a[4], 0)], 0)


def test_reference_history_update():
    ctx = C.Context([str(ROOT / "recipes" / "delayed_scaling.json")])
    g = ctx.quantizer("linear:grad_output")  # e5m2, the recipe's margin and window
    n = g.history_length(0)
    hist, scale = C.reference_update_amax_history(g, 0, [2.0] + [0.0] * (n - 1), 8.0, 1.0)
    assert hist[:3] == [8.0, 2.0, 0.0] and len(hist) == n
    assert scale == 57344.0 / 8.0  # e5m2's largest finite value over the window's max, margin 0
    hist, kept = C.reference_update_amax_history(g, 0, [0.0] * n, float("nan"), 3.0)
    assert kept == 3.0  # a non-finite window keeps the scale
    with pytest.raises(qforge.UserError, match="history: expected 1024 slots, got 2"):
        C.reference_update_amax_history(g, 0, [1.0, 2.0], 1.0, 1.0)


def test_tensor_map_cache_stats():
    """(hits, misses, entries) of the GEMMs' tensor-map cache: counts, which no GEMM has moved in a
    process without a GPU (runtime/tensor_map_cache.h; its logic: tests/unit/tensor_map_cache_test.cpp)."""
    stats = C.tensor_map_cache_stats()
    assert len(stats) == 3 and all(isinstance(v, int) and v >= 0 for v in stats), stats
