"""qforge.torch on a GPU: the compiled binding's quantize bit for bit against the CPU reference for
every shipped recipe, role and usage; dequantize (every format, three dtypes) bit for bit against
the CPU reference dequantize; state_dict round trips; grouped member views; GEMMs (fused and the
mixed-format route) against float64 products of the dequantized operands; CUDA-graph capture;
torch.compile(fullgraph=True) with no graph break; bad arguments named before any launch.

Skips without torch or a CUDA GPU. Run (scripts/gpu_binding.sh does):
  QFORGE_EXTENSION=BUILD/python/qforge/_C*.so QFORGE_LIBRARY=BUILD/runtime/libqforge.so \
  python3 -m pytest -q tests/python/test_torch_binding.py
"""
import io
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import qforge  # noqa: E402
import qforge.torch as qt  # noqa: E402
from qforge import _ext  # noqa: E402

C = _ext.load()
RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.json") if p.name != "recipe.schema.json")
ROLES = ["linear:input", "linear:weight", "linear:grad_output"]


def cases():
    for path in RECIPES:
        r = qt.Recipes(str(path))
        for role in ROLES:
            for usage in ("training", "inference"):
                try:
                    q = r.quantizer(role, usage=usage)
                except qforge.UserError:
                    continue
                yield f"{path.stem}:{role}:{usage}", q


CASES = list(cases())


def make_input(m, k, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 2
    x[0, :6] = torch.tensor([0.0, 1e-30, 448.0, -500.0, 3e4, -1e-8])
    x[1, 1] = float("nan")  # a NaN element: every format's NaN rule, and dequantize's one NaN
    return x.to(dtype).cuda()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaNs included (torch.equal is False wherever either side holds a NaN, and every
    input of make_input holds one)."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(ints[a.dtype]),
                                                                     b.contiguous().view(ints[b.dtype]))


def host_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def scales_for(q):
    return [torch.full((1,), 0.75, device="cuda") for _ in q.inputs]


