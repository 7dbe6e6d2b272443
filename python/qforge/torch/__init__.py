"""qforge for PyTorch: quantize, dequantize and GEMM as torch custom ops, and a quantized tensor type.

    import torch, qforge.torch as qt
    recipes = qt.Recipes("recipes/mxfp8_hopper.json")
    qx = recipes.quantizer("linear:input")(x)          # QuantizedTensor: one allocation, every output
    qw = recipes.quantizer("linear:weight")(w)
    y = qt.gemm(qx, qw)                                 # fprop: x rowwise @ w rowwise^T, bf16
    x_hat = qx.dequantize(torch.bfloat16)               # [M, K]

The compiled core (qforge._C) keeps each (quantizer, shape)'s layout and each GEMM's plan, so a
call from eager Python is one allocation from torch's caching allocator plus one call into C++,
launched on torch's current stream. Under torch.compile the same work runs through the custom
ops qforge::quantize, qforge::quantize_grouped, qforge::dequantize, qforge::gemm and
qforge::update_amax_history, whose fake implementations give the output shapes without a GPU,
so `torch.compile(fullgraph=True)` traces them.

CUDA graphs: the first call of a quantizer on a shape (and of a GEMM plan, a dequantize kind)
compiles or loads its kernels and, for GEMMs, writes a small device buffer: make that first call
before capture (`prepare()` only fills the kernel cache, it loads nothing on the device).
Captured calls launch only.
"""
import threading
import weakref
from typing import Dict, List, Optional, Sequence, Union

import torch

from .. import UserError
from .. import _ext
from .._plan_cache import PlanCache, size_from_env

__all__ = ["Recipes", "Quantizer", "QuantizedTensor", "gemm", "gemm_plan", "grouped_gemm", "GroupedLinear", "dequantize",
           "Linear", "convert", "linear_forward", "set_plan_cache_size", "update_amax_histories", "history_batch",
           "HistoryBatch", "UserError"]

_C = _ext.load()

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
# Element types of the raw buffers as torch views them (uint8 where torch has none).
_VIEW_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8,
                "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
if hasattr(torch, "float8_e8m0fnu"):
    _VIEW_DTYPES["e8m0"] = torch.float8_e8m0fnu

_lock = threading.Lock()
_quantizers: List["Quantizer"] = []  # by id: what the custom ops' integer argument names
# GEMM plans by (a quantizer, shape, stream, b ..., out dtype, accumulate), and the grouped ones:
# least recently used evicted beyond QFORGE_PLAN_CACHE_SIZE (default 256) each (qforge/_plan_cache.py).
_plans = PlanCache(size_from_env())
_gplans = PlanCache(size_from_env())
# The fused linear-layer calls' plans (linear_forward, qt.Linear's backward): each entry holds its
# GEMM plans and layouts, bounded the same way.
_lplans = PlanCache(size_from_env())


def set_plan_cache_size(size: Optional[int]) -> None:
    """Bounds each GEMM plan table (dense, grouped) to `size` plans (None: unbounded), evicting the
    least recently used now. An evicted plan's device buffers are freed once nothing holds it: a
    CUDA graph that captured a GEMM keeps launching its plan, so keep the tables larger than the
    distinct GEMMs run between capture and the last replay (or hold the plans: `gemm_plan`)."""
    try:
        _plans.resize(size)
        _gplans.resize(size)
        _lplans.resize(size)
    except ValueError as e:
        raise _user_error(f"size: {e}") from None


def _user_error(message: str) -> UserError:
    return UserError(1, message)


# The eager call path's per-call lookups, resolved once (each a plain Python call then, not a chain
# of attribute lookups through torch's modules). _is_compiling is torch.compiler.is_compiling itself,
# so dynamo still folds it to True while tracing.
_is_compiling = torch.compiler.is_compiling
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (device index) -> the current stream
if _raw_stream is None:  # a torch without CUDA: fails on use, as before, not on import
    def _raw_stream(device_index: int) -> int:
        return torch._C._cuda_getCurrentRawStream(device_index)
_uint8 = torch.uint8
# device index -> torch.device("cuda", index): one object per device, instead of the fresh one each
# `tensor.device` makes, for the allocations of a call.
_DEVICES: Dict[int, "torch.device"] = {}


def _device(index: int, like) -> "torch.device":
    """The torch.device of device index `index` (a tensor's get_device()); `like`'s own device where
    the index names no CUDA device (-1: a tensor on the CPU), as `like.device` gave before."""
    d = _DEVICES.get(index)
    if d is None:
        if index < 0:
            return like.device
        d = _DEVICES.setdefault(index, torch.device("cuda", index))
    return d


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _check_input(x, want, device, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise _user_error(f"{name}: expected a CUDA tensor, got {type(x).__name__}")
    if x.dtype != want:
        raise _user_error(f"{name}: expected {str(want).replace('torch.', '')}, got {str(x.dtype).replace('torch.', '')}")
    if not x.is_cuda:
        raise _user_error(f"{name}: expected a CUDA tensor, got one on {x.device}")
    if device is not None and x.get_device() != device:
        raise _user_error(f"{name}: on cuda:{x.get_device()}, expected cuda:{device}")
    if not x.is_contiguous():
        raise _user_error(f"{name}: expected a contiguous tensor")


def _check_small(t, name: str, device: int, dtype=torch.float32, numel: int = 1) -> None:
    if t is None:
        return
    _check_input(t, dtype, device, name)
    if t.numel() != numel:
        raise _user_error(f"{name}: expected {numel} element{'s' if numel != 1 else ''}, got {t.numel()}")


# ---------------------------------------------------------------------------------------------- quantizers


class Recipes:
    """Parsed, validated recipes: a path, a list of paths, or (from_json) a recipe's text."""

    def __init__(self, recipes: Union[str, Sequence[str]]):
        paths = [recipes] if isinstance(recipes, (str, bytes)) or hasattr(recipes, "__fspath__") else list(recipes)
        self._c = _C.Context([str(p) for p in paths])

    @classmethod
    def from_json(cls, text: str) -> "Recipes":
        self = cls.__new__(cls)
        self._c = _C.Context.from_json(text)
        return self

    @property
    def names(self) -> List[str]:
        return self._c.recipes

    def quantizer(self, role: str, recipe: Optional[str] = None, dtype: Union[str, torch.dtype] = torch.bfloat16,
                  usage: Optional[str] = None, grouped: bool = False) -> "Quantizer":
        """The quantizer of one role ("linear:input", ...) of one recipe (None: the only one) for an
        input dtype and usage (None: the recipe's)."""
        name = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, torch.dtype) else dtype
        if name not in _DTYPES:
            raise _user_error(f"dtype: expected bfloat16, float16 or float32, got {dtype!r}")
        return Quantizer(self._c.quantizer(role, recipe, name, usage, bool(grouped)))

    def gemms(self, recipe: Optional[str] = None) -> list:
        """The recipe's "gemms" entries: (JSON pointer, description)."""
        return self._c.gemms(recipe)


