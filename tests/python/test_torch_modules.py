"""qforge.torch's modules on a GPU: Linear's forward and backward against float64 products of the
operands quantized by the same quantizers (whose outputs the binding tests check bit for bit against
the CPU reference), convert's role assignment and its errors, the inference path, the weight's
quantized copy kept across micro-batches, delayed-scaling state, a checkpoint resume whose next
loss is bit-identical, GroupedLinear (the hybrid's dgrad per expert on the dense mixed route, bit
for bit), and activation checkpointing (qt.checkpoint's replay bit for bit against no
checkpointing; plain torch.utils.checkpoint where it is exact, refused where not). Skips without
torch or a CUDA GPU.
"""
import io
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import qforge  # noqa: E402
import qforge.torch as qt  # noqa: E402


def recipes(name):
    return qt.Recipes(str(ROOT / "recipes" / f"{name}.json"))


def rnd(*shape, seed=0, scale=1.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).cuda()


def quantize_like(lin, t, x, offset):
    """What lin._quantize did for tensor type t, without its side effects."""
    q = lin.roles[(t, "training")]
    kw = {}
    if q.inputs:
        kw["scale"] = torch.ones(1, device="cuda")
    if any(s.stochastic for s in q.streams.values()):
        kw["seed"], kw["offset"] = lin.sr_seed + ("input", "weight", "grad_output").index(t), offset
    return q(x, **kw)


def dq(t, direction):
    v = t.dequantize(torch.float32, direction).double()
    return v  # [M, K] logical orientation


@pytest.mark.parametrize("name", ["current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8_hopper", "mxfp8",
                                  "nvfp4", "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr"])
def test_linear_forward_backward(name):
    lin = qt.Linear(512, 384, bias=True, recipes=recipes(name), name="layer", device="cuda")
    with torch.no_grad():
        lin.weight.copy_(rnd(384, 512, seed=1, scale=0.05))
        lin.bias.copy_(rnd(384, seed=2))
    x = rnd(2, 128, 512, seed=3).requires_grad_()
    g = rnd(2, 128, 384, seed=4)
    off0 = lin.sr_calls
    y = lin(x)
    off_g = lin.sr_calls
    y.backward(g)
    x2, g2 = x.detach().reshape(256, 512), g.reshape(256, 384)
    qx = quantize_like(lin, "input", x2, off0)
    qw = quantize_like(lin, "weight", lin.weight.detach(), off0 + 1 if any(
        s.stochastic for s in lin.roles[("input", "training")].streams.values()) else off0)
    qg = quantize_like(lin, "grad_output", g2, off_g)
    # Each product against float64 of the dequantized operands, directions as the module uses them.
    y_ref = dq(qx, "rowwise") @ dq(qw, "rowwise").t() + lin.bias.double()
    dx_ref = dq(qg, "rowwise") @ dq(qw, "columnwise")
    dw_ref = dq(qg, "columnwise").t() @ dq(qx, "columnwise")
    for what, got, ref, tol in (("y", y.reshape(256, 384), y_ref, 1e-2), ("dx", x.grad.reshape(256, 512), dx_ref, 1.5e-2),
                                ("dw", lin.weight.grad, dw_ref, 1.5e-2), ("db", lin.bias.grad, g2.double().sum(0), 1e-2)):
        err = (got.double() - ref).abs().max().item()
        assert err <= tol * ref.abs().max().item() + 1e-3, (what, err, ref.abs().max().item())


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(ints[a.dtype]),
                                                                     b.contiguous().view(ints[b.dtype]))


STEP_RECIPES = ["delayed_scaling", "current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8_hopper", "mxfp8",
                "nvfp4", "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr"]


