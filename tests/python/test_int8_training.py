"""INT8 weight-only training with int8 parameters (python/qforge/torch/int8_training.py).

Without torch (CI): qforge._C's CPU reference of the fused optimizer step (the int8 storage of a
weight is the int8_weight_sr weight quantize; steps keep the SR rule's bounds; the argument errors
name the argument) and the kernel's compile without a GPU. With torch and a CUDA GPU: the fused
step bit for bit against the CPU reference over several steps (SGD and AdamW, rows of 1 to 16384
elements), bad arguments refused before any launch, Int8Linear's forward / backward against
float64 products of its stored operands, state_dict round trips, a training loop whose loss
decreases, and a resume from a checkpoint that continues bit for bit.

Run:  QFORGE_EXTENSION=BUILD/python/qforge/_C*.so QFORGE_LIBRARY=BUILD/runtime/libqforge.so \
      python3 -m pytest -q tests/python/test_int8_training.py
"""
import io
import math
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import qforge  # noqa: E402
from qforge import _ext  # noqa: E402

try:
    C = _ext.load()
except ImportError as e:  # a build without nanobind: nothing to test here
    pytest.skip(f"qforge._C not built: {e}", allow_module_level=True)

RECIPE = str(ROOT / "recipes" / "int8_weight_sr.json")


def lcg(n, r, seed):
    """Deterministic values in [-r, r)."""
    s = (seed * 2654435761 + 12345) & 0xFFFFFFFF
    out = []
    for _ in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out.append(((s >> 8) / float(1 << 24) * 2.0 - 1.0) * r)
    return out


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16(x):
    """x (an fp32 value) rounded to bf16, nearest even."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", b))[0]


def signed(qbytes):
    return [v - 256 if v > 127 else v for v in qbytes]


# ------------------------------------------------------------------------------- without torch


def test_reference_quantize_is_the_weight_rowwise_stream():
    """The int8 storage of a weight is int8_weight_sr's weight quantize (rowwise data and scales)."""
    ctx = C.Context([RECIPE])
    m, k = 6, 40
    w = [bf16(v) for v in lcg(m * k, 2.0, 3)]
    q = ctx.quantizer("linear:weight", None, "bf16", "inference")
    x = struct.pack(f"<{m * k}H", *[struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in w])
    outs = dict(C.reference_quantize(q, x, m, k, seed=77, offset=3))
    data, scales, _, _ = C.reference_int8_quantize(w, m, k, "bf16", 77, 3)
    assert bytes(data) == bytes(outs["rowwise_data"])
    assert struct.pack(f"<{m}f", *scales) == bytes(outs["rowwise_scale_inv"])


def test_reference_step_rounds_to_a_neighbour():
    """Every element after an AdamW step is one of the two integers around its exact update, and the
    scale is the updated row's amax / 127 rounded to bf16."""
    rows, cols = 3, 33
    q, scale, _, _ = C.reference_int8_quantize(lcg(rows * cols, 0.05, 1), rows, cols, "bf16", 1, 0)
    g = lcg(rows * cols, 0.01, 2)
    m0, v0 = [0.0] * (rows * cols), [0.0] * (rows * cols)
    q1, s1, m1, v1 = C.reference_int8_adamw_step(q, scale, g, m0, v0, rows, cols, "bf16", 5, 1, 1, lr=1e-2,
                                                 weight_decay=0.0)
    assert len(q1) == rows * cols and len(s1) == rows and len(m1) == len(v1) == rows * cols
    qs, q1s = signed(q), signed(q1)
    for r in range(rows):
        w = [f32(qs[r * cols + c] * scale[r]) for c in range(cols)]
        new = []
        for c in range(cols):
            i = r * cols + c
            # AdamW's first step moves each element by about lr * sign(g)
            new.append(w[c] - 1e-2 * math.copysign(1.0, g[i]) if g[i] != 0 else w[c])
        amax = max(abs(v) for v in new)
        assert abs(s1[r] - amax / 127) <= 0.01 * amax / 127
        for c in range(cols):
            x = new[c] / s1[r]
            assert abs(q1s[r * cols + c] - x) <= 1.01, (r, c, x, q1s[r * cols + c])


