"""qforge from Python: recipes, the fused quantize kernels and the grouped GEMMs that consume them.

A thin layer over libqforge.so's C API (runtime/qforge.h, loaded with ctypes): no compiled
extension, no dependency but the library. Recipes, buffer queries and ahead-of-time kernel
compilation (`prepare`) need no GPU; `Quantizer.quantize` and `Gemm.run` take torch CUDA tensors and
launch on torch's current stream (the `*_raw` forms take device addresses instead).

    import qforge, torch
    ctx = qforge.Context("recipes/mxfp8_hopper.json")
    q = ctx.quantizer("linear:input")                      # bf16 input, the recipe's usage
    out = q.quantize(torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16))
    out["rowwise_data"], out["rowwise_scale_inv"]          # e4m3 data, e8m0 mn_major grid

Errors: every failing call raises UserError (bad recipe, role, shape, buffer: the message names
the JSON path or argument), CudaError (no driver / GPU, a failed driver call) or InternalError, all
QforgeError, with the library's message.

Log: the library's messages (one INFO record per JIT compile with its kernels, arch and
milliseconds; DEBUG per cache hit; warnings) go to the `logging` logger "qforge" (qforge/_log.py):
QFORGE_LOG_LEVEL (default warn) or set_log_level decides what the library sends, then logging
filters as usual.
"""
import contextlib
import ctypes
import operator
import os
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

from pathlib import Path

from . import _capi, _log

__all__ = ["QforgeError", "UserError", "InternalError", "CudaError", "BufferInfo", "Context", "Quantizer",
           "Gemm", "evict_cache", "library", "library_version", "set_log_level", "get_log_level", "recipes_dir",
           "__version__"]


class QforgeError(Exception):
    """A qforge call failed; `status` is the C API's qf_status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class UserError(QforgeError):
    """Bad argument, recipe, role, shape or buffer."""


class InternalError(QforgeError):
    """A bug in qforge (or out of memory)."""


class CudaError(QforgeError):
    """No driver / no GPU, or a CUDA driver call failed."""


_ERRORS = {_capi.QF_ERR_USER: UserError, _capi.QF_ERR_INTERNAL: InternalError, _capi.QF_ERR_CUDA: CudaError}
_lib = None


__version__ = _capi.PACKAGE_VERSION


def library_version() -> str:
    """The loaded libqforge.so's version (qf_version); the package loads only its own major.minor."""
    return library().qf_version().decode()


def library():
    """The loaded libqforge.so (loaded on first use; see _capi.candidate_paths), its log messages
    routed to the logger "qforge"."""
    global _lib
    if _lib is None:
        lib = _capi.load()
        _log.install_library(lib)
        _lib = lib
    return _lib


def set_log_level(level) -> None:
    """What the library sends to the logger "qforge": "off", "error", "warn" (the default, or
    QFORGE_LOG_LEVEL), "info" (a line per JIT compile) or "debug" (and per cache hit), or a
    logging level (logging.INFO). Applies to libqforge.so and to qforge._C (qforge.torch), loaded
    or not yet, and also sets the "qforge" logger's level to match (but for "off"), so that the
    records pass it; handlers still filter them. With no logging handler configured, the records
    are written to stderr as the library writes them ("qforge: info: compiled ...")."""
    try:
        c_level = _log.to_c_level(level)
    except ValueError as e:
        raise _user_error(str(e)) from None
    _log.set_level(c_level)
    if c_level != _log.OFF:
        _log.logger.setLevel(_log.to_py_level(c_level))


def get_log_level() -> str:
    """The library's threshold: set_log_level's, else QFORGE_LOG_LEVEL's ("warn" when unset)."""
    level = _log.get_level()
    if level is None:
        library()
        level = _log.get_level()
    return _log.level_name(level)


def recipes_dir() -> Path:
    """The shipped recipes: the installed wheel's qforge/recipes, else the checkout's recipes/."""
    here = Path(__file__).resolve().parent
    for d in (here / "recipes", here.parents[1] / "recipes"):
        if (d / "recipe.schema.json").exists():
            return d
    raise FileNotFoundError(f"qforge: no shipped recipes beside {here} (a wheel has them in qforge/recipes)")


def _call(name: str, *args) -> None:
    lib = library()
    status = getattr(lib, name)(*args)
    if status != _capi.QF_OK:
        message = (lib.qf_last_error() or b"").decode(errors="replace")
        raise _ERRORS.get(status, QforgeError)(status, message)