class Quantizer:
    """One role of one recipe compiled into a kernel plan. Calling it quantizes a 2-D CUDA tensor."""

    def __init__(self, c):
        self._c = c
        self.dtype = _DTYPES[c.dtype]
        self.grouped = c.grouped
        self.streams = {s.direction: s for s in c.streams}
        # Plain Python copies of what traced code reads (dynamo does not look into _C objects).
        self._index = {s.direction: s.index for s in c.streams}
        self._transposed = tuple(s.layout == "transposed" for s in c.streams)
        self.inputs = c.inputs
        self._layouts = {}
        self._dense = {}  # (m, k) -> (Layout, its nbytes): what an eager quantize of [m, k] reads per call
        with _lock:
            self.id = len(_quantizers)
            _quantizers.append(self)

    def __repr__(self) -> str:
        dirs = ", ".join(f"{d}={s.format}/{s.scaling}" for d, s in self.streams.items())
        return f"qforge.torch.Quantizer({self._c.recipe}:{self._c.role}, {self._c.dtype}, {self._c.usage}: {dirs})"

    def layout(self, m: int, k: int, members: int = 0):
        key = (m, k, members)
        L = self._layouts.get(key)
        if L is None:
            L = self._c.layout(m, k, members)
            self._layouts[key] = L
        return L

    def _dense_layout(self, m: int, k: int):
        """(Layout, nbytes) of an ungrouped [m, k], kept per shape (a layout never changes)."""
        e = self._dense.get((m, k))
        if e is None:
            L = self.layout(m, k)
            e = self._dense.setdefault((m, k), (L, L.nbytes))
        return e

    def prepare(self, arch: str = "sm_90a") -> str:
        """Compiles (or loads) the kernels into the kernel cache; needs no GPU."""
        return self._c.prepare(arch)

    def __call__(self, x: torch.Tensor, *, member_rows: Optional[torch.Tensor] = None,
                 split: Optional[Sequence[int]] = None, noop: Optional[torch.Tensor] = None, seed: int = 0,
                 offset: int = 0, scale: Optional[torch.Tensor] = None,
                 scale1: Optional[torch.Tensor] = None, amax_out: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None) -> "QuantizedTensor":
        """Quantizes x ([M, K], the quantizer's dtype) on torch's current stream. Grouped quantizers
        take member_rows (a CUDA int64 tensor of row offsets [members + 1]) and, when the split is
        known on the host, `split` (each member's rows) for per-member views. noop: a device float,
        1.0 skips the call; seed/offset: stochastic rounding; scale(1): delayed scaling's inputs;
        amax_out: a CUDA fp32 [1] that receives the tensor's amax instead of the result's own amax
        output (left unwritten): the buffer a batched history update (update_amax_histories) reads;
        out: an existing uint8 allocation of layout(M, K).nbytes to write into (eager only: a buffer
        whose address stays, for a launch that a noop flag may skip inside a CUDA graph)."""
        compiling = _is_compiling()
        if out is not None and compiling:
            raise _user_error("out: quantizing into an existing buffer is for eager calls and CUDA graphs, "
                              "not torch.compile")
        if not self.grouped:
            if member_rows is not None or split is not None:
                raise _user_error("member_rows: only for quantizers created with grouped=True")
            if not compiling:  # eager: the checks, one allocation, one call into C++ (_quantize_tensor)
                return _quantize_tensor(self, x, noop, seed, offset, scale, scale1, amax_out, out)
            buf = (torch.ops.qforge.quantize(x, self.id, noop, seed, offset, scale, scale1) if amax_out is None else
                   torch.ops.qforge.quantize_amax_out(x, self.id, noop, seed, offset, scale, scale1, amax_out))
            return QuantizedTensor(buf, self, x.shape[0], x.shape[1], 0, None)
        if amax_out is not None:
            raise _user_error("amax_out: a grouped quantize writes no single per-tensor amax")
        if member_rows is None:
            raise _user_error("member_rows: a grouped quantizer needs the members' row offsets")
        members = member_rows.numel() - 1
        if compiling:
            buf = torch.ops.qforge.quantize_grouped(x, member_rows, self.id, noop, seed, offset, scale, scale1)
        else:
            buf = _quantize_grouped(x, member_rows, self.id, noop, seed, offset, scale, scale1, out)
        return QuantizedTensor(buf, self, x.shape[0], x.shape[1], members, None if split is None else tuple(split))

    # Delayed scaling ---------------------------------------------------------------------------
    def history_length(self, input_index: int = 0) -> int:
        return self._c.history_length(input_index)

    def update_amax_history(self, history: torch.Tensor, amax: torch.Tensor, scale: torch.Tensor, *,
                            scale_inv: Optional[torch.Tensor] = None, noop: Optional[torch.Tensor] = None,
                            input_index: int = 0) -> None:
        """Rolls `history` (fp32 [history_length]) with a quantize's amax output and recomputes
        `scale` (and 1 / scale into scale_inv), on the device, by the recipe's rule."""
        if _is_compiling():
            torch.ops.qforge.update_amax_history(history, amax, scale, scale_inv, noop, self.id, input_index)
        else:
            _update_amax_history(history, amax, scale, scale_inv, noop, self.id, input_index)


def _out_buffer(out, L, x, dev):
    """The call's flat allocation: a fresh one from torch's caching allocator, or `out` checked."""
    if out is None:
        return torch.empty(L.nbytes, dtype=torch.uint8, device=x.device)
    _check_input(out, torch.uint8, dev, "out")
    if out.numel() != L.nbytes:
        raise _user_error(f"out: expected {L.nbytes} bytes (the layout of [{L.m}, {L.k}]), got {out.numel()}")
    return out