@pytest.mark.parametrize("name", STEP_RECIPES)
def test_linear_step_equals_the_separate_ops(name):
    # Forward and backward each run as one call into the compiled core: the same launches as the
    # separate quantize and gemm calls, so the same bits, and the same delayed-scaling state.
    lin = qt.Linear(512, 384, bias=True, recipes=recipes(name), name="layer", device="cuda")
    with torch.no_grad():
        lin.weight.copy_(rnd(384, 512, seed=1, scale=0.05))
        lin.bias.copy_(rnd(384, seed=2))
    x = rnd(256, 512, seed=3).requires_grad_()
    g = rnd(256, 384, seed=4)
    off0 = lin.sr_calls
    y = lin(x)
    off_g = lin.sr_calls
    y.backward(g)
    sr_in = any(s.stochastic for s in lin.roles[("input", "training")].streams.values())
    qx = quantize_like(lin, "input", x.detach(), off0)
    qw = quantize_like(lin, "weight", lin.weight.detach(), off0 + 1 if sr_in else off0)
    qg = quantize_like(lin, "grad_output", g, off_g)
    dt = lin._gemm_dtype
    assert same(y, qt.gemm(qx, qw, out_dtype=dt) + lin.bias)
    assert same(x.grad, qt.gemm(qg, qw, b_direction="columnwise", out_dtype=dt))
    assert same(lin.weight.grad, qt.gemm(qg, qx, a_direction="columnwise", b_direction="columnwise", out_dtype=dt))
    assert same(lin.bias.grad, g.sum(0))
    for t, qt_ in (("input", qx), ("weight", qw), ("grad_output", qg)):
        q = lin.roles[(t, "training")]
        if not q.inputs:
            continue
        hist, scale = torch.zeros(q.history_length(0), device="cuda"), torch.ones(1, device="cuda")
        q.update_amax_history(hist, qt_[qt.modules._amax_name(qt_)], scale)
        assert torch.equal(hist, getattr(lin, f"{t}_amax_history")) and torch.equal(scale, getattr(lin, f"{t}_scale")), t
    if lin.roles[("input", "training")].inputs:
        return  # the next input quantize takes the updated scale
    # A second micro-batch: the weight's kept copy, the input quantized again.
    off1 = lin.sr_calls
    x2 = rnd(256, 512, seed=5).requires_grad_()
    y2 = lin(x2, is_first_microbatch=False)
    assert same(y2, qt.gemm(quantize_like(lin, "input", x2.detach(), off1), lin._wcache[1], out_dtype=dt) + lin.bias)
    off3 = lin.sr_calls
    with torch.no_grad():  # the inference quantizers, the same rule
        y3 = lin(x2)
    q_inf = lin.roles[("input", "inference")]
    kw = {"seed": lin.sr_seed, "offset": off3} if any(s.stochastic for s in q_inf.streams.values()) else {}
    assert lin._wcache[0][1] == "inference"
    assert same(y3, qt.gemm(q_inf(x2.detach(), **kw), lin._wcache[1], out_dtype=dt) + lin.bias)


def test_main_grad_accumulates_the_fused_wgrad():
    lin = qt.Linear(256, 128, bias=False, recipes=recipes("float8_block_scaling"), name="m", device="cuda",
                    accumulate_main_grad=True)
    x = rnd(128, 256, seed=1).requires_grad_()
    g = rnd(128, 128, seed=2)
    lin(x).backward(g)
    lin(x).backward(g)
    qx = quantize_like(lin, "input", x.detach(), 0)
    qg = quantize_like(lin, "grad_output", g, 0)
    want = torch.zeros(128, 256, device="cuda")
    for _ in range(2):
        qt.gemm(qg, qx, a_direction="columnwise", b_direction="columnwise", accumulate_into=want)
    assert lin.weight.grad is None
    assert torch.equal(lin.weight.main_grad, want)


def test_convert_assigns_roles_by_name():
    text = json.dumps({"qforge_recipe": 1, "name": "per_layer", "usage": "training", "roles": [
        {"match": ["*:input", "*:weight", "*:grad_output"],
         "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"},
         "columnwise": {"format": "e4m3", "scaling": "per_tensor_current"}},
        {"match": "linear:weight:layers.1",
         "rowwise": {"format": "e4m3", "scaling": {"mode": "block", "block": [128, 128]}},
         "columnwise": {"format": "e4m3", "scaling": {"mode": "block", "block": [128, 128]}}}]})
    model = nn.Sequential()
    model.layers = nn.ModuleList([nn.Linear(256, 256), nn.Linear(256, 256)])
    model = model.cuda().to(torch.bfloat16)
    w1 = model.layers[1].weight
    qt.convert(model, qt.Recipes.from_json(text))
    assert isinstance(model.layers[0], qt.Linear) and model.layers[1].weight is w1
    assert model.layers[0].roles[("weight", "training")].streams["rowwise"].scaling == "per_tensor_current"
    assert model.layers[1].roles[("weight", "training")].streams["rowwise"].scaling == "block"
    only_inputs = json.dumps({"qforge_recipe": 1, "name": "inputs_only", "usage": "training", "roles": [
        {"match": "*:input", "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"},
         "columnwise": {"format": "e4m3", "scaling": "per_tensor_current"}}]})
    with pytest.raises(qforge.UserError, match=r"module 0: role linear:weight:0"):
        qt.convert(nn.Sequential(nn.Linear(256, 256)).cuda(), qt.Recipes.from_json(only_inputs))
    with pytest.raises(qforge.UserError, match=r"module 0: role linear:input \(training\) cannot take \[128, 255\]"):
        qt.convert(nn.Sequential(nn.Linear(255, 256)).cuda().to(torch.bfloat16), recipes("nvfp4"))


