"""qforge.torch's eager call path without torch or a GPU: quantize, gemm and linear_forward run
against a stand-in torch (tests/python/stub_torch.py) with the compiled core's launch calls recorded,
so what the Python layer allocates and passes (one allocation of the layout's bytes on the input's
device, the addresses, torch's current stream, zeros for absent optional tensors), what it keeps per
(quantizer, shape) and per plan, which path it takes under torch.compile, and the errors it raises
are checked on any machine. The GPU tests (test_torch_binding.py, test_torch_modules.py,
test_launch_path.py) check the same calls' results.
"""
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import qforge  # noqa: E402
from qforge import _ext  # noqa: E402

try:
    _ext.load()
except ImportError as e:
    pytest.skip(f"qforge._C not built: {e}", allow_module_level=True)

try:  # with the real torch, the GPU tests check these calls; swapping torch out under them is not worth it
    import torch as _real_torch  # noqa: F401
except ImportError:
    _real_torch = None
if _real_torch is not None:
    pytest.skip("torch is installed: test_torch_binding.py and test_launch_path.py check these calls",
                allow_module_level=True)

import stub_torch  # noqa: E402

RECIPES = ROOT / "recipes"


@pytest.fixture
def env():
    torch = stub_torch.install()
    try:
        import qforge.torch as qt
        yield torch, qt
    finally:
        stub_torch.uninstall()


class Recorder:
    """A quantizer's compiled core with its launch call recorded instead of run."""

    def __init__(self, c):
        self._real, self.calls = c, []

    def quantize(self, *args):
        self.calls.append(args)

    def __getattr__(self, name):
        return getattr(self._real, name)


class FakePlan:
    """A GemmPlan's shape, workspace and launch calls (recorded)."""
    made = []
    WS = 1000  # each new plan's workspace bytes

    def __init__(self, a_c, a_layout, ai, b_c, b_layout, bi, out_name, accumulate):
        self.m, self.n, self.ws, self.runs = a_layout.m, b_layout.m, FakePlan.WS, []
        self.args = (ai, bi, out_name, accumulate)
        FakePlan.made.append(self)

    def workspace_bytes(self):
        return self.ws

    def run(self, *args):
        self.runs.append(args)

    def linear_forward(self, *args):
        self.runs.append(args)


class FakeCore:
    """qforge._C with GemmPlan replaced by FakePlan."""

    def __init__(self, real):
        self._real, self.GemmPlan = real, FakePlan

    def __getattr__(self, name):
        return getattr(self._real, name)


def fake_plans(qt, monkeypatch):
    monkeypatch.setattr(qt, "_C", FakeCore(qt._C))
    FakePlan.made.clear()


def recorded(q):
    q._c = Recorder(q._c)
    return q._c.calls


def test_quantize_allocates_the_layout_once_and_passes_the_addresses(env):
    torch, qt = env
    q = qt.Recipes(str(RECIPES / "mxfp8_hopper.json")).quantizer("linear:input")
    calls = recorded(q)
    x = torch.empty((256, 512), dtype=torch.bfloat16, device="cuda:1")
    t = q(x, seed=3, offset=5)
    L = q.layout(256, 512)
    assert (t.m, t.k, t.members, t.split, t.quantizer) == (256, 512, 0, None, q)
    assert t.buffer.dtype is torch.uint8 and t.buffer.numel() == L.nbytes and t.buffer.device == torch.device("cuda", 1)
    assert calls == [(L, x.data_ptr(), t.buffer.data_ptr(), 0x5001, 1, 0, 3, 5, 0, 0, 0, 0)]
    # The second call reads the kept (layout, bytes) and allocates anew: one allocation per call.
    before = len(torch.allocations)
    t2 = q(x)
    assert len(torch.allocations) == before + 1 and t2.buffer.data_ptr() != t.buffer.data_ptr()
    assert calls[-1][0] is calls[0][0] and calls[-1][3:5] == (0x5001, 1)
    # Another device: its own device object and stream.
    x0 = torch.empty((256, 512), dtype=torch.bfloat16, device="cuda:0")
    t0 = q(x0)
    assert t0.buffer.device == torch.device("cuda", 0) and calls[-1][3:5] == (0x5000, 0)
    # Into an existing buffer.
    out = torch.empty(L.nbytes, dtype=torch.uint8, device="cuda:0")
    assert q(x0, out=out).buffer is out and calls[-1][2] == out.data_ptr()