def _quantize(x, qid, noop, seed, offset, scale, scale1, amax_out=None, out=None):
    """The quantize ops' implementation: the call's buffer."""
    return _quantize_tensor(_quantizers[qid], x, noop, seed, offset, scale, scale1, amax_out, out).buffer


def _quantize_tensor(q, x, noop, seed, offset, scale, scale1, amax_out, out):
    """An ungrouped quantize of x by q, eager: the QuantizedTensor. The layout and its size come from
    q's per-shape table; the optional tensors are checked (and their addresses read) only when given."""
    if x.dtype != q.dtype or x.dim() != 2 or not x.is_cuda or not x.is_contiguous():
        _check_input(x, q.dtype, None, "x")
        raise _user_error(f"x: expected a 2-D tensor, got shape {tuple(x.shape)}")
    m, k = x.shape
    L, nbytes = q._dense.get((m, k)) or q._dense_layout(m, k)
    dev = x.get_device()
    if noop is None and scale is None and scale1 is None and amax_out is None:
        buf = torch.empty(nbytes, dtype=_uint8, device=_device(dev, x)) if out is None else _out_buffer(out, L, x, dev)
        q._c.quantize(L, x.data_ptr(), buf.data_ptr(), _raw_stream(dev), dev, 0, seed, offset, 0, 0, 0, 0)
    else:  # each given one checked, in this order (delayed scaling: the scale alone)
        noop_p = scale_p = scale1_p = amax_p = 0
        if noop is not None:
            _check_small(noop, "noop", dev)
            noop_p = noop.data_ptr()
        if scale is not None:
            _check_small(scale, "scale", dev)
            scale_p = scale.data_ptr()
        if scale1 is not None:
            _check_small(scale1, "scale1", dev)
            scale1_p = scale1.data_ptr()
        if amax_out is not None:
            _check_small(amax_out, "amax_out", dev)
            amax_p = amax_out.data_ptr()
        buf = torch.empty(nbytes, dtype=_uint8, device=_device(dev, x)) if out is None else _out_buffer(out, L, x, dev)
        q._c.quantize(L, x.data_ptr(), buf.data_ptr(), _raw_stream(dev), dev, noop_p, seed, offset, 0, scale_p,
                      scale1_p, amax_p)
    return QuantizedTensor(buf, q, m, k)


def _quantize_grouped(x, member_rows, qid, noop, seed, offset, scale, scale1, out=None):
    q = _quantizers[qid]
    if x.dtype != q.dtype or x.dim() != 2 or not x.is_cuda or not x.is_contiguous():
        _check_input(x, q.dtype, None, "x")
        raise _user_error(f"x: expected a 2-D tensor, got shape {tuple(x.shape)}")
    dev = x.get_device()
    _check_input(member_rows, torch.int64, dev, "member_rows")
    members = member_rows.numel() - 1
    if members < 1:
        raise _user_error("member_rows: expected members + 1 >= 2 row offsets")
    m, k = x.shape
    L = q._layouts.get((m, k, members)) or q.layout(m, k, members)
    _check_small(noop, "noop", dev)
    _check_small(scale, "scale", dev)
    _check_small(scale1, "scale1", dev)
    buf = _out_buffer(out, L, x, dev)
    q._c.quantize(L, x.data_ptr(), buf.data_ptr(), _raw_stream(dev), dev, _ptr(noop), seed, offset,
                  member_rows.data_ptr(), _ptr(scale), _ptr(scale1))
    return buf


def _update_amax_history(history, amax, scale, scale_inv, noop, qid, input_index):
    q = _quantizers[qid]
    dev = history.get_device() if isinstance(history, torch.Tensor) and history.is_cuda else None
    n = q._c.history_length(input_index)
    _check_small(history, "history", dev, numel=n)
    if history is None:
        raise _user_error("history: expected a CUDA tensor, got None")
    _check_small(amax, "amax", dev)
    _check_small(scale, "scale", dev)
    _check_small(scale_inv, "scale_inv", dev)
    _check_small(noop, "noop", dev)
    q._c.update_history(input_index, history.data_ptr(), amax.data_ptr(), scale.data_ptr(), _ptr(scale_inv),
                        _ptr(noop), _raw_stream(dev), dev)


class HistoryBatch:
    """Every delayed-scaling tensor of a model rolled and rescaled in one launch per history length
    (one for a model whose recipes share a length), bit-identical to update_amax_history on each.
    items: (quantizer, history, amax, scale) or (quantizer, history, amax, scale, scale_inv), the
    tensors fp32 CUDA buffers whose addresses stay (module buffers): built once, then run() each step.
    Build it outside CUDA-graph capture (it uploads its table); run() only launches."""

    def __init__(self, items):
        items = list(items)
        if not items:
            raise _user_error("items: expected at least one delayed-scaling tensor")
        dev = None
        packed = []
        for i, item in enumerate(items):
            if len(item) not in (4, 5):
                raise _user_error(f"items[{i}]: expected (quantizer, history, amax, scale[, scale_inv])")
            q, history, amax, scale = item[:4]
            scale_inv = item[4] if len(item) == 5 else None
            if not isinstance(q, Quantizer) or not q.inputs:
                raise _user_error(f"items[{i}]: expected a delayed-scaling quantizer, got {q!r}")
            if dev is None:
                if not isinstance(history, torch.Tensor) or not history.is_cuda:
                    raise _user_error(f"items[{i}].history: expected a CUDA tensor")
                dev = history.get_device()
            _check_small(history, f"items[{i}].history", dev, numel=q.history_length(0))
            _check_small(amax, f"items[{i}].amax", dev)
            _check_small(scale, f"items[{i}].scale", dev)
            _check_small(scale_inv, f"items[{i}].scale_inv", dev)
            packed.append((q._c, 0, history.data_ptr(), amax.data_ptr(), scale.data_ptr(), _ptr(scale_inv)))
        self.device = dev
        self._c = _C.HistoryBatch(packed, dev)
        self._tensors = items  # the buffers the table points at stay alive with it

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def launches(self) -> int:
        return self._c.launches

    def run(self, noop: Optional[torch.Tensor] = None) -> None:
        """One step's update on torch's current stream; noop (a device float) 1.0 skips it."""
        _check_small(noop, "noop", self.device)
        self._c.run(_ptr(noop), _raw_stream(self.device), self.device)