def _str(value, name: str) -> bytes:
    """A required string argument of the C API; UserError naming `name` for anything else, and
    for a NUL character (C would end the string there)."""
    if not isinstance(value, str):
        raise _user_error(f"{name}: expected a string, got {value!r}")
    if "\0" in value:
        raise _user_error(f"{name}: a NUL character in {value!r}")
    return value.encode()


def _bytes(value, name: str) -> Optional[bytes]:
    """An optional string argument (None: the C API's NULL), as _str."""
    return None if value is None else _str(value, name)


def _path(value, name: str) -> bytes:
    """A file path (str, bytes or os.PathLike) for the C API; UserError for anything else or a NUL."""
    try:
        b = os.fsencode(value)
    except TypeError:
        raise _user_error(f"{name}: expected a path, got {value!r}") from None
    if b"\0" in b:
        raise _user_error(f"{name}: a NUL character in {value!r}")
    return b


def _ptr(value, name: str) -> int:
    """A device address (0: NULL) for the C API: an unsigned 64-bit integer."""
    return _int(value, name, signed=False)


def _int(value, name: str, bits: int = 64, signed: bool = True) -> int:
    """An integer argument of the C API: an int or anything with __index__ (numpy integers), not a
    bool or a float, that fits the C type (ctypes would truncate or wrap it); UserError naming
    `name` otherwise."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise _user_error(f"{name}: expected an integer, got {value!r}")
    v = operator.index(value)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not lo <= v <= hi:
        raise _user_error(f"{name}: {v} does not fit the C API's {'' if signed else 'u'}int{bits}")
    return v


def _user_error(message: str) -> UserError:
    return UserError(_capi.QF_ERR_USER, message)


@dataclass(frozen=True)
class BufferInfo:
    """One buffer a quantizer writes (or reads, e.g. delayed scaling's "scale")."""
    name: str
    dtype: str                 # what the bytes mean: "e4m3", "e2m1x2", "e8m0", "fp32", ...
    kind: str                  # "data", "scale_inv", "amax" or "scale"
    element_size: int          # storage bytes per element
    stream: int                # plan stream index; -1 for amax outputs / shared inputs
    zero_padding: bool         # padding entries must be zero (swizzled scales)
    shape: Tuple[int, ...]
    bytes: int
    scale_layout: Optional[str]  # block scale grids: "compact", "swizzled" or "mn_major"

    @staticmethod
    def _from_c(c: _capi.BufferInfoC) -> "BufferInfo":
        return BufferInfo(c.name.decode(), c.dtype.decode(), _capi.BUFFER_KINDS.get(c.kind, str(c.kind)),
                          c.element_size, c.stream, bool(c.zero_padding), tuple(c.shape[i] for i in range(c.ndim)),
                          c.bytes, c.scale_layout.decode() if c.scale_layout else None)


class _Handle:
    """Owns one C handle; destroyed by close(), the with-block's end or garbage collection."""
    _destroy = ""

    def __init__(self, handle: ctypes.c_void_p):
        self._h = handle

    @property
    def _handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._h

    def close(self) -> None:
        if getattr(self, "_h", None):
            getattr(library(), self._destroy)(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass


class Context(_Handle):
    """Parsed, validated recipes: one path, a list of paths, or (from_json) a recipe's text."""
    _destroy = "qf_context_destroy"

    def __init__(self, recipes: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]):
        paths = [recipes] if isinstance(recipes, (str, bytes, os.PathLike)) else list(recipes)
        arr = (ctypes.c_char_p * len(paths))(*[_path(p, f"recipes[{i}]") for i, p in enumerate(paths)])
        h = ctypes.c_void_p()
        _call("qf_context_create", arr, len(paths), ctypes.byref(h))
        super().__init__(h)

    @classmethod
    def from_json(cls, text: str) -> "Context":
        h = ctypes.c_void_p()
        _call("qf_context_create_from_json", _str(text, "text"), ctypes.byref(h))
        self = cls.__new__(cls)
        _Handle.__init__(self, h)
        return self

    @property
    def recipes(self) -> list:
        n = ctypes.c_int()
        _call("qf_context_num_recipes", self._handle, ctypes.byref(n))
        names = []
        for i in range(n.value):
            s = ctypes.c_char_p()
            _call("qf_context_recipe_name", self._handle, i, ctypes.byref(s))
            names.append(s.value.decode())
        return names

    def quantizer(self, role: str, recipe: Optional[str] = None, dtype: str = "bf16", usage: Optional[str] = None,
                  grouped: bool = False) -> "Quantizer":
        """The kernels of one role (e.g. "linear:input") of one recipe (None: the context's only
        one) for an input dtype ("bf16", "fp16", "fp32") and usage (None: the recipe's; "training",
        "inference", "memory"); grouped: one call quantizes several members (MoE experts)."""
        if dtype not in _capi.DTYPES:
            raise _user_error(f"dtype: expected one of {sorted(_capi.DTYPES)}, got {dtype!r}")
        if usage not in _capi.USAGES:
            raise _user_error(f"usage: expected training, inference, memory or None, got {usage!r}")
        h = ctypes.c_void_p()
        _call("qf_quantizer_create_ex", self._handle, _bytes(recipe, "recipe"), _str(role, "role"), _capi.DTYPES[dtype],
              _capi.USAGES[usage], int(bool(grouped)), ctypes.byref(h))
        return Quantizer(h, self, dtype, bool(grouped))

    def num_gemms(self, recipe: Optional[str] = None) -> int:
        n = ctypes.c_int()
        _call("qf_context_num_gemms", self._handle, _bytes(recipe, "recipe"), ctypes.byref(n))
        return n.value

    def gemm(self, index: int, recipe: Optional[str] = None) -> "Gemm":
        """The recipe's GEMM number `index` (its "gemms" list)."""
        h = ctypes.c_void_p()
        _call("qf_gemm_create_from_recipe", self._handle, _bytes(recipe, "recipe"), _int(index, "index", 32), ctypes.byref(h))
        return Gemm._wrap(h)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("qforge: quantize() and run() take torch tensors (import torch failed: "
                          f"{e}); the *_raw forms take device addresses") from e
    return torch


def _torch_dtype(torch, info: BufferInfo):
    """The torch dtype that holds the buffer's elements (uint8 where torch has no equivalent);
    "f32" is how older libraries named fp32 scale grids."""
    names = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8",
             "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu"}
    t = getattr(torch, names.get(info.dtype, "uint8"), torch.uint8)
    return t if t.itemsize == info.element_size else torch.uint8


