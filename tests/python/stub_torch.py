"""A stand-in `torch` that qforge.torch imports on a machine without torch: dtypes, devices, tensors
that are only shapes and fake addresses, torch.empty, the current-stream query and the names the
package's modules use at import (nn.Module, autograd.Function, custom_op, ...), nothing more.

With it, qforge.torch's eager call path runs up to the compiled core's launch call, which the tests
replace by a recorder (tests/python/test_torch_call_path.py): what the Python layer allocates and
passes is checked without torch or a GPU, and bench/python_layer_bench.py times that layer.
Installed into sys.modules by install(); uninstall() puts back what was there.
"""
import math
import sys
import types


class dtype:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return "torch." + self.name


DTYPES = {name: dtype(name, size) for name, size in (
    ("float32", 4), ("bfloat16", 2), ("float16", 2), ("int64", 8), ("int32", 4), ("int8", 1), ("uint8", 1),
    ("float8_e4m3fn", 1), ("float8_e5m2", 1), ("float8_e8m0fnu", 1))}


class device:
    def __init__(self, spec, index=None):
        if isinstance(spec, device):
            spec, index = spec.type, spec.index
        spec = str(spec)
        if ":" in spec:
            spec, index = spec.split(":")[0], int(spec.split(":")[1])
        self.type, self.index = spec, index

    def __repr__(self):
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        return isinstance(other, device) and (other.type, other.index) == (self.type, self.index)

    def __hash__(self):
        return hash((self.type, self.index))


class Size(tuple):
    pass


_next = [1 << 32]
allocations = []  # (address, bytes, device) of every torch.empty


class Tensor:
    def __init__(self, shape, dt, dev, address=None, contiguous=True):
        self._shape, self.dtype, self.device, self._contiguous = tuple(shape), dt, dev, contiguous
        self.is_cuda = dev.type == "cuda"
        if address is None:
            address = _next[0]
            _next[0] += (self.numel() * dt.itemsize + 255) // 256 * 256 + 256
            allocations.append((address, self.numel() * dt.itemsize, dev))
        self._address = address

    @property
    def shape(self):
        return Size(self._shape)

    def dim(self):
        return len(self._shape)

    def numel(self):
        return math.prod(self._shape)

    def data_ptr(self):
        return self._address

    def get_device(self):
        return self.device.index if self.is_cuda else -1

    def is_contiguous(self):
        return self._contiguous

    def __getitem__(self, s):
        assert isinstance(s, slice) and self.dim() == 1
        start, stop, _ = s.indices(self._shape[0])
        return Tensor((stop - start,), self.dtype, self.device, self._address + start * self.dtype.itemsize)

    def view(self, arg, *more):
        if isinstance(arg, dtype):
            last = self._shape[-1] * self.dtype.itemsize // arg.itemsize
            return Tensor(self._shape[:-1] + (last,), arg, self.device, self._address)
        shape = tuple(arg) if isinstance(arg, (tuple, list)) else (arg,) + more
        return Tensor(shape, self.dtype, self.device, self._address)


def empty(*size, dtype=None, device=None):
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    dev = device if isinstance(device, globals()["device"]) else globals()["device"](device or "cpu")
    return Tensor(shape, dtype or DTYPES["float32"], dev)


def _current_raw_stream(index):
    return 0x5000 + index  # what the launch call must receive for device `index`


def _install_into(m):
    for name, t in DTYPES.items():
        setattr(m, name, t)
    m.dtype, m.device, m.Size, m.Tensor, m.empty = dtype, device, Size, Tensor, empty
    m.allocations = allocations
    m.compiling = [False]  # what torch.compiler.is_compiling() answers
    m.compiler = types.SimpleNamespace(is_compiling=lambda: m.compiling[0])
    m._C = types.SimpleNamespace(_cuda_getCurrentRawStream=_current_raw_stream)

    class _CustomOp:
        def __init__(self, fn):
            self.fn = fn

        def register_fake(self, fn):
            return fn

        def __call__(self, *args):
            return self.fn(*args)

    m.library = types.SimpleNamespace(custom_op=lambda name, mutates_args=(), device_types=None: _CustomOp)
    m.ops = types.SimpleNamespace()

    class Module:
        pass

    class Function:
        @classmethod
        def apply(cls, *args):
            raise NotImplementedError("stub torch: no autograd")

    class Optimizer:
        pass

    m.nn = types.ModuleType("torch.nn")
    m.nn.Module, m.nn.Parameter, m.nn.Linear = Module, Tensor, Module
    m.autograd = types.SimpleNamespace(Function=Function)
    m.optim = types.SimpleNamespace(Optimizer=Optimizer)
    m.utils = types.ModuleType("torch.utils")
    m.utils.checkpoint = types.ModuleType("torch.utils.checkpoint")
    m.is_grad_enabled = lambda: False
    m.no_grad = lambda: (lambda fn: fn)
    m.cuda = types.SimpleNamespace(is_available=lambda: False)
    return {"torch": m, "torch.nn": m.nn, "torch.utils": m.utils, "torch.utils.checkpoint": m.utils.checkpoint}


_saved = {}


def install():
    """Installs the stand-in as `torch` (and drops any imported qforge.torch, which then imports it);
    returns the stand-in module."""
    m = types.ModuleType("torch")
    mods = _install_into(m)
    for name in list(mods) + [n for n in sys.modules if n == "qforge.torch" or n.startswith("qforge.torch.")]:
        _saved.setdefault(name, sys.modules.get(name))
        sys.modules.pop(name, None)
    sys.modules.update(mods)
    return m


def uninstall():
    """Puts back the modules install() replaced (and drops the qforge.torch imported against the stub,
    also as the qforge package's attribute, which `import qforge.torch as qt` reads first)."""
    for name in [n for n in sys.modules if n == "qforge.torch" or n.startswith("qforge.torch.")]:
        sys.modules.pop(name, None)
    for name, mod in _saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    qforge = sys.modules.get("qforge")
    if qforge is not None:
        real = _saved.get("qforge.torch")
        if real is not None:
            qforge.torch = real
        elif hasattr(qforge, "torch"):
            del qforge.torch
    _saved.clear()