def update_amax_histories(model: torch.nn.Module, noop: Optional[torch.Tensor] = None) -> int:
    """The batched delayed-scaling update of every qt.Linear in `model` built with
    amax_update="batched" (convert(..., amax_update="batched")): once per step, after backward.
    The batch is built on the first call and kept on the model while its modules' buffers stay;
    returns the number of tensors updated (0: none to update)."""
    from .modules import _batched_history_items
    items = _batched_history_items(model)
    if not items:
        return 0
    key = tuple((id(q), h.data_ptr(), a.data_ptr(), s.data_ptr()) for q, h, a, s in items)
    have = _history_batches.get(model)
    if have is None or have[0] != key:
        have = (key, HistoryBatch(items))
        _history_batches[model] = have
    have[1].run(noop)
    return len(items)


def history_batch(model: torch.nn.Module) -> Optional[HistoryBatch]:
    """The batch update_amax_histories last built for `model` (None before its first call)."""
    have = _history_batches.get(model)
    return None if have is None else have[1]


# model -> (its delayed-scaling buffers' addresses, HistoryBatch): kept beside the model, not on it,
# so copying or pickling the model does not meet the compiled batch.
_history_batches: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


# ---------------------------------------------------------------------------------------------- tensors


class QuantizedTensor:
    """What one quantize call wrote: every output of the plan in one uint8 allocation (`buffer`), its
    quantizer (format, scaling and layout per direction: `streams`) and the input's shape."""
    __slots__ = ("buffer", "quantizer", "m", "k", "members", "split")

    def __init__(self, buffer: torch.Tensor, quantizer: Quantizer, m: int, k: int, members: int = 0,
                 split: Optional[tuple] = None):
        self.buffer, self.quantizer, self.m, self.k, self.members, self.split = buffer, quantizer, m, k, members, split

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.m, self.k))

    @property
    def layout(self):
        return self.quantizer.layout(self.m, self.k, self.members)

    @property
    def directions(self) -> List[str]:
        return list(self.quantizer.streams)

    @property
    def streams(self) -> dict:
        """direction -> qforge._C.Stream (format, scaling, layout, scale_layout, rht, stochastic)."""
        return self.quantizer.streams

    def __repr__(self) -> str:
        return f"QuantizedTensor([{self.m}, {self.k}], {self.quantizer!r})"

    def _view(self, name, offset, nbytes, dtype, elem, shape):
        raw = self.buffer[offset:offset + nbytes]
        t = _VIEW_DTYPES.get(dtype)
        if t is None or t.itemsize != elem:
            return raw.view(list(shape[:-1]) + [shape[-1] * elem]) if shape else raw
        return raw.view(t).view(shape)

    @property
    def buffers(self) -> Dict[str, torch.Tensor]:
        """Every output as a view into `buffer`: name -> tensor (fp8 / int8 / fp32 / bf16 typed where
        torch has the type, else uint8 bytes)."""
        return {b[0]: self._view(*b[:1], b[6], b[7], b[3], b[4], b[5]) for b in self.layout.buffers}

    def __getitem__(self, name: str) -> torch.Tensor:
        for b in self.layout.buffers:
            if b[0] == name:
                return self._view(b[0], b[6], b[7], b[3], b[4], b[5])
        raise KeyError(f"{name!r}: the outputs are {[b[0] for b in self.layout.buffers]}")

    def _stream_index(self, direction: Optional[str]) -> int:
        return _direction_index(self.quantizer, direction)

    def dequantize(self, dtype: torch.dtype = torch.bfloat16, direction: Optional[str] = None) -> torch.Tensor:
        """The direction's values (None: rowwise if written, else columnwise) as `dtype` [M, K]: a
        transposed copy is dequantized in its own [K, M] layout and returned as its .t() view.
        Exact: decode(q) x scale in fp32, one rounding to dtype (docs/numerics.md, "Dequantize");
        RHT copies stay in the Hadamard domain."""
        if self.members:
            raise _user_error("dequantize: a grouped tensor dequantizes per member: .member(i).dequantize()")
        index = self._stream_index(direction)
        code = _dtype_code(dtype)
        if _is_compiling():
            out = torch.ops.qforge.dequantize(self.buffer, self.quantizer.id, self.m, self.k, index, code)
        else:
            out = _dequantize(self.buffer, self.quantizer.id, self.m, self.k, index, code)
        return out.t() if self.quantizer._transposed[index] else out

    # Members of a grouped quantize ----------------------------------------------------------------
    def member(self, i: int) -> "QuantizedTensor":
        return self.member_views()[i]

    def member_views(self) -> List["QuantizedTensor"]:
        """Each member's outputs as a QuantizedTensor of its own (views into this buffer). Needs the
        split on the host (quantize(..., split=...)): the device offsets alone do not say it."""
        if not self.members:
            raise _user_error("member_views: only a grouped quantize has members")
        if self.split is None:
            raise _user_error("split: this grouped tensor's member sizes live on the device only; pass split= "
                              "(each member's rows) to the quantize call for per-member views")
        layouts = self.quantizer._c.member_layouts(self.layout, list(self.split))
        return [_MemberTensor(self.buffer, self.quantizer, L) for L in layouts]

    # Saving ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """A dict torch.save can write: the outputs' bytes (one uint8 tensor each) and what they are."""
        q = self.quantizer._c
        return {"qforge_quantized": 1, "recipe": q.recipe, "role": q.role, "dtype": q.dtype, "usage": q.usage,
                "grouped": q.grouped, "shape": [self.m, self.k], "members": self.members,
                "split": None if self.split is None else list(self.split),
                "buffers": {b[0]: self.buffer[b[6]:b[6] + b[7]].clone() for b in self.layout.buffers}}

    @classmethod
    def from_state_dict(cls, state: dict, quantizer: Quantizer, device=None) -> "QuantizedTensor":
        """Rebuilds a QuantizedTensor saved by state_dict() for `quantizer`, which must be of the same
        recipe, role, dtype and usage; every buffer must match the layout (UserError naming it)."""
        if not isinstance(state, dict) or state.get("qforge_quantized") != 1:
            raise _user_error("state: not a qforge QuantizedTensor state_dict")
        q = quantizer._c
        for key, have in (("recipe", q.recipe), ("role", q.role), ("dtype", q.dtype), ("usage", q.usage),
                          ("grouped", q.grouped)):
            if state.get(key) != have:
                raise _user_error(f"state: saved with {key} {state.get(key)!r}, the quantizer has {have!r}")
        m, k = state["shape"]
        members = state.get("members", 0)
        L = quantizer.layout(m, k, members)
        saved = state["buffers"]
        names = [b[0] for b in L.buffers]
        if sorted(saved) != sorted(names):
            raise _user_error(f"state: buffers {sorted(saved)}, the layout has {sorted(names)}")
        first = next(iter(saved.values()))
        device = torch.device(device if device is not None else first.device)
        if device.type != "cuda":
            raise _user_error(f"device: the buffers were loaded on {device}; pass device='cuda' (or a CUDA "
                              "device) to rebuild the tensor where the kernels run")
        buf = torch.empty(L.nbytes, dtype=torch.uint8, device=device)
        for b in L.buffers:
            t = saved[b[0]]
            if t.dtype != torch.uint8 or t.numel() != b[7]:
                raise _user_error(f"state: buffer {b[0]!r} holds {t.numel()} {t.dtype}, expected {b[7]} uint8")
            buf[b[6]:b[6] + b[7]].copy_(t)
        split = state.get("split")
        return cls(buf, quantizer, m, k, members, None if split is None else tuple(split))