def _empty(torch, info: BufferInfo, device):
    """A tensor of exactly info.bytes: info.shape in the elements' dtype, or (no torch dtype of that
    size) the same bytes as uint8 with the last dimension in bytes. Zeroed where padding must be."""
    raw = (torch.zeros if info.zero_padding else torch.empty)(info.bytes, dtype=torch.uint8, device=device)
    dtype = _torch_dtype(torch, info)
    if dtype == torch.uint8:
        shape = info.shape[:-1] + (info.shape[-1] * info.element_size,) if info.shape else (info.bytes,)
        return raw.view(shape)
    return raw.view(dtype).view(info.shape)


def _device_ptr(t, what: str, dtype=None, required: bool = False) -> Tuple[int, int]:
    """(device address, bytes) of a contiguous CUDA tensor (of `dtype` when given); (0, 0) for an
    optional None."""
    if t is None:
        if required:
            raise _user_error(f"{what}: expected a CUDA tensor, got None")
        return 0, 0
    if dtype is not None and getattr(t, "dtype", None) != dtype:
        raise _user_error(f"{what}: expected a {str(dtype).replace('torch.', '')} tensor, got "
                          f"{getattr(t, 'dtype', type(t).__name__)}")
    if not getattr(t, "is_cuda", False):
        raise _user_error(f"{what}: expected a CUDA tensor, got {type(t).__name__}"
                          + (f" on {t.device}" if hasattr(t, "device") else ""))
    if not t.is_contiguous():
        raise _user_error(f"{what}: expected a contiguous tensor")
    return t.data_ptr(), t.numel() * t.element_size()


def _torch_stream(torch, device, stream):
    """The torch stream a call runs on: torch's current one, a torch.cuda.Stream, or a raw
    cudaStream_t handle (wrapped). Buffers allocated here are allocated under it, so torch's
    caching allocator orders their reuse after the launch."""
    if stream is None:
        return torch.cuda.current_stream(device)
    if isinstance(stream, torch.cuda.Stream):
        if stream.device != device:
            raise _user_error(f"stream: on {stream.device}, the tensors on {device}")
        return stream
    return torch.cuda.ExternalStream(int(stream), device=device)