def test_quantize_passes_the_optional_tensors(env):
    torch, qt = env
    q = qt.Recipes(str(RECIPES / "delayed_scaling.json")).quantizer("linear:input")
    calls = recorded(q)
    x = torch.empty((128, 256), dtype=torch.bfloat16, device="cuda:0")
    noop, scale, amax = (torch.empty(1, dtype=torch.float32, device="cuda:0") for _ in range(3))
    t = q(x, noop=noop, scale=scale, amax_out=amax)
    assert calls == [(q.layout(128, 256), x.data_ptr(), t.buffer.data_ptr(), 0x5000, 0, noop.data_ptr(), 0, 0, 0,
                      scale.data_ptr(), 0, amax.data_ptr())]
    with pytest.raises(qforge.UserError, match="scale: on cuda:1, expected cuda:0"):
        q(x, scale=torch.empty(1, dtype=torch.float32, device="cuda:1"))
    with pytest.raises(qforge.UserError, match="amax_out: expected 1 element, got 2"):
        q(x, scale=scale, amax_out=torch.empty(2, dtype=torch.float32, device="cuda:0"))
    with pytest.raises(qforge.UserError, match="noop: expected float32, got int64"):
        q(x, noop=torch.empty(1, dtype=torch.int64, device="cuda:0"))
    assert len(calls) == 1


def test_quantize_errors(env):
    torch, qt = env
    q = qt.Recipes(str(RECIPES / "mxfp8_hopper.json")).quantizer("linear:input")
    calls = recorded(q)
    good = torch.empty((128, 256), dtype=torch.bfloat16, device="cuda:0")
    for x, message in [
        (torch.empty((128, 256), dtype=torch.float32, device="cuda:0"), "x: expected bfloat16, got float32"),
        (torch.empty((128, 256), dtype=torch.bfloat16, device="cpu"), "x: expected a CUDA tensor, got one on cpu"),
        (torch.Tensor((128, 256), torch.bfloat16, torch.device("cuda:0"), contiguous=False),
         "x: expected a contiguous tensor"),
        (torch.empty((2, 128, 256), dtype=torch.bfloat16, device="cuda:0"), r"x: expected a 2-D tensor, got shape \(2, 128, 256\)"),
    ]:
        with pytest.raises(qforge.UserError, match=message):
            q(x)
    with pytest.raises(qforge.UserError, match="member_rows: only for quantizers created with grouped=True"):
        q(good, split=[128])
    with pytest.raises(qforge.UserError, match=r"out: expected \d+ bytes \(the layout of \[128, 256\]\), got 16"):
        q(good, out=torch.empty(16, dtype=torch.uint8, device="cuda:0"))
    torch.compiling[0] = True
    with pytest.raises(qforge.UserError, match="out: quantizing into an existing buffer is for eager calls"):
        q(good, out=torch.empty(16, dtype=torch.uint8, device="cuda:0"))
    assert not calls