def _direction_index(q: Quantizer, direction: Optional[str]) -> int:
    """The stream index of q's direction (None: rowwise if written, else columnwise)."""
    index = q._index
    if direction is None:
        direction = "rowwise" if "rowwise" in index else "columnwise"
    if direction not in index:
        raise _user_error(f"direction: the quantizer writes {list(index)}, not {direction!r}")
    return index[direction]


class _MemberTensor(QuantizedTensor):
    """One member of a grouped quantize: its own layout, offsets into the grouped buffer."""
    __slots__ = ("_layout",)

    def __init__(self, buffer, quantizer, layout):
        super().__init__(buffer, quantizer, layout.m, layout.k, 0, None)
        self._layout = layout

    @property
    def layout(self):
        return self._layout

    def dequantize(self, dtype: torch.dtype = torch.bfloat16, direction: Optional[str] = None) -> torch.Tensor:
        index = self._stream_index(direction)
        code = _dtype_code(dtype)
        out = _dequantize_layout(self.buffer, self.quantizer, self._layout, index, code)
        return out.t() if self.quantizer._transposed[index] else out


_CODES = (torch.float32, torch.bfloat16, torch.float16)
_CODE_NAMES = ("fp32", "bf16", "fp16")


def _dtype_code(dtype) -> int:
    if dtype not in _CODES:
        raise _user_error(f"dtype: expected float32, bfloat16 or float16, got {dtype}")
    return _CODES.index(dtype)


def _stored_shape(q: Quantizer, m: int, k: int, index: int):
    return (k, m) if q._transposed[index] else (m, k)


def _dequantize_layout(buf, q, L, index, code):
    dev = buf.get_device()
    rows, cols = _stored_shape(q, L.m, L.k, index)
    out = torch.empty((rows, cols), dtype=_CODES[code], device=buf.device)
    q._c.dequantize(L, index, buf.data_ptr(), out.data_ptr(), _CODE_NAMES[code], _raw_stream(dev), dev)
    return out


def _dequantize(buf, qid, m, k, index, code):
    q = _quantizers[qid]
    return _dequantize_layout(buf, q, q.layout(m, k), index, code)


def dequantize(t: QuantizedTensor, dtype: torch.dtype = torch.bfloat16, direction: Optional[str] = None):
    return t.dequantize(dtype, direction)


# ---------------------------------------------------------------------------------------------- GEMM

_OUT_CODES = {torch.bfloat16: 1, torch.float32: 0}


def _plan_entry(qa, am, ak, ai, qb, bm, bk, bi, out_code, accumulate):
    """(GemmPlan, D's shape (m, n), workspace bytes): the table's entry, each read from the plan once
    (a plan's shape and workspace never change)."""
    key = (qa, am, ak, ai, qb, bm, bk, bi, out_code, accumulate)
    e = _plans.get(key)
    if e is None:
        a, b = _quantizers[qa], _quantizers[qb]

        def make():
            p = _C.GemmPlan(a._c, a.layout(am, ak), ai, b._c, b.layout(bm, bk), bi, _CODE_NAMES[out_code], accumulate)
            return (p, (p.m, p.n), p.workspace_bytes())
        e = _plans.get_or_create(key, make)
    return e


def _plan(qa, am, ak, ai, qb, bm, bk, bi, out_code, accumulate):
    return _plan_entry(qa, am, ak, ai, qb, bm, bk, bi, out_code, accumulate)[0]


def _out_code(out_dtype, accumulate_into=None) -> int:
    """The GEMM output's dtype code: fp32 when accumulating, else out_dtype (bf16 or fp32)."""
    code = _OUT_CODES.get(torch.float32 if accumulate_into is not None else out_dtype)
    if code is None:
        raise _user_error(f"out_dtype: expected bfloat16 or float32, got {out_dtype}")
    return code


def _gemm_buffers(p, shape, out_code, out, like, dev):
    """A GEMM call's output (allocated here, or `out` checked against the plan's shape) and the
    plan's workspace, both on `like`'s device."""
    if out is None:
        d = torch.empty(shape, dtype=_CODES[out_code], device=like.device)
    else:
        _check_input(out, _CODES[out_code], dev, "out")
        if tuple(out.shape) != tuple(shape):
            raise _user_error(f"out: expected shape {list(shape)}, got {list(out.shape)}")
        d = out
    ws = p.workspace_bytes()
    return d, (torch.empty(ws, dtype=torch.uint8, device=like.device) if ws else None)