_cuda_driver = []  # [libcuda.so.1 or None], loaded on first use


def _current_context(torch, device) -> None:
    """Makes the device's primary context current on this thread when none is (a thread that made
    no CUDA runtime call yet): the C API launches in the current context, as torch's runtime calls
    would set it. A no-op when one is current or libcuda cannot be loaded (the C API then reports)."""
    if not _cuda_driver:
        try:
            _cuda_driver.append(ctypes.CDLL("libcuda.so.1"))
        except OSError:
            _cuda_driver.append(None)
    cu = _cuda_driver[0]
    if cu is None:
        return
    ctx = ctypes.c_void_p()
    if cu.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value:
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    dev = ctypes.c_int()
    if cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), index) == 0 and \
            cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0:
        cu.cuCtxSetCurrent(ctx)  # the retain is kept: torch holds the primary context for the process


class _Launch:
    """Where one call launches: the torch stream (_torch_stream), current for allocations inside
    the `with`, on the device with a current CUDA context (_current_context)."""

    def __init__(self, torch, device, stream):
        self._torch, self._device = torch, device
        self.stream = _torch_stream(torch, device, stream)
        self._caller = torch.cuda.current_stream(device)

    def __enter__(self) -> "_Launch":
        self._scopes = contextlib.ExitStack()
        self._scopes.enter_context(self._torch.cuda.device(self._device))
        self._scopes.enter_context(self._torch.cuda.stream(self.stream))
        _current_context(self._torch, self._device)
        return self

    def __exit__(self, *exc):
        return self._scopes.__exit__(*exc)

    def uses(self, tensors) -> None:
        """Tensors the launch reads or writes, when it is not on the caller's current stream: the
        caching allocator then reuses their memory only after the launch (record_stream). Ordering
        the launch after whatever produced them on other streams is the caller's, as in torch."""
        if self.stream.cuda_stream == self._caller.cuda_stream:
            return
        for t in tensors:
            if t is not None:
                t.record_stream(self.stream)