def test_reference_step_errors_name_the_argument():
    q, scale, _, _ = C.reference_int8_quantize([0.5] * 8, 2, 4, "bf16", 0, 0)
    with pytest.raises(qforge.UserError, match="grad"):
        C.reference_int8_sgd_step(q, scale, [0.0] * 7, [], 2, 4, "bf16", 0, 1, 1, lr=0.1)
    with pytest.raises(qforge.UserError, match="scale"):
        C.reference_int8_sgd_step(q, scale[:1], [0.0] * 8, [], 2, 4, "bf16", 0, 1, 1, lr=0.1)
    with pytest.raises(qforge.UserError, match="betas"):
        C.reference_int8_adamw_step(q, scale, [0.0] * 8, [0.0] * 8, [0.0] * 8, 2, 4, "bf16", 0, 1, 1, lr=0.1,
                                    beta1=1.5)
    with pytest.raises(qforge.UserError, match="nesterov"):
        C.reference_int8_sgd_step(q, scale, [0.0] * 8, [0.0] * 8, 2, 4, "bf16", 0, 1, 1, lr=0.1, nesterov=True)
    with pytest.raises(qforge.UserError, match="step"):
        C.reference_int8_adamw_step(q, scale, [0.0] * 8, [0.0] * 8, [0.0] * 8, 2, 4, "bf16", 0, 1, 0, lr=0.1)


def test_device_step_checks_arguments_before_any_launch():
    """The binding's checks run before the driver is touched (no GPU needed to see them)."""
    base = 1 << 32
    args = dict(q=base, scale=base + (1 << 24), grad=base + (2 << 24), exp_avg=base + (4 << 24),
                exp_avg_sq=base + (6 << 24), noop=0, rows=4, cols=64, grad_dtype="fp32", scale_dtype="bf16", seed=0,
                offset=0, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, stream=0, device=0)
    with pytest.raises(qforge.UserError, match="cols"):
        C.int8_adamw_step(**{**args, "cols": C.INT8_OPTIM_MAX_COLS + 1})
    with pytest.raises(qforge.UserError, match="grad_dtype"):
        C.int8_adamw_step(**{**args, "grad_dtype": "int8"})
    with pytest.raises(qforge.UserError, match="exp_avg"):
        C.int8_adamw_step(**{**args, "exp_avg": args["grad"] + 64})  # overlaps the gradient
    with pytest.raises(qforge.UserError, match="eps"):
        C.int8_adamw_step(**{**args, "eps": 0.0})
    with pytest.raises(qforge.UserError, match="momentum_buffer"):
        C.int8_sgd_step(args["q"], args["scale"], args["grad"], 0, 0, 4, 64, "fp32", "bf16", 0, 0, 1, 0.1, 0.9, 0.0,
                        0.0, False, 0, 0)


def test_kernel_compiles_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("QFORGE_CACHE_DIR", str(tmp_path))
    src = C.int8_optim_prepare("sgd", 4099, "bf16", "bf16", "sm_90a")
    assert '#include "qforge/optim_int8.cuh"' in src
    with pytest.raises(qforge.UserError, match="optimizer"):
        C.int8_optim_prepare("adam", 64)


def test_clip_grads_are_the_ones_the_optimizers_read():
    """qt.clip_grad_norm_ clips main_grad where a parameter has one (an int8 weight's gradient, which
    torch.nn.utils.clip_grad_norm_ does not see), else .grad; parameters with neither are left out;
    in the parameters' order. Checked on stand-in parameters, with the stand-in torch
    (tests/python/stub_torch.py) where torch is not installed."""
    from types import SimpleNamespace
    try:
        import torch as _t  # noqa: F401  (the real torch: no stand-in needed)
        stub = None
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import stub_torch as stub
        stub.install()
    try:
        from qforge.torch import int8_training as m
        a, b, c = object(), object(), object()
        params = [SimpleNamespace(main_grad=a, grad=None),   # an Int8Linear weight
                  SimpleNamespace(main_grad=None, grad=b),   # a bias
                  SimpleNamespace(grad=c),                   # no main_grad attribute at all
                  SimpleNamespace(main_grad=None, grad=None)]
        assert m._clip_grads(params) == [a, b, c]
        assert m._clip_grads(iter(params)) == [a, b, c]
        assert m._clip_grads([]) == []
        assert "clip_grad_norm_" in m.__all__
    finally:
        if stub is not None:
            stub.uninstall()


# ------------------------------------------------------------------------------- with torch + GPU