def test_inference_path_and_weight_cache():
    lin = qt.Linear(256, 256, recipes=recipes("hybrid_mxfp8_fwd_nvfp4_bwd"), name="l", device="cuda")
    x = rnd(128, 256, seed=5)
    with torch.no_grad():
        y = lin(x)
    assert lin._wcache[0][1] == "inference"
    assert list(lin._wcache[1].streams) == ["rowwise"]  # inference writes the forward copy alone
    qx = lin.roles[("input", "inference")](x)
    assert torch.equal(y, qt.gemm(qx, lin._wcache[1]) + lin.bias)
    x.requires_grad_()
    lin(x).sum().backward()
    first = lin._wcache[1]
    lin(x).sum().backward()  # a second micro-batch: the weight is unchanged, its copy is reused
    assert lin._wcache[1] is first
    torch.optim.SGD(lin.parameters(), lr=0.1).step()
    lin(x).sum().backward()
    assert lin._wcache[1] is not first


def test_delayed_scaling_state():
    lin = qt.Linear(256, 256, recipes=recipes("delayed_scaling"), name="d", device="cuda")
    x = rnd(128, 256, seed=6, scale=3).requires_grad_()
    lin(x).sum().backward()
    assert lin.input_amax_history[0].item() == x.detach().abs().max().float().item()
    assert lin.input_scale.item() != 1.0
    sd = lin.state_dict()
    assert {"input_amax_history", "input_scale", "weight_scale", "grad_output_amax_history"} <= set(sd)


def test_batched_amax_update_equals_the_per_quantize_updates():
    # Each tensor is quantized once per step, so rolling its history right after its quantize
    # (each_quantize) or for the whole model after backward (batched, one launch) leaves the same
    # histories and scales after every step, and the same losses.
    def model(update):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).cuda().to(torch.bfloat16)
        return qt.convert(m, recipes("delayed_scaling"), amax_update=update)

    a, b = model("each_quantize"), model("batched")
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.05), torch.optim.SGD(b.parameters(), lr=0.05)
    for step in range(4):
        x = rnd(256, 256, seed=200 + step, scale=1.0 + step)
        losses = []
        for m, o in ((a, oa), (b, ob)):
            loss = (m(x).float() ** 2).mean()
            o.zero_grad()
            loss.backward()
            o.step()
            losses.append(loss.item())
        assert qt.update_amax_histories(a) == 0  # nothing batched there
        assert qt.update_amax_histories(b) == 6  # two layers x input, weight, grad_output
        assert losses[0] == losses[1], (step, losses)
        sa, sb = a.state_dict(), b.state_dict()
        keys = [k for k in sa if k.endswith("_amax_history") or k.endswith("_scale")]
        assert len(keys) == 12
        for k in keys:
            assert torch.equal(sa[k].view(torch.int32), sb[k].view(torch.int32)), (step, k)
    batch = qt.history_batch(b)
    assert batch.launches == 1 and batch.size == 6
    assert qt.history_batch(a) is None
    assert "0.input_amax" not in b.state_dict()  # per-step state: checkpoints load under either mode
    a.load_state_dict(b.state_dict())
    with pytest.raises(qforge.UserError, match="amax_update: expected one of"):
        qt.Linear(256, 256, recipes=recipes("delayed_scaling"), name="x", device="cuda", amax_update="lazy")