def test_traced_quantize_and_gemm_take_the_custom_ops(env):
    torch, qt = env
    r = qt.Recipes(str(RECIPES / "mxfp8_hopper.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    ops = []

    def op(name):
        def call(*args):
            ops.append((name,) + args)
            return torch.empty(64, dtype=torch.uint8, device="cuda:0")
        return call

    torch.ops.qforge = types.SimpleNamespace(**{n: op(n) for n in ("quantize", "quantize_amax_out", "gemm",
                                                                    "gemm_accumulate")})
    torch.compiling[0] = True
    x = torch.empty((128, 256), dtype=torch.bfloat16, device="cuda:0")
    a, b = qx(x, seed=1), qw(x)
    assert (a.m, a.k, a.members, a.split) == (128, 256, 0, None)
    assert ops[0] == ("quantize", x, qx.id, None, 1, 0, None, None)
    amax = torch.empty(1, dtype=torch.float32, device="cuda:0")
    qx(x, amax_out=amax)
    assert ops[-1] == ("quantize_amax_out", x, qx.id, None, 0, 0, None, None, amax)
    qt.gemm(a, b)
    assert ops[-1] == ("gemm", a.buffer, qx.id, 128, 256, 0, b.buffer, qw.id, 128, 256, 0, 1)
    acc = torch.empty((128, 128), dtype=torch.float32, device="cuda:0")
    assert qt.gemm(a, b, b_direction="columnwise", accumulate_into=acc) is acc
    assert ops[-1] == ("gemm_accumulate", acc, a.buffer, qx.id, 128, 256, 0, b.buffer, qw.id, 128, 256, 1, 0)


def test_gemm_allocates_the_output_and_workspace_and_keeps_the_plan(env, monkeypatch):
    torch, qt = env
    fake_plans(qt, monkeypatch)
    r = qt.Recipes(str(RECIPES / "mxfp8_hopper.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    recorded(qx), recorded(qw)
    a = qx(torch.empty((96, 256), dtype=torch.bfloat16, device="cuda:1"))
    b = qw(torch.empty((128, 256), dtype=torch.bfloat16, device="cuda:1"))
    d = qt.gemm(a, b)
    (p,) = FakePlan.made
    assert p.args == (0, 0, "bf16", False)
    assert d.shape == (96, 128) and d.dtype is torch.bfloat16 and d.device == torch.device("cuda", 1)
    ws = torch.allocations[-1]
    assert ws[1] == 1000 and ws[2] == torch.device("cuda", 1)
    assert p.runs == [(a.buffer.data_ptr(), b.buffer.data_ptr(), d.data_ptr(), ws[0], 0x5001, 1, True)]
    qt.gemm(a, b)
    assert len(FakePlan.made) == 1 and len(p.runs) == 2 and qt.gemm_plan(a, b) is p
    # Without a workspace: none allocated, 0 passed.
    monkeypatch.setattr(FakePlan, "WS", 0)
    FakePlan.made.clear()
    before = len(torch.allocations)
    d32 = qt.gemm(a, b, b_direction="columnwise", out_dtype=torch.float32)
    (p2,) = FakePlan.made
    assert p2.args == (0, 1, "fp32", False) and d32.dtype is torch.float32
    assert len(torch.allocations) == before + 1 and p2.runs[-1][3] == 0
    acc = torch.empty((96, 128), dtype=torch.float32, device="cuda:1")
    assert qt.gemm(a, b, accumulate_into=acc) is acc
    assert FakePlan.made[-1].args == (0, 0, "fp32", True) and FakePlan.made[-1].runs[-1][2] == acc.data_ptr()


def test_gemm_errors(env, monkeypatch):
    torch, qt = env
    fake_plans(qt, monkeypatch)
    r = qt.Recipes(str(RECIPES / "mxfp8_hopper.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    recorded(qx), recorded(qw)
    a = qx(torch.empty((96, 256), dtype=torch.bfloat16, device="cuda:0"))
    b = qw(torch.empty((128, 256), dtype=torch.bfloat16, device="cuda:0"))
    with pytest.raises(qforge.UserError, match="a, b: expected QuantizedTensors"):
        qt.gemm(a, a.buffer)
    g = qt.QuantizedTensor(b.buffer, qw, 128, 256, 2)
    with pytest.raises(qforge.UserError, match="gemm: grouped tensors take qt.grouped_gemm"):
        qt.gemm(a, g)
    with pytest.raises(qforge.UserError, match=r"direction: the quantizer writes \['rowwise', 'columnwise'\], not 'up'"):
        qt.gemm(a, b, b_direction="up")
    with pytest.raises(qforge.UserError, match="out_dtype: expected bfloat16 or float32, got torch.float16"):
        qt.gemm(a, b, out_dtype=torch.float16)
    b1 = qw(torch.empty((128, 256), dtype=torch.bfloat16, device="cuda:1"))
    with pytest.raises(qforge.UserError, match="b: on cuda:1, a on cuda:0"):
        qt.gemm(a, b1)
    with pytest.raises(qforge.UserError, match=r"out: expected shape \[96, 128\], got \[96, 64\]"):
        qt._gemm(a.buffer, qx.id, 96, 256, 0, b.buffer, qw.id, 128, 256, 0, 0, True,
                 torch.empty((96, 64), dtype=torch.float32, device="cuda:0"))

    class Sub(qt.QuantizedTensor):  # a subclass goes through the full checks and passes them
        __slots__ = ()
    d = qt.gemm(Sub(a.buffer, qx, 96, 256), b)
    assert d.shape == (96, 128)


def test_linear_forward_allocates_on_the_input_device(env, monkeypatch):
    torch, qt = env
    fake_plans(qt, monkeypatch)
    r = qt.Recipes(str(RECIPES / "mxfp8_hopper.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    x = torch.empty((64, 256), dtype=torch.bfloat16, device="cuda:1")
    w = torch.empty((128, 256), dtype=torch.bfloat16, device="cuda:1")
    d, tx, tw = qt.linear_forward(x, w, qx, qw, x_seed=2)
    (p,) = FakePlan.made
    assert d.shape == (64, 128) and d.device == torch.device("cuda", 1)
    assert tx.buffer.numel() == qx.layout(64, 256).nbytes and tw.buffer.numel() == qw.layout(128, 256).nbytes
    assert tx.buffer.device == tw.buffer.device == torch.device("cuda", 1)
    run = p.runs[-1]
    assert run[:5] == (x.data_ptr(), tx.buffer.data_ptr(), 0, 2, 0) and run[8:10] == (w.data_ptr(), tw.buffer.data_ptr())
    assert run[-2:] == (0x5001, 1)
    # The weight on another device, a bad out_dtype, the scales checked where given.
    with pytest.raises(qforge.UserError, match="w: on cuda:0, x on cuda:1"):
        qt.linear_forward(x, torch.empty((128, 256), dtype=torch.bfloat16, device="cuda:0"), qx, qw)
    with pytest.raises(qforge.UserError, match="w: expected bfloat16, got float32"):
        qt.linear_forward(x, torch.empty((128, 256), dtype=torch.float32, device="cuda:1"), qx, qw)
    with pytest.raises(qforge.UserError, match="out_dtype: expected bfloat16 or float32, got torch.float16"):
        qt.linear_forward(x, w, qx, qw, out_dtype=torch.float16)
    with pytest.raises(qforge.UserError, match="w_scale: on cuda:0, expected cuda:1"):
        qt.linear_forward(x, w, qx, qw, w_scale=torch.empty(1, dtype=torch.float32, device="cuda:0"))
    # The weight's kept copy used as it is, and a kept allocation of the wrong size.
    d2, tx2, tw2 = qt.linear_forward(x, None, qx, qw, w_copy=tw)
    assert tw2 is tw and p.runs[-1][8:10] == (0, tw.buffer.data_ptr()) and tx2.buffer.data_ptr() != tx.buffer.data_ptr()
    small = torch.empty(64, dtype=torch.uint8, device="cuda:1")
    with pytest.raises(qforge.UserError, match=rf"w_copy: expected {tw.buffer.numel()} bytes \(the layout of \[128, 256\]\), "
                                               "got 64"):
        qt._linear_forward(x, qx, (None, 0, 0, None, None, None), None, qw, (None, 0, 0, None, None, None), 128, small, 1)