try:
    import torch
    from torch import nn
    HAVE_GPU = torch.cuda.is_available()
except ImportError:
    torch = nn = None
    HAVE_GPU = False
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs torch and a CUDA GPU")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}

if HAVE_GPU:
    import qforge.torch as qt


def recipes():
    return qt.Recipes(RECIPE)


def make_param(rows, cols, seed):
    q, scale, _, _ = C.reference_int8_quantize(lcg(rows * cols, 0.05, seed), rows, cols, "bf16", 9, 0)
    p = torch.tensor(signed(q), dtype=torch.int8).view(rows, cols).cuda()
    s = torch.tensor(scale, dtype=torch.float32).cuda()
    return p, s


def host(t):
    return t.detach().cpu().reshape(-1).tolist()


def qbytes(p):
    return bytes(p.detach().cpu().view(torch.uint8).reshape(-1).tolist())


@needs_gpu
@pytest.mark.parametrize("shape", [(1, 16384), (7, 37), (3, 4099), (64, 256), (1, 1)])
@pytest.mark.parametrize("grad_dtype", ["fp32", "bf16"])
def test_adamw_step_matches_the_reference(shape, grad_dtype):
    rows, cols = shape
    grad_dtype = getattr(torch, DTYPES[grad_dtype])
    p, s = make_param(rows, cols, 4)
    m = torch.zeros(rows, cols, device="cuda")
    v = torch.zeros(rows, cols, device="cuda")
    rq, rs, rm, rv = qbytes(p), host(s), host(m), host(v)
    for step in range(1, 4):
        g = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(step)) * 0.1).to(grad_dtype).cuda()
        qt.int8_adamw_step(p, s, g, m, v, lr=2e-3, weight_decay=0.01, step=step, seed=11, offset=step)
        rq, rs, rm, rv = C.reference_int8_adamw_step(rq, rs, host(g.float()), rm, rv, rows, cols, "bf16", 11, step,
                                                     step, lr=2e-3, weight_decay=0.01)
        torch.cuda.synchronize()
        assert qbytes(p) == bytes(rq), f"step {step}: int8 data"
        assert struct.pack(f"<{rows}f", *host(s)) == struct.pack(f"<{rows}f", *rs), f"step {step}: scales"
        assert struct.pack(f"<{rows * cols}f", *host(m)) == struct.pack(f"<{rows * cols}f", *rm)
        assert struct.pack(f"<{rows * cols}f", *host(v)) == struct.pack(f"<{rows * cols}f", *rv)


@needs_gpu
@pytest.mark.parametrize("shape", [(1, 16384), (5, 37), (16, 1000)])
@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_sgd_step_matches_the_reference(shape, momentum, nesterov):
    rows, cols = shape
    p, s = make_param(rows, cols, 5)
    buf = torch.zeros(rows, cols, device="cuda") if momentum else None
    rq, rs, rb = qbytes(p), host(s), [0.0] * (rows * cols) if momentum else []
    for step in range(1, 4):
        g = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(step)) * 0.1).cuda()
        qt.int8_sgd_step(p, s, g, buf, lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=0.01, step=step,
                         seed=3, offset=step)
        rq, rs, rb, _ = C.reference_int8_sgd_step(rq, rs, host(g), rb, rows, cols, "bf16", 3, step, step, lr=0.05,
                                                  momentum=momentum, weight_decay=0.01, nesterov=nesterov)
        torch.cuda.synchronize()
        assert qbytes(p) == bytes(rq), f"step {step}"
        assert struct.pack(f"<{rows}f", *host(s)) == struct.pack(f"<{rows}f", *rs)
        if momentum:
            assert struct.pack(f"<{rows * cols}f", *host(buf)) == struct.pack(f"<{rows * cols}f", *rb)