def test_is_first_microbatch():
    lin = qt.Linear(256, 256, recipes=recipes("current_scaling"), name="mb", device="cuda")
    x = rnd(128, 256, seed=8).requires_grad_()
    lin(x, is_first_microbatch=True).sum().backward()
    first = lin._wcache[1]
    with torch.no_grad():
        lin.weight.mul_(2.0)  # the version counter moves: None would quantize again
    y_false = lin(x, is_first_microbatch=False)
    assert lin._wcache[1] is first  # False: the kept copy, though the weight changed
    assert torch.equal(y_false, qt.gemm(lin.roles[("input", "training")](x.detach()), first).to(torch.bfloat16)
                       + lin.bias)
    lin(x, is_first_microbatch=True)
    assert lin._wcache[1] is not first
    second = lin._wcache[1]
    lin(x)  # None: unchanged weight, the kept copy
    assert lin._wcache[1] is second
    with pytest.raises(qforge.UserError, match="module mb: is_first_microbatch: expected None, a bool"):
        lin(x, is_first_microbatch=1)
    experts = qt.GroupedLinear(2, 256, 256, recipes=recipes("current_scaling"), name="ex", device="cuda")
    offsets = torch.tensor([0, 128, 256], dtype=torch.int64, device="cuda")
    xs = rnd(256, 256, seed=10)
    with torch.no_grad():
        experts(xs, offsets, is_first_microbatch=True)
        kept = experts._wcache[1]
        experts.weight.mul_(2.0)
        experts(xs, offsets, is_first_microbatch=False)
        assert experts._wcache[1] is kept
        experts(xs, offsets)  # None: the version counter moved
        assert experts._wcache[1] is not kept


def test_is_first_microbatch_flag_in_a_cuda_graph():
    # A device flag: one captured graph serves every micro-batch; the weight's quantize is replayed
    # each time and skipped on the device where the flag is 0.0.
    lin = qt.Linear(256, 256, bias=False, recipes=recipes("float8_block_scaling"), name="g", device="cuda")
    x = rnd(128, 256, seed=9)
    flag = torch.ones(1, device="cuda")
    with torch.no_grad():
        lin(x, is_first_microbatch=flag)  # before capture: compiles, allocates the kept copy
        kept = lin._wflag[1]
        lin(x, is_first_microbatch=flag)
        assert lin._wflag[1] is kept
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = lin(x, is_first_microbatch=flag)
        w0 = lin.weight.detach().clone()
        lin.weight.mul_(-1.0)
        flag.fill_(0.0)  # not the first micro-batch: the copy of the old weight stays
        graph.replay()
        torch.cuda.synchronize()
        q_in = lin.roles[("input", "inference")]
        q_w = lin.roles[("weight", "inference")]
        assert torch.equal(y, qt.gemm(q_in(x), q_w(w0)))
        flag.fill_(1.0)  # the first micro-batch of the next step: quantized again in place
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, qt.gemm(q_in(x), q_w(lin.weight.detach())))
    with pytest.raises(qforge.UserError, match="is_first_microbatch: expected float32"):
        lin(x, is_first_microbatch=torch.ones(1, device="cuda", dtype=torch.int64))


def small_model(name):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).cuda().to(torch.bfloat16)
    return qt.convert(m, recipes(name))


def train_step(m, opt, step):
    x = rnd(256, 256, seed=100 + step)
    loss = (m(x).float() ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def test_mxfp8_trains():
    # mxfp8.json's backward GEMMs read its same-layout columnwise copies transposed (the
    # dequant_transpose route): a small model's loss falls and stays finite.
    m = small_model("mxfp8")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = rnd(256, 256, seed=7)
    losses = []
    for _ in range(20):
        loss = (m(x).float() ** 2).mean()
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_checkpoint_resume_is_bit_identical():
    m = small_model("nvfp4")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for s in range(3):
        train_step(m, opt, s)
    f = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, f)
    want = [train_step(m, opt, s) for s in (3, 4)]
    f.seek(0)
    ck = torch.load(f, weights_only=False)
    m2 = small_model("nvfp4")
    m2.load_state_dict(ck["model"])
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    opt2.load_state_dict(ck["opt"])
    assert [train_step(m2, opt2, s) for s in (3, 4)] == want
    m3 = small_model("mxfp8_hopper")
    with pytest.raises(qforge.UserError, match="checkpoint saved under recipe"):
        m3.load_state_dict(ck["model"])


@pytest.mark.parametrize("name", ["current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8_hopper", "nvfp4",
                                  "hybrid_mxfp8_fwd_nvfp4_bwd"])