class Quantizer(_Handle):
    """One role of one recipe compiled into a kernel plan (Context.quantizer)."""
    _destroy = "qf_quantizer_destroy"

    def __init__(self, handle, context: Context, dtype: str, grouped: bool):
        super().__init__(handle)
        self._context = context  # the C quantizer keeps its recipe; this keeps the handle order plain
        self.dtype, self.grouped = dtype, grouped

    def _infos(self, count_fn: str, info_fn: str, *shape_args) -> list:
        n = ctypes.c_int()
        _call(count_fn, self._handle, ctypes.byref(n))
        out = []
        for i in range(n.value):
            c = _capi.BufferInfoC()
            _call(info_fn, self._handle, *shape_args, i, ctypes.byref(c))
            out.append(BufferInfo._from_c(c))
        return out

    def outputs(self, m: int, k: int) -> list:
        """Every buffer one call on an [m, k] input writes."""
        return self._infos("qf_quantizer_num_outputs", "qf_quantizer_output_info", _int(m, "m"), _int(k, "k"))

    def grouped_outputs(self, m_total: int, k: int, members: int) -> list:
        """Grouped: every buffer of a call of `members` members over m_total rows, whatever the split
        (flat shapes: the bound each buffer is checked against)."""
        return self._infos("qf_quantizer_num_outputs", "qf_quantizer_grouped_output_info", _int(m_total, "m_total"),
                           _int(k, "k"), _int(members, "members", 32))

    def inputs(self) -> list:
        """Buffers a call reads besides the tensor (delayed scaling's "scale")."""
        return self._infos("qf_quantizer_num_inputs", "qf_quantizer_input_info")

    def workspace_bytes(self, m: int, k: int, members: int = 1) -> int:
        """Device workspace bytes a call needs (members: 1 for one tensor)."""
        n = ctypes.c_int64()
        _call("qf_quantizer_workspace_bytes", self._handle, _int(m, "m"), _int(k, "k"), _int(members, "members", 32),
              ctypes.byref(n))
        return n.value

    def prepare(self, arch: str = "sm_90a") -> None:
        """Compiles (or loads) the kernels for arch into the kernel cache; needs no GPU."""
        _call("qf_quantizer_prepare", self._handle, _str(arch, "arch"))

    def quantize_raw(self, input_ptr: int, m: int, k: int, buffers: Mapping[str, Tuple[int, int]], *,
                     workspace: Tuple[int, int] = (0, 0), noop_ptr: int = 0, seed: int = 0, offset: int = 0,
                     member_rows_ptr: int = 0, num_members: int = 0, stream: int = 0) -> None:
        """qf_quantize on device addresses: buffers maps each output (and input) name to (ptr, bytes)."""
        named = (_capi.NamedBufferC * max(1, len(buffers)))()
        keep = []
        for i, (name, (ptr, nbytes)) in enumerate(buffers.items()):
            keep.append(_str(name, "buffers"))
            named[i] = _capi.NamedBufferC(keep[-1], _ptr(ptr, f"buffers[{name!r}]"), _int(nbytes, f"buffers[{name!r}] bytes"))
        args = _capi.QuantizeArgsC(_ptr(input_ptr, "input_ptr"), _int(m, "m"), _int(k, "k"), named, len(buffers),
                                   _ptr(workspace[0], "workspace"), _int(workspace[1], "workspace bytes"),
                                   _ptr(noop_ptr, "noop_ptr"), _int(seed, "seed", signed=False),
                                   _int(offset, "offset", signed=False), _ptr(member_rows_ptr, "member_rows_ptr"),
                                   _int(num_members, "num_members", 32))
        _call("qf_quantize", self._handle, ctypes.byref(args), ctypes.c_void_p(_ptr(stream, "stream")))

    def quantize(self, x, *, out: Optional[Mapping[str, object]] = None, inputs: Optional[Mapping[str, object]] = None,
                 member_rows=None, seed: int = 0, offset: int = 0, noop=None, stream=None) -> Dict[str, object]:
        """Quantizes the 2-D CUDA tensor x ([m, k], the quantizer's dtype) on torch's current stream
        (or `stream`). Returns every output as a tensor, allocated here unless given in `out`
        (name -> tensor). inputs: e.g. {"scale": t} for delayed scaling. Grouped quantizers take
        member_rows, a CUDA int64 tensor of the members' row offsets [members + 1]."""
        torch = _torch()
        want = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.dtype]
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != want:
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise _user_error(f"x: expected a 2-D {self.dtype} CUDA tensor, got {got}")
        m, k = x.shape
        if self.grouped:
            if member_rows is None:
                raise _user_error("member_rows: a grouped quantizer needs the members' row offsets")
            rows_ptr = _device_ptr(member_rows, "member_rows", torch.int64)[0]
            members = member_rows.numel() - 1
            infos = self.grouped_outputs(m, k, members)
        else:
            if member_rows is not None:
                raise _user_error("member_rows: only for quantizers created with grouped=True")
            rows_ptr, members = 0, 0
            infos = self.outputs(m, k)
        x_ptr, _ = _device_ptr(x, "x")
        out = dict(out or {})
        unknown = sorted(set(out) - {info.name for info in infos})
        if unknown:
            raise _user_error(f"out: no output named {unknown[0]!r}; expected {[info.name for info in infos]}")
        input_names = [info.name for info in self.inputs()]
        unknown = sorted(set(inputs or {}) - set(input_names))
        if unknown:
            raise _user_error(f"inputs: no input named {unknown[0]!r}; expected {input_names}")
        ws_bytes = self.workspace_bytes(m, k, max(members, 1))
        with _Launch(torch, x.device, stream) as launch:
            buffers = {}
            for info in infos:
                if info.name not in out:
                    out[info.name] = _empty(torch, info, x.device)
                buffers[info.name] = _device_ptr(out[info.name], f"out[{info.name!r}]")
            for name, t in (inputs or {}).items():  # every input is a scale: fp32 [1]
                buffers[name] = _device_ptr(t, f"inputs[{name!r}]", torch.float32)
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=x.device) if ws_bytes else None
            launch.uses([x, member_rows, noop, ws, *out.values(), *(inputs or {}).values()])
            self.quantize_raw(x_ptr, m, k, buffers, workspace=_device_ptr(ws, "workspace"),
                              noop_ptr=_device_ptr(noop, "noop", torch.float32)[0], seed=seed, offset=offset,
                              member_rows_ptr=rows_ptr, num_members=members, stream=launch.stream.cuda_stream)
        return {info.name: out[info.name] for info in infos}

    def history_length(self, scale_name: Optional[str] = None) -> int:
        """Delayed scaling: the amax history length of the scale input `scale_name` (None: the
        quantizer's only one), as its recipe rule says."""
        n = ctypes.c_int()
        _call("qf_quantizer_history_length", self._handle, _bytes(scale_name, "scale_name"), ctypes.byref(n))
        return n.value

    def update_amax_history_raw(self, history: Tuple[int, int], amax: Tuple[int, int], scale: Tuple[int, int], *,
                                scale_inv: Tuple[int, int] = (0, 0), noop_ptr: int = 0,
                                scale_name: Optional[str] = None, stream: int = 0) -> None:
        """qf_quantizer_update_amax_history on (device address, bytes) pairs."""
        args = _capi.HistoryArgsC(_ptr(history[0], "history"), _int(history[1], "history bytes"), _ptr(amax[0], "amax"),
                                  _int(amax[1], "amax bytes"), _ptr(scale[0], "scale"), _int(scale[1], "scale bytes"),
                                  _ptr(scale_inv[0], "scale_inv"), _int(scale_inv[1], "scale_inv bytes"),
                                  _ptr(noop_ptr, "noop_ptr"))
        _call("qf_quantizer_update_amax_history", self._handle, _bytes(scale_name, "scale_name"), ctypes.byref(args),
              ctypes.c_void_p(_ptr(stream, "stream")))

    def update_amax_history(self, history, amax, scale, *, scale_inv=None, noop=None,
                            scale_name: Optional[str] = None, stream=None) -> None:
        """Delayed scaling, after quantize: rolls `history` (fp32 CUDA tensor [history_length]) with
        the call's `amax` output and recomputes `scale` (the next call's scale input; and 1 / scale
        into `scale_inv` when given) on the device, by the recipe's margin and amax rule."""
        torch = _torch()
        p = {name: _device_ptr(t, name, torch.float32, required=name in ("history", "amax", "scale"))
             for name, t in (("history", history), ("amax", amax), ("scale", scale), ("scale_inv", scale_inv),
                             ("noop", noop))}
        with _Launch(torch, history.device, stream) as launch:
            launch.uses([history, amax, scale, scale_inv, noop])
            self.update_amax_history_raw(p["history"], p["amax"], p["scale"], scale_inv=p["scale_inv"],
                                         noop_ptr=p["noop"][0], scale_name=scale_name,
                                         stream=launch.stream.cuda_stream)