@needs_gpu
def test_bad_arguments_name_the_argument():
    p, s = make_param(4, 64, 6)
    g = torch.zeros(4, 64, device="cuda")
    m, v = torch.zeros_like(g), torch.zeros_like(g)
    with pytest.raises(qforge.UserError, match="param"):
        qt.int8_adamw_step(p.to(torch.bfloat16), s, g, m, v, lr=1e-3)
    with pytest.raises(qforge.UserError, match="scale"):
        qt.int8_adamw_step(p, s[:3], g, m, v, lr=1e-3)
    with pytest.raises(qforge.UserError, match="scale"):
        qt.int8_adamw_step(p, s.to(torch.bfloat16), g, m, v, lr=1e-3)
    with pytest.raises(qforge.UserError, match="grad"):
        qt.int8_adamw_step(p, s, g[:, :32], m, v, lr=1e-3)
    with pytest.raises(qforge.UserError, match="exp_avg_sq"):
        qt.int8_adamw_step(p, s, g, m, v.to(torch.bfloat16), lr=1e-3)
    with pytest.raises(qforge.UserError, match="momentum_buffer"):
        qt.int8_sgd_step(p, s, g, None, lr=0.1, momentum=0.9)
    before = qbytes(p)
    lin = qt.Int8Linear(64, 16, recipes=recipes(), name="fc", device="cuda")
    with pytest.raises(qforge.UserError, match="amsgrad"):
        qt.Int8AdamW(lin.parameters(), amsgrad=True)
    with pytest.raises(qforge.UserError, match="maximize"):
        qt.Int8SGD(lin.parameters(), lr=0.1, maximize=True)
    with pytest.raises(qforge.UserError, match="betas"):
        qt.Int8AdamW(lin.parameters(), betas=(1.0, 0.999))
    with pytest.raises(qforge.UserError, match="params"):
        qt.Int8AdamW([nn.Parameter(torch.zeros(4, 4, dtype=torch.int8, device="cuda"), requires_grad=False)])
    torch.cuda.synchronize()
    assert qbytes(p) == before  # nothing was launched


@needs_gpu
def test_linear_forward_and_backward():
    torch.manual_seed(0)
    lin = qt.Int8Linear(96, 48, recipes=recipes(), name="fc", device="cuda")
    assert lin.weight.dtype == torch.int8 and lin.weight_scale.dtype == torch.float32
    x = torch.randn(32, 96, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = lin(x)
    w = lin.weight.double() * lin.weight_scale.double()[:, None]  # the stored weight
    ref = x.double() @ w.t() + lin.bias.double()
    assert torch.allclose(y.double(), ref, rtol=2e-2, atol=2e-2)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert lin.weight.grad is None and lin.weight.main_grad.dtype == torch.float32
    assert torch.allclose(lin.weight.main_grad.double(), dy.double().t() @ x.double(), rtol=2e-2, atol=2e-2)
    w_bf16 = (lin.weight.float() * lin.weight_scale[:, None]).to(torch.bfloat16).double()
    assert torch.allclose(x.grad.double(), dy.double() @ w_bf16, rtol=2e-2, atol=5e-2)
    # a second backward accumulates into main_grad
    first = lin.weight.main_grad.clone()
    lin(x.detach()).backward(dy)
    assert torch.allclose(lin.weight.main_grad, 2 * first, rtol=1e-2, atol=1e-2)
    with torch.no_grad():
        assert torch.equal(lin(x), y.detach())


def model_and_data(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 16)).to("cuda", torch.bfloat16)
    qt.convert_int8(model, recipes())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 64, generator=g).to("cuda", torch.bfloat16)
    target = torch.randn(256, 16, generator=g).to("cuda", torch.bfloat16)
    return model, x, target


def train(model, opt, x, target, steps):
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x).float(), target.float())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@needs_gpu
@pytest.mark.parametrize("opt_name,kw", [("Int8AdamW", dict(lr=1e-2, weight_decay=0.0)),
                                          ("Int8SGD", dict(lr=0.1, momentum=0.9))])
def test_training_loss_decreases(opt_name, kw):
    opt_cls = getattr(qt, opt_name)
    model, x, target = model_and_data(0)
    assert isinstance(model[0], qt.Int8Linear) and model[0].weight.dtype == torch.int8
    opt = opt_cls(model.parameters(), **kw)
    losses = train(model, opt, x, target, 60)
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses


@needs_gpu
def test_state_dict_round_trip_and_bit_identical_resume():
    model, x, target = model_and_data(0)
    opt = qt.Int8AdamW(model.parameters(), lr=1e-2)
    train(model, opt, x, target, 5)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    after = train(model, opt, x, target, 4)
    final = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}

    model2, _, _ = model_and_data(1)  # other initial weights, overwritten by the checkpoint
    opt2 = qt.Int8AdamW(model2.parameters(), lr=1e-2)
    buf.seek(0)
    ck = torch.load(buf, weights_only=False)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    # the round trip itself: int8 data, scales, optimizer state and SR counter as saved
    for k, v in ck["model"].items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(model2.state_dict()[k], v), k
    assert model2[0].sr_calls == ck["model"]["0._extra_state"]["sr_calls"]
    st = opt2.state[model2[0].weight]
    assert st["exp_avg"].dtype == torch.float32 and st["step"] == 5
    resumed = train(model2, opt2, x, target, 4)
    assert resumed == after  # bit-identical losses
    for k, v in model2.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, final[k]), k