def test_grouped_linear_forward_backward(name):
    G, K, N = 4, 256, 384
    split = [128, 0, 256, 128]
    offsets = torch.tensor([0, 128, 128, 384, 512], dtype=torch.int64, device="cuda")
    lin = qt.GroupedLinear(G, K, N, recipes=recipes(name), name="experts", device="cuda")
    with torch.no_grad():
        lin.weight.copy_(rnd(G, N, K, seed=1, scale=0.05))
    x = rnd(512, K, seed=3).requires_grad_()
    g = rnd(512, N, seed=4)
    off0 = lin.sr_calls
    y = lin(x, offsets)
    off_g = lin.sr_calls
    y.backward(g)

    def members(t, data, rows, member_split, offset):
        q = lin.q[t]
        kw = {}
        if any(s.stochastic for s in q.streams.values()):
            kw["seed"], kw["offset"] = lin.sr_seed + ("input", "weight", "grad_output").index(t), offset
        return q(data, member_rows=rows, split=member_split, **kw).member_views()

    w_off = lin.weight_offsets
    sr_in = any(s.stochastic for s in lin.q["input"].streams.values())
    mx = members("input", x.detach(), offsets, split, off0)
    mw = members("weight", lin.weight.detach().reshape(G * N, K), w_off, [N] * G, off0 + sr_in)
    mg = members("grad_output", g, offsets, split, off_g)
    start = 0
    for e, n in enumerate(split):
        if n:
            rows = slice(start, start + n)
            y_ref = dq(mx[e], "rowwise") @ dq(mw[e], "rowwise").t()
            dx_ref = dq(mg[e], "rowwise") @ dq(mw[e], "columnwise")
            dw_ref = dq(mg[e], "columnwise").t() @ dq(mx[e], "columnwise")
            for what, got, ref in (("y", y[rows], y_ref), ("dx", x.grad[rows], dx_ref), ("dw", lin.weight.grad[e], dw_ref)):
                err = (got.double() - ref).abs().max().item()
                assert err <= 1.5e-2 * ref.abs().max().item() + 1e-3, (e, what, err)
        else:
            assert torch.all(lin.weight.grad[e] == 0)
        start += n


def test_grouped_linear_hybrid_dgrad_is_the_dense_mixed_route_per_expert():
    # No grouped GEMM reads the hybrid's dgrad pair (dy's MXFP8 rowwise copy x W's NVFP4 columnwise
    # copy): it runs per expert on the dense GEMM's exact mixed route, each member copied out of its
    # grouped allocation. A member's copy is what the dense quantize of its rows writes (MXFP8's 1 x 32
    # blocks lie within a row; NVFP4's per-tensor amax is per member), so each expert's rows of dx are
    # qt.gemm of the dense quantizes bit for bit; the other GEMMs stay grouped.
    G, K, N = 4, 256, 384
    split = [128, 0, 256, 128]
    offsets = torch.tensor([0, 128, 128, 384, 512], dtype=torch.int64, device="cuda")
    r = recipes("hybrid_mxfp8_fwd_nvfp4_bwd")
    lin = qt.GroupedLinear(G, K, N, recipes=r, name="experts", device="cuda")
    assert lin._dense is not None
    with torch.no_grad():
        lin.weight.copy_(rnd(G, N, K, seed=1, scale=0.05))
    q_g, q_w = r.quantizer("grouped_linear:grad_output:experts"), r.quantizer("grouped_linear:weight:experts")
    for step in range(2):  # the second micro-batch: the weight's dense copies are kept with its grouped copy
        x = rnd(512, K, seed=3 + step).requires_grad_()
        g = rnd(512, N, seed=5 + step)
        lin(x, offsets).backward(g)
        kept = lin._wdense
        assert kept is not None and kept[0] is lin._wcache[1]
        if step == 0:
            first = kept[1]
        else:
            assert kept[1] is first
        start = 0
        for e, n in enumerate(split):
            if n:
                rows = slice(start, start + n)
                want = qt.gemm(q_g(g[rows]), q_w(lin.weight.detach()[e]), b_direction="columnwise")
                assert same(x.grad[rows], want), (step, e)
            start += n
    # The split is read on the host: offsets that do not tile the tokens are refused, naming the module.
    short = torch.tensor([0, 128, 128, 384, 480], dtype=torch.int64, device="cuda")
    qg = lin.q["grad_output"](rnd(512, N, seed=8), member_rows=offsets)
    with pytest.raises(qforge.UserError, match=r"module experts: offsets: the last row offset is 480, expected "
                                               r"x's 512 rows"):
        lin._dgrad_per_expert(qg, lin._wcache[1], short)