def _gemm(a_buf, qa, am, ak, ai, b_buf, qb, bm, bk, bi, out_code, accumulate, out):
    p, shape, ws = _plan_entry(qa, am, ak, ai, qb, bm, bk, bi, out_code, accumulate)
    dev = a_buf.get_device()
    if b_buf.get_device() != dev:
        raise _user_error(f"b: on cuda:{b_buf.get_device()}, a on cuda:{dev}")
    device = _device(dev, a_buf)
    if out is None:
        d = torch.empty(shape, dtype=_CODES[out_code], device=device)
    else:
        _check_input(out, _CODES[out_code], dev, "out")
        if tuple(out.shape) != shape:
            raise _user_error(f"out: expected shape {list(shape)}, got {list(out.shape)}")
        d = out
    if ws:
        w = torch.empty(ws, dtype=_uint8, device=device)  # alive until the launch is queued
        p.run(a_buf.data_ptr(), b_buf.data_ptr(), d.data_ptr(), w.data_ptr(), _raw_stream(dev), dev, True)
    else:
        p.run(a_buf.data_ptr(), b_buf.data_ptr(), d.data_ptr(), 0, _raw_stream(dev), dev, True)
    return d


def gemm(a: QuantizedTensor, b: QuantizedTensor, *, a_direction: str = "rowwise", b_direction: str = "rowwise",
         out_dtype: torch.dtype = torch.bfloat16, accumulate_into: Optional[torch.Tensor] = None) -> torch.Tensor:
    """D = A @ B^T on the directions' stored data (A [rows_a, K], B [rows_b, K] in their layouts):
    fprop gemm(x, w); dgrad gemm(dy, w, b_direction="columnwise"); wgrad gemm(dy, x, "columnwise",
    "columnwise"). The fused kernel where one reads both formats (auto route for MXFP8 / NVFP4);
    mixed formats (e.g. MXFP8 x NVFP4) through the dequant route: both operands dequantized into bf16
    copies, then the bf16 GEMM. accumulate_into: an fp32 [rows_a, rows_b] tensor, D += A @ B^T."""
    # Two plain (ungrouped) QuantizedTensors pass every check below: one type test each on the way.
    if type(a) is not QuantizedTensor or type(b) is not QuantizedTensor or a.members or b.members:
        if not isinstance(a, QuantizedTensor) or not isinstance(b, QuantizedTensor):
            raise _user_error("a, b: expected QuantizedTensors")
        if a.members or b.members:
            raise _user_error("gemm: grouped tensors take qt.grouped_gemm with the members' offsets")
        if isinstance(a, _MemberTensor) or isinstance(b, _MemberTensor):
            raise _user_error("gemm: a member view's buffers sit inside its grouped allocation; run the grouped "
                              "quantize's members through qt.grouped_gemm")
    qa, qb = a.quantizer, b.quantizer
    ai = qa._index.get(a_direction)  # a direction the quantizer writes; else the rules and errors below
    if ai is None:
        ai = _direction_index(qa, a_direction)
    bi = qb._index.get(b_direction)
    if bi is None:
        bi = _direction_index(qb, b_direction)
    acc = accumulate_into is not None
    out_code = _OUT_CODES.get(out_dtype) if not acc else None
    if out_code is None:
        out_code = _out_code(out_dtype, accumulate_into)
    if not _is_compiling():
        return _gemm(a.buffer, qa.id, a.m, a.k, ai, b.buffer, qb.id, b.m, b.k, bi, out_code, acc, accumulate_into)
    args = (a.buffer, qa.id, a.m, a.k, ai, b.buffer, qb.id, b.m, b.k, bi, out_code)
    if acc:
        torch.ops.qforge.gemm_accumulate(accumulate_into, *args)
        return accumulate_into
    return torch.ops.qforge.gemm(*args)


def gemm_plan(a: QuantizedTensor, b: QuantizedTensor, a_direction: str = "rowwise", b_direction: str = "rowwise",
              out_dtype: torch.dtype = torch.bfloat16):
    """The compiled core's plan gemm() runs for these operands (route, describe(), prepare())."""
    return _plan(a.quantizer.id, a.m, a.k, a._stream_index(a_direction), b.quantizer.id, b.m, b.k,
                 b._stream_index(b_direction), _out_code(out_dtype), False)


def _grouped_plan(qa, am, ak, amem, ai, qb, bm, bk, bmem, bi, wgrad, out_code, accumulate):
    key = (qa, am, ak, amem, ai, qb, bm, bk, bmem, bi, wgrad, out_code, accumulate)
    p = _gplans.get(key)
    if p is None:
        a, b = _quantizers[qa], _quantizers[qb]
        p = _gplans.get_or_create(key, lambda: _C.GroupedGemmPlan(a._c, a.layout(am, ak, amem), ai, b._c,
                                                                  b.layout(bm, bk, bmem), bi, wgrad,
                                                                  _CODE_NAMES[out_code], accumulate))
    return p


def _grouped_gemm(a_buf, qa, am, ak, amem, ai, b_buf, qb, bm, bk, bmem, bi, offsets, wgrad, out_code, out):
    p = _grouped_plan(qa, am, ak, amem, ai, qb, bm, bk, bmem, bi, wgrad, out_code, out is not None)
    dev = a_buf.get_device()
    if b_buf.get_device() != dev:
        raise _user_error(f"b: on cuda:{b_buf.get_device()}, a on cuda:{dev}")
    _check_input(offsets, torch.int64, dev, "offsets")
    if offsets.numel() != amem + 1:
        raise _user_error(f"offsets: expected {amem + 1} row offsets, got {offsets.numel()}")
    shape = tuple(p.out_shape)
    d, w = _gemm_buffers(p, shape, out_code, out, a_buf, dev)
    p.run(a_buf.data_ptr(), b_buf.data_ptr(), d.data_ptr(), offsets.data_ptr(), _ptr(w), _raw_stream(dev), dev, True)
    return d