@needs_gpu
def test_moved_module_keeps_one_allocation():
    lin = qt.Int8Linear(32, 8, recipes=recipes(), name="m", device="cuda")
    x = torch.randn(4, 32, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y = lin(x)
    lin.to("cuda")  # a no-op move keeps the views
    lin.weight.data = lin.weight.data.clone()  # a replaced tensor: the GEMMs' allocation follows it
    with torch.no_grad():
        assert torch.equal(lin(x), y)
    assert lin.weight.data_ptr() == lin._store.data_ptr() + lin._data_offset


@needs_gpu
def test_memory_table():
    m = qt.weight_memory_bytes(7168, 4096, "adamw")
    n = 7168 * 4096
    assert m["bf16"] == 2 * n + 8 * n and m["int8"] == n + 4 * 7168 + 8 * n


def grads_of(model):
    """The gradients qt.clip_grad_norm_ takes: main_grad of int8 weights, .grad of the others."""
    return [p.main_grad if p.dtype == torch.int8 else p.grad for p in model.parameters()]


@needs_gpu
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("foreach", [None, False, True])
def test_clip_grad_norm_is_torchs_over_main_grad(norm_type, foreach):
    """The total norm and the clipped gradients equal torch.nn.utils.clip_grad_norm_'s over the same
    gradients (as leaf tensors' .grad), bit for bit; torch's own, given the model, misses main_grad."""
    model, x, target = model_and_data(0)
    torch.nn.functional.mse_loss(model(x).float(), target.float()).backward()
    grads = grads_of(model)
    assert all(g is not None for g in grads) and grads[0].dtype == torch.float32  # main_grad, fp32
    leaves = []
    for g in grads:
        t = torch.zeros_like(g, requires_grad=True)
        t.grad = g.clone()
        leaves.append(t)
    full = torch.nn.utils.clip_grad_norm_(leaves, float("inf"), norm_type=norm_type, foreach=foreach)
    max_norm = 0.25 * float(full)  # clips every gradient
    want = torch.nn.utils.clip_grad_norm_(leaves, max_norm, norm_type=norm_type, foreach=foreach)
    got = qt.clip_grad_norm_(model, max_norm, norm_type=norm_type, foreach=foreach)
    assert torch.equal(got, want)
    for g, t in zip(grads_of(model), leaves):
        assert torch.equal(g, t.grad)
    # torch's own sees only the float parameters' .grad (the int8 weights have none)
    seen = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"), norm_type=norm_type)
    assert float(seen) < float(got) or norm_type == math.inf


@needs_gpu
def test_clip_grad_norm_below_the_limit_and_nonfinite():
    model, x, target = model_and_data(0)
    torch.nn.functional.mse_loss(model(x).float(), target.float()).backward()
    before = [g.clone() for g in grads_of(model)]
    total = qt.clip_grad_norm_(model.parameters(), 1e9)
    for g, b in zip(grads_of(model), before):  # scaled by min(1, ...) = 1: unchanged
        assert torch.equal(g, b)
    assert total.dim() == 0 and float(total) > 0
    model[0].weight.main_grad[0, 0] = float("inf")
    with pytest.raises(RuntimeError, match="non-finite"):
        qt.clip_grad_norm_(model, 1.0, error_if_nonfinite=True)
    assert model[0].weight.main_grad[0, 1] == before[0][0, 1]  # nothing scaled
    assert math.isinf(float(qt.clip_grad_norm_(model, 1.0)))
    assert float(qt.clip_grad_norm_([], 1.0)) == 0.0


@needs_gpu
def test_training_with_clipping():
    model, x, target = model_and_data(0)
    opt = qt.Int8AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.mse_loss(model(x).float(), target.float())
        loss.backward()
        total = qt.clip_grad_norm_(model, 0.5)
        assert math.isfinite(float(total))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