def test_second_backward_and_captured_per_expert_dgrad_are_refused():
    # The first backward releases the quantized copies a layer saved: a second one (retain_graph) is a
    # UserError, not a crash inside the GEMM call.
    lin = qt.Linear(256, 128, bias=False, recipes=recipes("float8_block_scaling"), name="m", device="cuda")
    x = rnd(128, 256, seed=1).requires_grad_()
    y = lin(x)
    y.backward(rnd(128, 128, seed=2), retain_graph=True)
    with pytest.raises(qforge.UserError, match="a second backward through a qforge module"):
        y.backward(rnd(128, 128, seed=2))
    # The hybrid's per-expert dgrad reads the split on the host: under capture it is refused by name.
    r = recipes("hybrid_mxfp8_fwd_nvfp4_bwd")
    moe = qt.GroupedLinear(2, 256, 256, recipes=r, name="experts", device="cuda")
    offsets = torch.tensor([0, 128, 256], dtype=torch.int64, device="cuda")
    qg = moe.q["grad_output"](rnd(256, 256, seed=3), member_rows=offsets)
    moe(rnd(256, 256, seed=4), offsets)  # the weight's grouped copy
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(qforge.UserError, match="module experts: the per-expert dgrad .* CUDA-graph capture"):
            with torch.cuda.graph(graph, stream=stream):
                moe._dgrad_per_expert(qg, moe._wcache[1], offsets)


def test_grouped_linear_hybrid_trains():
    # Two experts' MLP on the hybrid recipe: the loss falls and every gradient stays finite.
    torch.manual_seed(0)
    r = recipes("hybrid_mxfp8_fwd_nvfp4_bwd")
    fc1 = qt.GroupedLinear(2, 256, 512, recipes=r, name="fc1", device="cuda")
    fc2 = qt.GroupedLinear(2, 512, 256, recipes=r, name="fc2", device="cuda")
    params = [fc1.weight, fc2.weight]
    opt = torch.optim.AdamW(params, lr=1e-2)
    offsets = torch.tensor([0, 128, 256], dtype=torch.int64, device="cuda")
    x = rnd(256, 256, seed=11)
    losses = []
    for _ in range(20):
        loss = (fc2(torch.nn.functional.gelu(fc1(x, offsets)), offsets).float() ** 2).mean()
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in params)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_grouped_linear_refuses_what_it_cannot_run():
    # mxfp8.json keeps same-layout columnwise copies, which no grouped GEMM reads (dgrad and wgrad).
    with pytest.raises(qforge.UserError, match="module moe: the recipe's grouped GEMMs"):
        qt.GroupedLinear(4, 256, 256, recipes=recipes("mxfp8"), name="moe", device="cuda")
    lin = qt.GroupedLinear(4, 256, 256, recipes=recipes("float8_block_scaling"), name="moe", device="cuda")
    with pytest.raises(qforge.UserError, match=r"offsets: expected 5 row offsets, got 3"):
        lin(rnd(128, 256), torch.tensor([0, 64, 128], device="cuda"))


def test_fp32_weights_run_with_fp32_results():
    m = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 128, bias=False)).cuda()  # fp32
    qt.convert(m, recipes("float8_block_scaling"))
    x = torch.randn(128, 256, device="cuda", requires_grad=True)
    y = m(x)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.dtype == torch.float32 and m[0].weight.grad.dtype == torch.float32
    assert torch.isfinite(m[2].weight.grad).all()


def nvfp4_sr_input():
    """nvfp4.json with stochastic rounding on the input's rowwise copy: an SR draw in the forward."""
    d = json.loads((ROOT / "recipes" / "nvfp4.json").read_text())
    d["name"] = "nvfp4_sr_input"
    for role in d["roles"]:
        if role["match"] == "*:input":
            role["rowwise"]["rounding"] = "stochastic"
    return qt.Recipes.from_json(json.dumps(d))


CHECKPOINT_RECIPES = ["delayed_scaling", "float8_block_scaling", "hybrid_mxfp8_fwd_nvfp4_bwd", "nvfp4_sr_input"]


def checkpoint_recipes(name):
    return nvfp4_sr_input() if name == "nvfp4_sr_input" else recipes(name)