def grouped_gemm(a: QuantizedTensor, b: QuantizedTensor, offsets: torch.Tensor, *, a_direction: str = "rowwise",
                 b_direction: str = "rowwise", wgrad: bool = False, out_dtype: torch.dtype = torch.bfloat16,
                 accumulate_into: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The grouped GEMMs of an MoE layer on grouped quantizes whose members are the experts, split by
    `offsets` (device int64 [G + 1], the tokens' row offsets the quantizes took):
      fprop  gemm(x, w, offsets)                         -> [M, N]   (w: the stacked [G * N, K] weights,
      dgrad  gemm(dy, w, offsets, b_direction="columnwise") -> [M, K]  quantized with G members of N rows)
      wgrad  gemm(dy, x, offsets, "columnwise", "columnwise", wgrad=True) -> [G, N, K]
    Each member's tokens must meet the recipe's K-grouped alignment for wgrad (16 fp8 / 32 nvfp4 tokens)."""
    if not a.members or not b.members:
        raise _user_error("a, b: grouped_gemm takes grouped quantizes (grouped=True quantizers)")
    ai, bi = a._stream_index(a_direction), b._stream_index(b_direction)
    out_code = _out_code(out_dtype, accumulate_into)
    return _grouped_gemm(a.buffer, a.quantizer.id, a.m, a.k, a.members, ai, b.buffer, b.quantizer.id, b.m, b.k,
                         b.members, bi, offsets, bool(wgrad), out_code, accumulate_into)


# ---------------------------------------------------------------------------------------------- linear layers

# A linear layer's quantizes and GEMMs in one call into the compiled core per direction: a step's
# host cost is one Python call and its allocations, not one per quantize and GEMM. The launches
# are the separate calls' own, in the same order, so the results are the same bits.


def _fprop_plan(qx: Quantizer, m: int, k: int, qw: Quantizer, n: int, out_code: int):
    """(fprop GemmPlan, the input layout's bytes, the weight layout's bytes, workspace bytes, D's shape,
    D's dtype) of x [m, k] by w [n, k], both rowwise: each read from the compiled core once."""
    key = ("fprop", qx.id, m, k, qw.id, n, out_code)
    e = _lplans.get(key)
    if e is None:
        def make():
            p = _plan(qx.id, m, k, _direction_index(qx, "rowwise"), qw.id, n, k, _direction_index(qw, "rowwise"),
                      out_code, False)
            return (p, qx.layout(m, k).nbytes, qw.layout(n, k).nbytes, p.workspace_bytes(), (p.m, p.n),
                    _CODES[out_code])
        e = _lplans.get_or_create(key, make)
    return e


def _check_operand(t, q: Quantizer, name: str) -> int:
    """t: a 2-D contiguous CUDA tensor of q's dtype; returns its device index."""
    if t.dtype != q.dtype or t.dim() != 2 or not t.is_cuda or not t.is_contiguous():
        _check_input(t, q.dtype, None, name)
        raise _user_error(f"{name}: expected a 2-D tensor, got shape {tuple(t.shape)}")
    return t.get_device()


def _linear_forward(x, qx: Quantizer, xa, w, qw: Quantizer, wa, n: int, w_buf, out_code: int):
    """Eager: the input's quantize, the weight's (w given: into w_buf, or a fresh allocation when
    w_buf is None; w None: w_buf is the weight's kept copy, [n, K] in qw's layout), then fprop, in
    one call. xa, wa: (noop, seed, offset, scale, amax_out, history) of each quantize (history: the
    delayed-scaling update after it, as the modules run it). Returns (D, x's buffer, w's buffer)."""
    if x.dtype != qx.dtype or x.dim() != 2 or not x.is_cuda or not x.is_contiguous():
        _check_operand(x, qx, "x")
    dev = x.get_device()
    m, k = x.shape
    p, x_nbytes, w_nbytes, ws, shape, dtype = _fprop_plan(qx, m, k, qw, n, out_code)
    device = _device(dev, x)
    if w is not None:
        if w.dtype != qw.dtype or w.dim() != 2 or not w.is_cuda or not w.is_contiguous():
            _check_operand(w, qw, "w")
        if w.get_device() != dev:
            raise _user_error(f"w: on cuda:{w.get_device()}, x on cuda:{dev}")
        if w.shape[0] != n or w.shape[1] != k:
            raise _user_error(f"w: expected shape [{n}, {k}], got {list(w.shape)}")
    if w_buf is None:
        w_buf = torch.empty(w_nbytes, dtype=_uint8, device=device)
    elif w_buf.get_device() != dev or w_buf.numel() != w_nbytes or w_buf.dtype != _uint8:
        _check_input(w_buf, torch.uint8, dev, "w_copy")
        raise _user_error(f"w_copy: expected {w_nbytes} bytes (the layout of [{n}, {k}]), got {w_buf.numel()}")
    x_buf = torch.empty(x_nbytes, dtype=_uint8, device=device)
    d = torch.empty(shape, dtype=dtype, device=device)
    wsp = torch.empty(ws, dtype=torch.uint8, device=device) if ws else None  # alive until the launches are queued
    xn, xs, xo, xsc, xam, xh = xa
    wn, ws_, wo, wsc, wam, wh = wa
    p.linear_forward(x.data_ptr(), x_buf.data_ptr(), 0 if xn is None else xn.data_ptr(), xs, xo,
                     0 if xsc is None else xsc.data_ptr(), 0 if xam is None else xam.data_ptr(),
                     0 if xh is None else xh.data_ptr(), 0 if w is None else w.data_ptr(), w_buf.data_ptr(),
                     0 if wn is None else wn.data_ptr(), ws_, wo, 0 if wsc is None else wsc.data_ptr(),
                     0 if wam is None else wam.data_ptr(), 0 if wh is None else wh.data_ptr(), d.data_ptr(),
                     0 if wsp is None else wsp.data_ptr(), _raw_stream(dev), dev)
    return d, x_buf, w_buf


def linear_forward(x: torch.Tensor, w: Optional[torch.Tensor], qx: Quantizer, qw: Quantizer, *, x_seed: int = 0,
                   x_offset: int = 0, x_scale: Optional[torch.Tensor] = None, w_seed: int = 0, w_offset: int = 0,
                   w_scale: Optional[torch.Tensor] = None, w_copy: Optional[QuantizedTensor] = None,
                   out_dtype: torch.dtype = torch.bfloat16):
    """A linear layer's forward in one call: `gemm(qx(x, seed=x_seed, offset=x_offset, scale=x_scale),
    qw(w, ...), out_dtype=out_dtype)`, bit for bit, with one call into the compiled core (eager) or
    one custom op (qforge::linear_forward under torch.compile). w_copy: the weight's kept
    QuantizedTensor (of qw), used as it is instead of quantizing w (pass w=None).
    Returns (D, the input's QuantizedTensor, the weight's)."""
    out_code = _OUT_CODES.get(out_dtype)
    if out_code is None:
        out_code = _out_code(out_dtype)  # the error
    if w_copy is not None:
        if w is not None:
            raise _user_error("w: pass either the weight or its kept copy (w_copy), not both")
        if not isinstance(w_copy, QuantizedTensor) or w_copy.quantizer is not qw or w_copy.members \
                or isinstance(w_copy, _MemberTensor):
            raise _user_error("w_copy: expected a QuantizedTensor of qw (a single tensor)")
        n = w_copy.m
        if x.dim() == 2 and w_copy.k != x.shape[1]:
            raise _user_error(f"w_copy: holds [{w_copy.m}, {w_copy.k}], x has K = {x.shape[1]}")
    elif w is None:
        raise _user_error("w: expected the weight (or its kept copy as w_copy)")
    else:
        n = w.shape[0]
    if _is_compiling():
        if w_copy is not None:
            d, xb = torch.ops.qforge.linear_forward_cached(x, qx.id, x_seed, x_offset, x_scale, w_copy.buffer, qw.id,
                                                           n, out_code)
            wb = w_copy.buffer
        else:
            d, xb, wb = torch.ops.qforge.linear_forward(x, qx.id, x_seed, x_offset, x_scale, w, qw.id, w_seed,
                                                        w_offset, w_scale, out_code)
    else:
        if x_scale is not None or w_scale is not None:
            dev = x.get_device() if isinstance(x, torch.Tensor) and x.is_cuda else None
            _check_small(x_scale, "x_scale", dev)
            _check_small(w_scale, "w_scale", dev)
        d, xb, wb = _linear_forward(x, qx, (None, x_seed, x_offset, x_scale, None, None),
                                    w, qw, (None, w_seed, w_offset, w_scale, None, None), n,
                                    None if w_copy is None else w_copy.buffer, out_code)
    m, k = x.shape
    tw = w_copy if w_copy is not None else QuantizedTensor(wb, qw, n, k)
    return d, QuantizedTensor(xb, qx, m, k), tw


def _backward_plans(qg: Quantizer, m: int, n: int, tw, tx, need_dx: bool, need_dw: bool, out_code: int,
                    accumulate: bool):
    """(grad_output's layout, dgrad plan, its workspace bytes, wgrad plan, its workspace bytes); a plan
    not needed is None."""
    key = ("bprop", qg.id, m, n, tw.quantizer.id, tw.m, tw.k, tx.quantizer.id, tx.m, tx.k, need_dx, need_dw, out_code,
           accumulate)
    e = _lplans.get(key)
    if e is None:
        def make():
            dp = wp = None
            if need_dx:
                dp = _plan(qg.id, m, n, _direction_index(qg, "rowwise"), tw.quantizer.id, tw.m, tw.k,
                           tw._stream_index("columnwise"), out_code, False)
            if need_dw:
                wp = _plan(qg.id, m, n, _direction_index(qg, "columnwise"), tx.quantizer.id, tx.m, tx.k,
                           tx._stream_index("columnwise"), 0 if accumulate else out_code, accumulate)
            return (qg.layout(m, n), dp, dp.workspace_bytes() if dp else 0, wp, wp.workspace_bytes() if wp else 0)
        e = _lplans.get_or_create(key, make)
    return e


def _linear_backward(dy, qg: Quantizer, ga, tw, tx, need_dx: bool, need_dw: bool, out_code: int, main_grad=None):
    """Eager: grad_output's quantize (ga: as _linear_forward's xa), dgrad (dy rowwise x the weight's
    columnwise copy tw) and wgrad (dy columnwise x the input's columnwise copy tx; into main_grad,
    fp32, when given) in one call. Returns (dx or None, dw or None, grad_output's buffer)."""
    dev = _check_operand(dy, qg, "grad_output")
    m, n = dy.shape
    Lg, dp, dws, wp, wws = _backward_plans(qg, m, n, tw, tx, need_dx, need_dw, out_code, main_grad is not None)
    if tw.buffer.get_device() != dev or tx.buffer.get_device() != dev:
        raise _user_error(f"the saved copies are not on grad_output's device cuda:{dev}")
    device = _device(dev, dy)
    g_buf = torch.empty(Lg.nbytes, dtype=torch.uint8, device=device)
    dx = dw = dxw = dww = None
    if dp is not None:
        dx = torch.empty((dp.m, dp.n), dtype=_CODES[out_code], device=device)
        dxw = torch.empty(dws, dtype=torch.uint8, device=device) if dws else None
    if wp is not None:
        if main_grad is not None:
            _check_input(main_grad, torch.float32, dev, "main_grad")
            if tuple(main_grad.shape) != (wp.m, wp.n):
                raise _user_error(f"main_grad: expected shape {[wp.m, wp.n]}, got {list(main_grad.shape)}")
            dw = main_grad
        else:
            dw = torch.empty((wp.m, wp.n), dtype=_CODES[out_code], device=device)
        dww = torch.empty(wws, dtype=torch.uint8, device=device) if wws else None
    _C.linear_backward(qg._c, Lg, dp, wp, dy.data_ptr(), g_buf.data_ptr(), _ptr(ga[0]), ga[1], ga[2], _ptr(ga[3]),
                       _ptr(ga[4]), _ptr(ga[5]), tw.buffer.data_ptr(), tx.buffer.data_ptr(), _ptr(dx), _ptr(dxw),
                       _ptr(dw), _ptr(dww), _raw_stream(dev), dev)
    return dx, (None if main_grad is not None else dw), g_buf


from . import _ops  # noqa: E402,F401  (registers the custom ops)
from .modules import GroupedLinear, Linear, convert  # noqa: E402,F401
from .checkpointing import checkpoint, checkpoint_context  # noqa: E402,F401
from .int8_training import (Int8AdamW, Int8Linear, Int8SGD, clip_grad_norm_, convert_int8,  # noqa: E402,F401
                            int8_adamw_step, int8_sgd_step, weight_memory_bytes)
__all__ += ["Int8Linear", "convert_int8", "Int8SGD", "Int8AdamW", "int8_sgd_step", "int8_adamw_step",
            "weight_memory_bytes", "clip_grad_norm_", "checkpoint", "checkpoint_context"]