class Gemm(_Handle):
    """One grouped GEMM spec compiled into one kernel (docs/gemm.md): Gemm(scaling=..., n=..., k=...)
    or Context.gemm(index) for a recipe's "gemms" entry."""
    _destroy = "qf_gemm_destroy"

    def __init__(self, scaling: str, n: int, k: int, *, a_format: Optional[str] = None, b_format: Optional[str] = None,
                 out_dtype: Optional[str] = None, accumulate: bool = False, fast_accum: bool = False, block_m: int = 0,
                 block_n: int = 0, stages: int = 0, multicast: int = 0, raster_m: int = 0, ordered: Union[bool, int] = 0,
                 scale_layout: Optional[str] = None, route: Optional[str] = None, layout: Optional[str] = None,
                 m: int = 0):
        """route: "fused" (the default), "dequant" (mxfp8 / nvfp4: both operands dequantized into
        16-bit copies in the run's workspace, then the bf16 / fp16 GEMM; docs/gemm.md) or "auto"
        (per run, the one expected to be faster: route_for). layout: "m_grouped" (the default;
        fprop, dgrad), "k_grouped" (wgrad: m output rows per group, k=0, the tokens split at run
        time by group_offsets over run(..., k_total=...)) or "k_grouped_members" (the same on the
        grouped quantizer's per-member copies)."""
        # ordered: True / False (the C API's 2 on / 1 off), or 0 (chosen by qforge), 1, 2 as the C API takes them.
        ordered_c = (2 if ordered else 1) if isinstance(ordered, bool) else _int(ordered, "ordered", 32)
        spec = _capi.GemmSpecC(_str(scaling, "scaling"), _bytes(a_format, "a_format"), _bytes(b_format, "b_format"), _int(n, "n"), _int(k, "k"),
                               _bytes(out_dtype, "out_dtype"), int(bool(accumulate)), int(bool(fast_accum)),
                               _int(block_m, "block_m", 32), _int(block_n, "block_n", 32), _int(stages, "stages", 32),
                               _int(multicast, "multicast", 32), _int(raster_m, "raster_m", 32), ordered_c,
                               _bytes(scale_layout, "scale_layout"), _bytes(route, "route"), _bytes(layout, "layout"), _int(m, "m"))
        h = ctypes.c_void_p()
        _call("qf_gemm_create", ctypes.byref(spec), ctypes.byref(h))
        super().__init__(h)

    @classmethod
    def _wrap(cls, h) -> "Gemm":
        self = cls.__new__(cls)
        _Handle.__init__(self, h)
        return self

    def describe(self) -> str:
        return library().qf_gemm_describe(self._handle).decode()

    def __repr__(self) -> str:
        return f"qforge.Gemm({self.describe()!r})" if self._h else "qforge.Gemm(closed)"

    def scale_bytes(self, extent: int, num_groups: int) -> Tuple[int, int]:
        """Bytes of the A and B scale buffers: extent is m_total (M-grouped) or k_total (K-grouped)."""
        a, b = ctypes.c_int64(), ctypes.c_int64()
        _call("qf_gemm_scale_bytes", self._handle, _int(extent, "extent"), _int(num_groups, "num_groups", 32),
              ctypes.byref(a), ctypes.byref(b))
        return a.value, b.value

    def workspace_bytes(self, extent: Optional[int] = None, num_groups: Optional[int] = None) -> int:
        """Device workspace bytes of a run: with extent (m_total, or k_total K-grouped) and num_groups,
        what that call needs (the dequant route's 16-bit copies; no GPU needed for them but with
        k_grouped_members, whose 16-bit GEMM's tensor maps depend on the device); without,
        the call-independent size (K-grouped members' tensor maps; refused for the dequant route)."""
        n = ctypes.c_int64()
        if extent is None and num_groups is None:
            _call("qf_gemm_workspace_bytes", self._handle, ctypes.byref(n))
        elif extent is None or num_groups is None:
            raise _user_error("workspace_bytes: give extent and num_groups together, or neither")
        else:
            _call("qf_gemm_workspace_bytes_for", self._handle, _int(extent, "extent"), _int(num_groups, "num_groups", 32),
                  ctypes.byref(n))
        return n.value

    def route_for(self, extent: int, num_groups: int) -> str:
        """"fused" or "dequant": the route a run of num_groups groups over extent (m_total, or k_total
        K-grouped) takes (route="auto": the one expected to be faster; needs no GPU)."""
        r = ctypes.c_char_p()
        _call("qf_gemm_route_for", self._handle, _int(extent, "extent"), _int(num_groups, "num_groups", 32),
              ctypes.byref(r))
        return r.value.decode()

    def prepare(self, arch: str = "sm_90a") -> None:
        """Compiles (or loads) the kernel into the kernel cache; needs no GPU."""
        _call("qf_gemm_prepare", self._handle, _str(arch, "arch"))

    def run_raw(self, args: _capi.GemmArgsC, stream: int = 0) -> None:
        """qf_gemm_run on a filled qf_gemm_args (device addresses)."""
        _call("qf_gemm_run", self._handle, ctypes.byref(args), ctypes.c_void_p(_ptr(stream, "stream")))

    def run(self, a, b, d, *, a_scale=None, b_scale=None, alpha=None, group_offsets=None, group_counts=None,
            m_max: int = 0, m_total: Optional[int] = None, num_groups: Optional[int] = None, max_ctas: int = 0,
            a_amax=None, b_amax=None, k_total: int = 0, workspace=None, stream=None) -> None:
        """D[group rows] (+)= alpha[g] * A[group rows] @ B[g]^T on CUDA tensors (bytes as qforge.h's
        qf_gemm_args describe them). m_total defaults to a's rows for M-grouped runs (k_total == 0);
        num_groups to the length of group_offsets - 1 or of group_counts. A K-grouped members spec or
        a dequant-route one without `workspace` gets one allocated here (on the run's stream)."""
        torch = _torch()
        # Only the typed small arrays have a dtype to check: operands and scales are raw bytes of many formats.
        want = {"alpha": torch.float32, "a_amax": torch.float32, "b_amax": torch.float32,
                "group_offsets": torch.int64, "group_counts": torch.int64}
        p = {name: _device_ptr(t, name, want.get(name), required=name in ("a", "b", "d")) for name, t in (
            ("a", a), ("b", b), ("d", d), ("a_scale", a_scale), ("b_scale", b_scale), ("alpha", alpha),
            ("group_offsets", group_offsets), ("group_counts", group_counts), ("a_amax", a_amax),
            ("b_amax", b_amax), ("workspace", workspace))}
        if num_groups is None:
            if group_offsets is not None:
                num_groups = group_offsets.numel() - 1
            elif group_counts is not None:
                num_groups = group_counts.numel()
            else:
                raise _user_error("num_groups: give it, group_offsets or group_counts")
        # The C API reads these by num_groups alone: their lengths are checked here.
        for name, t, n in (("group_offsets", group_offsets, num_groups + 1), ("group_counts", group_counts, num_groups),
                           ("alpha", alpha, num_groups), ("a_amax", a_amax, num_groups), ("b_amax", b_amax, num_groups)):
            if t is not None and t.numel() != n:
                raise _user_error(f"{name}: expected {n} elements for {num_groups} groups, got {t.numel()}")
        if m_total is None:
            m_total = a.shape[0] if k_total == 0 and a is not None else 0
        with _Launch(torch, d.device, stream) as launch:
            ws_bytes = self.workspace_bytes(k_total if k_total else m_total, num_groups) if workspace is None else 0
            if ws_bytes:
                workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=d.device)
                p["workspace"] = _device_ptr(workspace, "workspace")
            launch.uses([a, b, d, a_scale, b_scale, alpha, group_offsets, group_counts, a_amax, b_amax, workspace])
            self._run_args(p, m_max, m_total, num_groups, max_ctas, k_total, launch.stream.cuda_stream)

    def _run_args(self, p, m_max, m_total, num_groups, max_ctas, k_total, stream: int) -> None:
        args = _capi.GemmArgsC(p["a"][0], p["a"][1], p["b"][0], p["b"][1], p["d"][0], p["d"][1], p["a_scale"][0],
                               p["a_scale"][1], p["b_scale"][0], p["b_scale"][1], p["alpha"][0],
                               p["group_offsets"][0], p["group_counts"][0], _int(m_max, "m_max"), _int(m_total, "m_total"),
                               _int(num_groups, "num_groups", 32), _int(max_ctas, "max_ctas", 32), p["a_amax"][0],
                               p["b_amax"][0], _int(k_total, "k_total"), p["workspace"][0],
                               p["workspace"][1])
        self.run_raw(args, stream)