@pytest.mark.parametrize("name", CHECKPOINT_RECIPES)
def test_checkpoint_replays_the_forwards_quantizes(name):
    # The same model trained with qt.checkpoint over it and without: the recompute replays each
    # module call's quantizes (the SR offset and delayed-scaling scale it started from, the weight's
    # copy it used), so every loss, gradient, SR counter and delayed-scaling state is bit-identical.
    def model():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).cuda().to(torch.bfloat16)
        return qt.convert(m, checkpoint_recipes(name))

    a, b = model(), model()
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.05), torch.optim.SGD(b.parameters(), lr=0.05)
    for step in range(3):
        xa = rnd(256, 256, seed=300 + step, scale=1.0 + step).requires_grad_()
        xb = xa.detach().clone().requires_grad_()
        la = (a(xa).float() ** 2).mean()
        yb = qt.checkpoint(b, xb)
        assert isinstance(yb.grad_fn.qx, tuple)  # the input's copy went to save_for_backward: dropped, recomputed
        lb = (yb.float() ** 2).mean()
        for m, o, loss in ((a, oa, la), (b, ob, lb)):
            o.zero_grad()
            loss.backward()
        assert la.item() == lb.item(), step
        assert same(xa.grad, xb.grad), step
        for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
            assert same(pa.grad, pb.grad), (step, n)
        assert [m.sr_calls for m in a if isinstance(m, qt.Linear)] == [
            m.sr_calls for m in b if isinstance(m, qt.Linear)], step
        sa, sb = a.state_dict(), b.state_dict()
        for k in sa:
            if k.endswith("_amax_history") or k.endswith("_scale"):
                assert torch.equal(sa[k], sb[k]), (step, k)
        oa.step()
        ob.step()


def test_checkpoint_replays_grouped_linear():
    # The hybrid's experts (fprop and wgrad grouped, dgrad per expert) under qt.checkpoint: the same
    # gradients bit for bit as without.
    def experts():
        torch.manual_seed(0)
        r = recipes("hybrid_mxfp8_fwd_nvfp4_bwd")
        return (qt.GroupedLinear(2, 256, 512, recipes=r, name="fc1", device="cuda"),
                qt.GroupedLinear(2, 512, 256, recipes=r, name="fc2", device="cuda"))

    offsets = torch.tensor([0, 128, 256], dtype=torch.int64, device="cuda")

    def mlp(fc, x):
        return fc[1](torch.nn.functional.gelu(fc[0](x, offsets)), offsets)

    a, b = experts(), experts()
    xa = rnd(256, 256, seed=12).requires_grad_()
    xb = xa.detach().clone().requires_grad_()
    mlp(a, xa).float().pow(2).mean().backward()
    qt.checkpoint(mlp, b, xb).float().pow(2).mean().backward()
    assert same(xa.grad, xb.grad)
    for fa, fb in zip(a, b):
        assert same(fa.weight.grad, fb.weight.grad) and fa.sr_calls == fb.sr_calls


def test_plain_torch_checkpoint():
    # torch.utils.checkpoint without qt.checkpoint's context: a recompute runs the forward again,
    # which is exact where the forward's quantizes are reproducible (round to nearest, current
    # scaling, the weight's kept copy) and refused, naming the module, where it is not.
    def model(name):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).cuda().to(torch.bfloat16)
        return qt.convert(m, recipes(name))

    a, b = model("current_scaling"), model("current_scaling")
    xa = rnd(256, 256, seed=13).requires_grad_()
    xb = xa.detach().clone().requires_grad_()
    a(xa).float().pow(2).mean().backward()
    torch.utils.checkpoint.checkpoint(b, xb, use_reentrant=False).float().pow(2).mean().backward()
    assert same(xa.grad, xb.grad)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert same(pa.grad, pb.grad)
    d = model("delayed_scaling")
    y = torch.utils.checkpoint.checkpoint(d, rnd(256, 256, seed=14).requires_grad_(), use_reentrant=False)
    with pytest.raises(Exception, match=r"module 0: a forward during backward .* delayed scaling .* qt.checkpoint"):
        y.float().pow(2).mean().backward()
    c = model("delayed_scaling")  # the same through context_fn: replayed
    y = torch.utils.checkpoint.checkpoint(c, rnd(256, 256, seed=14).requires_grad_(), use_reentrant=False,
                                          context_fn=qt.checkpoint_context)
    y.float().pow(2).mean().backward()
    with pytest.raises(qforge.UserError, match="use_reentrant: qt.checkpoint replays"):
        qt.checkpoint(c, rnd(256, 256, seed=14), use_reentrant=True)