@pytest.mark.parametrize("name,q", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("shape", [(256, 512), (200, 320)])
def test_quantize_bit_exact(name, q, shape):
    m, k = shape
    x = make_input(m, k, seed=m + k)
    scales = scales_for(q)
    kw = {"seed": 7, "offset": 3}
    if scales:
        kw["scale"] = scales[0]
    if len(scales) > 1:
        kw["scale1"] = scales[1]
    try:
        t = q(x, **kw)
    except qforge.UserError as e:
        assert "shape" in str(e)  # a shape the plan cannot take (e.g. block multiples): refused, named
        return
    ref = dict(C.reference_quantize(q._c, host_bytes(x), m, k, 7, 3, [0.75] * len(scales)))
    got = t.buffers
    assert sorted(ref) == sorted(got)
    for buf, want in ref.items():
        assert host_bytes(got[buf]) == want, buf
    # Dequantize: every stream, every dtype, bit for bit against the CPU reference dequantize.
    for direction, s in t.streams.items():
        amax_name = f"{direction}_amax" if f"{direction}_amax" in ref else "amax"
        amax = float(np.frombuffer(ref[amax_name], np.float32)[0]) if amax_name in ref else 0.0
        for dtype, code in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            y = t.dequantize(dtype, direction)
            assert y.shape == (m, k)
            want = C.reference_dequantize(q._c, s.index, m, k, ref[f"{direction}_data"],
                                          ref.get(f"{direction}_scale_inv", b""), amax, code)
            stored = y.t() if s.layout == "transposed" else y
            assert host_bytes(stored) == want, (direction, code)


def test_state_dict_round_trip():
    q = qt.Recipes(str(ROOT / "recipes" / "hybrid_mxfp8_fwd_nvfp4_bwd.json")).quantizer("linear:grad_output")
    t = q(make_input(256, 512, 1), seed=11)
    f = io.BytesIO()
    torch.save(t.state_dict(), f)
    f.seek(0)
    u = qt.QuantizedTensor.from_state_dict(torch.load(f), q)
    for name, buf in t.buffers.items():
        assert torch.equal(buf.view(torch.uint8), u[name].view(torch.uint8)), name
    assert torch.equal(t.dequantize(torch.float32, "columnwise"), u.dequantize(torch.float32, "columnwise"))
    other = qt.Recipes(str(ROOT / "recipes" / "mxfp8.json")).quantizer("linear:grad_output")
    with pytest.raises(qforge.UserError, match="state: saved with recipe"):
        qt.QuantizedTensor.from_state_dict(t.state_dict(), other)


def test_grouped_member_views():
    r = qt.Recipes(str(ROOT / "recipes" / "mxfp8_hopper.json"))
    q = r.quantizer("grouped_linear:input", grouped=True)
    split = [128, 0, 96, 160]
    x = make_input(sum(split), 256, 5)
    rows = torch.tensor([0] + list(np.cumsum(split)), dtype=torch.int64, device="cuda")
    t = q(x, member_rows=rows, split=split)
    ref = dict(C.reference_quantize(q._c, host_bytes(x), sum(split), 256, 0, 0, [], split))
    for name, want in ref.items():  # the grouped buffers as the CPU reference writes them, member after member
        L = t.layout.buffers[t.layout.index(name)]
        assert host_bytes(t.buffer[L[6]:L[6] + len(want)]) == want, name
    members = t.member_views()
    single = r.quantizer("linear:input")
    start = 0
    for i, n in enumerate(split):
        if n:
            alone = single(x[start:start + n].contiguous())
            for name, buf in alone.buffers.items():
                assert torch.equal(buf.view(torch.uint8), members[i][name].view(torch.uint8)), (i, name)
            assert same(members[i].dequantize(torch.float32), alone.dequantize(torch.float32))
        start += n
    nosplit = q(x, member_rows=rows)
    with pytest.raises(qforge.UserError, match="split: this grouped tensor's member sizes live on the device"):
        nosplit.member_views()


def gemm_reference(a, b, a_dir, b_dir):
    # dequantize() gives the input's [M, K] orientation; a columnwise copy's GEMM operand is its
    # transpose [K, M], whether the copy is stored transposed or in the input's own layout (mxfp8.json).
    ta, tb = dq_operands(a, b, a_dir, b_dir)
    return ta @ tb.t()


def dq_operands(a, b, a_dir, b_dir):
    """Both GEMM operands [rows, K] in float64, dequantized in fp32."""
    A = a.dequantize(torch.float32, a_dir).double()
    B = b.dequantize(torch.float32, b_dir).double()
    ta = A.t() if a_dir == "columnwise" else A  # the GEMM's operand [rows, K]
    tb = B.t() if b_dir == "columnwise" else B
    return ta, tb


@pytest.mark.parametrize("recipe", ["current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8_hopper",
                                    "mxfp8", "nvfp4", "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr"])
def test_linear_gemms(recipe):
    r = qt.Recipes(str(ROOT / "recipes" / f"{recipe}.json"))
    M, N, K = 256, 384, 512
    qx, qw, qg = (r.quantizer(role) for role in ROLES)
    x, w, dy = make_input(M, K, 1), make_input(N, K, 2) * 0.1, make_input(M, N, 3)
    tx, tw, tg = qx(x), qw(w), qg(dy, seed=5)
    uses = [("fprop", tx, tw, "rowwise", "rowwise"), ("dgrad", tg, tw, "rowwise", "columnwise"),
            ("wgrad", tg, tx, "columnwise", "columnwise")]
    for what, a, b, ad, bd in uses:
        if ad not in a.streams or bd not in b.streams:
            continue
        d = qt.gemm(a, b, a_direction=ad, b_direction=bd, out_dtype=torch.float32)
        ref = gemm_reference(a, b, ad, bd)
        # The inputs' NaN element: wherever it reaches the product, the GEMM's result is not finite
        # either; the rest is compared by value.
        fin = torch.isfinite(ref)
        assert not torch.isfinite(d.double())[~fin].any(), (what, "a finite result where a NaN / Inf operand met")
        err = (d.double() - ref)[fin].abs().max().item()
        scale = ref[fin].abs().max().item()
        route = qt.gemm_plan(a, b, ad, bd, torch.float32).route
        assert err <= 2e-3 * scale + 1e-6, (what, route, err, scale)
        if route == "dequant_mixed":
            # The operands' copies are exact (NVFP4's S_dec is the GEMM's alpha): what is left is the
            # fp32 sums (at most an fp32 ulp of the running sum of |a b| per step, K steps), the alpha
            # multiply and the reference's own fp32 dequantize, each element against sum_k |a_k b_k|.
            ta, tb = dq_operands(a, b, ad, bd)
            bound = (ta.abs() @ tb.abs().t())[fin]
            k = ta.shape[1]
            elem = (d.double() - ref)[fin].abs()
            assert (elem <= (k + 4) * 2.0 ** -22 * bound + 1e-30).all(), (what, (elem / bound).max().item())


def same_outputs(a, b) -> bool:
    """Every output of two quantizes of one layout, byte for byte (the allocation's bytes between the
    outputs are never written)."""
    return all(torch.equal(a[n[0]].view(torch.uint8), b[n[0]].view(torch.uint8)) for n in a.layout.buffers)


LINEAR_RECIPES = ["delayed_scaling", "current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8", "mxfp8_hopper",
                  "nvfp4", "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr"]


@pytest.mark.parametrize("recipe", LINEAR_RECIPES)
def test_fused_linear_forward_equals_the_separate_ops(recipe):
    # qt.linear_forward (one call into the compiled core) against qx(x), qw(w) and gemm: the same
    # launches in the same order, so the same bits, with the weight quantized or its copy kept.
    r = qt.Recipes(str(ROOT / "recipes" / f"{recipe}.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    x, w = make_input(256, 512, 1), make_input(384, 512, 2) * 0.1
    kx, kw = {"seed": 11, "offset": 4}, {"seed": 12, "offset": 5}
    if qx.inputs:
        kx["scale"] = torch.full((1,), 0.75, device="cuda")
    if qw.inputs:
        kw["scale"] = torch.full((1,), 0.5, device="cuda")
    fx = {f"x_{k}": v for k, v in kx.items()}
    fw = {f"w_{k}": v for k, v in kw.items()}
    for out_dtype in (torch.bfloat16, torch.float32):
        tx, tw = qx(x, **kx), qw(w, **kw)
        want = qt.gemm(tx, tw, out_dtype=out_dtype)
        y, ux, uw = qt.linear_forward(x, w, qx, qw, out_dtype=out_dtype, **fx, **fw)
        assert same(y, want), (recipe, out_dtype)
        assert same_outputs(ux, tx) and same_outputs(uw, tw)
        assert (ux.m, ux.k, uw.m, uw.k) == (256, 512, 384, 512)
        y2, ux2, uw2 = qt.linear_forward(x, None, qx, qw, w_copy=tw, out_dtype=out_dtype, **fx)
        assert uw2 is tw and same(y2, want) and same_outputs(ux2, tx)
    with pytest.raises(qforge.UserError, match="w: pass either the weight or its kept copy"):
        qt.linear_forward(x, w, qx, qw, w_copy=tw)
    with pytest.raises(qforge.UserError, match=r"w: expected shape \[384, 256\], got \[384, 512\]"):
        qt.linear_forward(x[:, :256].contiguous(), w, qx, qw)


def test_fused_linear_forward_in_a_cuda_graph_and_under_compile():
    r = qt.Recipes(str(ROOT / "recipes" / "nvfp4.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    x, w = make_input(1024, 1024, 1), make_input(1024, 1024, 2) * 0.1
    want = qt.linear_forward(x, w, qx, qw)[0]  # the first call compiles / loads: before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = qt.linear_forward(x, w, qx, qw)[0]
    x.copy_(make_input(1024, 1024, 9))
    g.replay()
    torch.cuda.synchronize()
    assert same(y, qt.gemm(qx(x), qw(w)))
    assert not same(y, want)

    r = qt.Recipes(str(ROOT / "recipes" / "float8_block_scaling.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    x, w = make_input(256, 512, 1), make_input(384, 512, 2)

    def f(x, w):
        y, a, b = qt.linear_forward(x, w, qx, qw)
        y2 = qt.linear_forward(x, None, qx, qw, w_copy=b, out_dtype=torch.float32)[0]
        return y, y2, a.dequantize(torch.bfloat16), b.dequantize(torch.float32, "columnwise")

    eager = f(x, w)
    explain = torch._dynamo.explain(f)(x, w)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(f, fullgraph=True)(x, w)
    for e, c in zip(eager, compiled):
        assert same(e, c)
    assert same(eager[0], qt.gemm(qx(x), qw(w)))


def test_mixed_formats_take_the_dequant_route():
    r = qt.Recipes(str(ROOT / "recipes" / "hybrid_mxfp8_fwd_nvfp4_bwd.json"))
    tw = r.quantizer("linear:weight")(make_input(256, 512, 2))
    tg = r.quantizer("linear:grad_output")(make_input(128, 256, 3), seed=1)
    assert qt.gemm_plan(tg, tw, "rowwise", "columnwise").route == "dequant_mixed"


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_same_layout_copies_take_the_transposing_route(out_dtype):
    # mxfp8.json keeps its columnwise copies in the input's [M, K] layout: dgrad and wgrad dequantize
    # them transposed into bf16 (exact for MXFP8) and run the bf16 GEMM, so they equal the bf16 GEMM
    # of the dequantized operands transposed by torch.
    r = qt.Recipes(str(ROOT / "recipes" / "mxfp8.json"))
    M, N, K = 256, 384, 512
    qx, qw, qg = (r.quantizer(role) for role in ROLES)
    finite = [torch.nan_to_num(make_input(m, k, seed)) for m, k, seed in ((M, K, 1), (N, K, 2), (M, N, 3))]
    tx, tw, tg = qx(finite[0]), qw(finite[1] * 0.1), qg(finite[2])
    for a, b, ad, bd, shape in ((tg, tw, "rowwise", "columnwise", (M, K)),
                                (tg, tx, "columnwise", "columnwise", (N, K))):
        assert qt.gemm_plan(a, b, ad, bd, out_dtype).route == "dequant_transpose"
        d = qt.gemm(a, b, a_direction=ad, b_direction=bd, out_dtype=out_dtype)
        assert d.shape == shape and d.dtype == out_dtype
        A, B = a.dequantize(torch.bfloat16, ad), b.dequantize(torch.bfloat16, bd)
        assert torch.equal(A.double(), a.dequantize(torch.float32, ad).double())  # bf16 holds MXFP8 exactly
        ta = A.t() if ad == "columnwise" else A
        want = (ta.float() @ B.float()).to(out_dtype)  # B's operand is B.t(): D = ta @ B
        ref = ta.double() @ B.double()
        # bf16 out: its own rounding is up to 2^-9 of a value (about 2e-3), on top of the sums'.
        err, tol = (d.double() - ref).abs().max().item(), 4e-3 * ref.abs().max().item()
        assert err <= tol, (ad, bd, err)
        assert (d.double() - want.double()).abs().max().item() <= tol
    acc = torch.zeros(N, K, device="cuda")
    qt.gemm(tg, tx, a_direction="columnwise", b_direction="columnwise", accumulate_into=acc)
    qt.gemm(tg, tx, a_direction="columnwise", b_direction="columnwise", accumulate_into=acc)
    once = qt.gemm(tg, tx, a_direction="columnwise", b_direction="columnwise", out_dtype=torch.float32)
    assert torch.equal(acc, once + once)
    # The grouped GEMMs have no transposing route: GroupedLinear refuses the recipe at construction.
    with pytest.raises(qforge.UserError, match="the columnwise copy has the input's own"):
        qt.GroupedLinear(4, 256, 256, recipes=r, name="moe", device="cuda")


def test_plan_tables_are_bounded_and_free_device_memory():
    import gc
    from qforge.torch import _plans
    r = qt.Recipes(str(ROOT / "recipes" / "current_scaling.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    w = qw(make_input(128, 256, 2))
    qt.set_plan_cache_size(1)
    try:
        gc.collect()
        base = C.live_plan_buffers()  # the one plan left in the table, and any a caller still holds
        qt.set_plan_cache_size(4)
        for m in range(16, 16 * 11, 16):  # ten shapes: ten plans, each with its device offsets once run
            x = make_input(m, 256, m)
            d = qt.gemm(qx(x), w, out_dtype=torch.float32)
            assert d.shape == (m, 128)
        assert len(_plans) == 4 and _plans.evictions >= 6
        gc.collect()
        assert C.live_plan_buffers() <= base + 4
        held = qt.gemm_plan(qx(make_input(16, 256, 1)), w, out_dtype=torch.float32)  # in the table
        for m in range(512, 512 + 16 * 6, 16):
            qt.gemm(qx(make_input(m, 256, m)), w)
        assert held.m == 16  # evicted from the table, alive while held
        with pytest.raises(qforge.UserError, match="size: plan cache size: expected a positive integer"):
            qt.set_plan_cache_size(0)
    finally:
        qt.set_plan_cache_size(256)


def _bits(t):
    return t.contiguous().view(torch.int32)


def test_history_batch_is_bit_identical_to_per_tensor_updates():
    # Every delayed-scaling tensor in one launch: each entry by its own rule and format (e4m3 input
    # and weight, e5m2 grad_output here), equal bit for bit to the per-tensor kernel and the CPU
    # reference over several steps, amax 0 / Inf / NaN keeping the previous scale.
    r = qt.Recipes(str(ROOT / "recipes" / "delayed_scaling.json"))
    qs = [r.quantizer(role) for role in ROLES] * 2  # six tensors, two of each role
    n = qs[0].history_length()
    g = torch.Generator(device="cpu").manual_seed(3)
    hist = [(torch.rand(n, generator=g) * 100).cuda() for _ in qs]
    scale = [torch.full((1,), 1.0 + i, device="cuda") for i in range(len(qs))]
    inv = [torch.zeros(1, device="cuda") for _ in qs]
    amax = [torch.zeros(1, device="cuda") for _ in qs]
    p_hist, p_scale, p_inv = [h.clone() for h in hist], [s.clone() for s in scale], [i.clone() for i in inv]
    c_hist, c_scale = [h.cpu().tolist() for h in hist], [s.item() for s in scale]
    batch = qt.HistoryBatch([(q, h, a, s, i) for q, h, a, s, i in zip(qs, hist, amax, scale, inv)])
    assert batch.size == len(qs) and batch.launches == 1
    special = [0.0, float("inf"), float("nan"), 1e-30, 3e38]
    for step in range(5):
        for i, q in enumerate(qs):
            a = special[(step + i) % 5] if (step + i) % 3 == 0 else float(torch.rand(1, generator=g) * 500)
            amax[i].fill_(a)
            q.update_amax_history(p_hist[i], amax[i], p_scale[i], scale_inv=p_inv[i])
            c_hist[i], c_scale[i] = C.reference_update_amax_history(q._c, 0, c_hist[i], a, c_scale[i])
        batch.run()
        torch.cuda.synchronize()
        for i in range(len(qs)):
            assert torch.equal(_bits(hist[i]), _bits(p_hist[i])), (step, i)
            assert torch.equal(_bits(hist[i].cpu()), _bits(torch.tensor(c_hist[i], dtype=torch.float32))), (step, i)
            assert torch.equal(_bits(scale[i]), _bits(p_scale[i])), (step, i)
            assert torch.equal(_bits(scale[i].cpu()), _bits(torch.tensor([c_scale[i]], dtype=torch.float32))), (step, i)
            assert torch.equal(_bits(inv[i]), _bits(p_inv[i])), (step, i)
    before = [h.clone() for h in hist]
    batch.run(noop=torch.ones(1, device="cuda"))  # a skipped step: nothing moves
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(hist, before))
    # Captured in a CUDA graph (built before capture: the table upload is not capturable).
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        batch.run()
    for i, q in enumerate(qs):
        q.update_amax_history(p_hist[i], amax[i], p_scale[i], scale_inv=p_inv[i])
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(hist, p_hist))
    with pytest.raises(qforge.UserError, match=r"items\[1\]\.history: overlaps items\[0\]\.history"):
        qt.HistoryBatch([(qs[0], hist[0], amax[0], scale[0]), (qs[1], hist[0], amax[1], scale[1])])
    with pytest.raises(qforge.UserError, match=r"items\[0\]\.history: expected 1024 elements"):
        qt.HistoryBatch([(qs[0], hist[0][:10], amax[0], scale[0])])
    mx = qt.Recipes(str(ROOT / "recipes" / "mxfp8.json")).quantizer("linear:input")
    with pytest.raises(qforge.UserError, match=r"items\[0\]: expected a delayed-scaling quantizer"):
        qt.HistoryBatch([(mx, hist[0], amax[0], scale[0])])


def test_amax_out_takes_the_tensor_amax():
    r = qt.Recipes(str(ROOT / "recipes" / "delayed_scaling.json"))
    q = r.quantizer("linear:input")
    x = torch.nan_to_num(make_input(256, 512, 4))  # a finite amax, so the two compare equal
    s = torch.full((1,), 0.5, device="cuda")
    want = q(x, scale=s)
    amax = torch.full((1,), -1.0, device="cuda")
    got = q(x, scale=s, amax_out=amax)
    name = [b[0] for b in want.layout.buffers if b[1] == "amax"][0]
    assert torch.equal(amax, want[name])
    for b in want.layout.buffers:
        if b[1] != "amax":
            assert torch.equal(got[b[0]].view(torch.uint8), want[b[0]].view(torch.uint8)), b[0]
    with pytest.raises(qforge.UserError, match="amax_out: the quantizer writes no single per-tensor amax"):
        qt.Recipes(str(ROOT / "recipes" / "mxfp8.json")).quantizer("linear:input")(x, amax_out=amax)
    buf = torch.empty(want.buffer.numel(), dtype=torch.uint8, device="cuda")
    into = q(x, scale=s, out=buf)
    assert into.buffer.data_ptr() == buf.data_ptr()
    for b in want.layout.buffers:
        assert torch.equal(into[b[0]].view(torch.uint8), want[b[0]].view(torch.uint8)), b[0]
    with pytest.raises(qforge.UserError, match="out: expected"):
        q(x, scale=s, out=buf[:-1])


def test_cuda_graph_capture():
    r = qt.Recipes(str(ROOT / "recipes" / "mxfp8_hopper.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    x, w = make_input(1024, 1024, 1), make_input(1024, 1024, 2)

    def step():
        return qt.gemm(qx(x), qw(w))

    want = step()  # the first call compiles / loads: before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = step()
    x.copy_(make_input(1024, 1024, 9))
    g.replay()
    torch.cuda.synchronize()
    assert same(y, step())
    assert not same(y, want)


def test_torch_compile_fullgraph():
    r = qt.Recipes(str(ROOT / "recipes" / "float8_block_scaling.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    x, w = make_input(256, 512, 1), make_input(384, 512, 2)

    def f(x, w):
        a, b = qx(x), qw(w)
        return qt.gemm(a, b), a.dequantize(torch.bfloat16)

    eager = f(x, w)
    explain = torch._dynamo.explain(f)(x, w)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(f, fullgraph=True)(x, w)
    for e, c in zip(eager, compiled):
        assert same(e, c)


def test_bad_arguments_are_named():
    r = qt.Recipes(str(ROOT / "recipes" / "current_scaling.json"))
    q = r.quantizer("linear:input")
    x = make_input(128, 256, 1)
    with pytest.raises(qforge.UserError, match="x: expected bfloat16, got float32"):
        q(x.float())
    with pytest.raises(qforge.UserError, match="x: expected a CUDA tensor"):
        q(x.cpu())
    with pytest.raises(qforge.UserError, match="x: expected a contiguous tensor"):
        q(make_input(256, 256, 1)[:, :128])
    with pytest.raises(qforge.UserError, match="noop: expected 1 element"):
        q(x, noop=torch.zeros(2, device="cuda"))
    t = q(x)
    with pytest.raises(qforge.UserError, match="direction"):
        t.dequantize(torch.float32, "diagonal")
    w = r.quantizer("linear:weight")(make_input(64, 128, 2))
    with pytest.raises(qforge.UserError, match="b: the operands' reduction lengths differ"):
        qt.gemm(t, w)
    w2 = r.quantizer("linear:weight")(make_input(64, 256, 2))
    out = torch.full((3, 3), 7.0, device="cuda")
    with pytest.raises(qforge.UserError, match=r"out: expected shape \[128, 64\], got \[3, 3\]"):
        qt.gemm(t, w2, accumulate_into=out)
    assert torch.all(out == 7.0)  # refused before any launch
    d = torch.zeros(128, 64, device="cuda")
    qt.gemm(t, w2, accumulate_into=d)
    qt.gemm(t, w2, accumulate_into=d)
    torch.testing.assert_close(d, 2 * qt.gemm(t, w2, out_dtype=torch.float32), rtol=0, atol=0, equal_nan=True)