def evict_cache(unused_for: Optional[int] = None, max_bytes: Optional[int] = None, stale: bool = False,
                dry_run: bool = False) -> Dict[str, int]:
    """Trims the writable root of this process's kernel cache (QFORGE_CACHE_DIR, read once per
    process), as `qforge clear --unused-for / --max-size / --stale` (qf_cache_evict): the entries
    last used more than `unused_for` seconds ago, then the least recently used until the rest fit in
    `max_bytes`, and with `stale` those this build cannot hit (another NVRTC or qforge) or damaged.
    At least one rule; `dry_run` counts only. Kernels already loaded stay usable. Returns the counts
    {"removed", "kept", "removed_bytes", "kept_bytes"}."""
    policy = _capi.CacheEvictPolicyC()
    if unused_for is not None:
        policy.unused_for_s = _int(unused_for, "unused_for")
        if policy.unused_for_s <= 0:
            raise _user_error(f"unused_for: expected a positive number of seconds, got {unused_for!r}")
    if max_bytes is not None:
        policy.max_bytes = _int(max_bytes, "max_bytes")
        if policy.max_bytes <= 0:
            raise _user_error(f"max_bytes: expected a positive number of bytes, got {max_bytes!r}")
    for name, value in (("stale", stale), ("dry_run", dry_run)):
        if not isinstance(value, bool):
            raise _user_error(f"{name}: expected True or False, got {value!r}")
    policy.stale, policy.dry_run = int(stale), int(dry_run)
    out = _capi.CacheEvictResultC()
    _call("qf_cache_evict", ctypes.byref(policy), ctypes.byref(out))
    return {f: getattr(out, f) for f, _ in out._fields_}
