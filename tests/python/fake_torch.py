"""A stand-in for the part of torch that python/qforge uses, for machines without torch or a GPU.

Its tensors are only addresses and sizes: distinct, 256-byte aligned "device" addresses that are
never dereferenced. With it, the package's torch paths run up to the C API, whose argument checks
(names, sizes, alignment, overlap) then judge what the package allocated and passed; without a
GPU the launch itself fails with the driver missing. Installed as sys.modules["torch"] by the tests.
"""
import contextlib
import math


class dtype:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return "torch." + self.name


float32, bfloat16, float16 = dtype("float32", 4), dtype("bfloat16", 2), dtype("float16", 2)
int64, int32, int8, uint8 = dtype("int64", 8), dtype("int32", 4), dtype("int8", 1), dtype("uint8", 1)
float8_e4m3fn, float8_e5m2, float8_e8m0fnu = dtype("float8_e4m3fn", 1), dtype("float8_e5m2", 1), dtype("float8_e8m0fnu", 1)

_next_address = [1 << 32]
allocations = []  # every tensor torch.empty / zeros made: (address, bytes, stream current at the time)
recorded = []  # record_stream calls: (address, stream handle)


class device:
    def __init__(self, spec="cuda:0"):
        self.type = str(spec).split(":")[0]

    def __repr__(self):
        return self.type

    def __eq__(self, other):
        return isinstance(other, device) and other.type == self.type

    def __hash__(self):
        return hash(self.type)


class Tensor:
    def __init__(self, shape, dt, dev, address):
        self.shape, self.dtype, self.device, self._address = tuple(shape), dt, dev, address
        self.is_cuda = dev.type == "cuda"

    def dim(self):
        return len(self.shape)

    def numel(self):
        return math.prod(self.shape)

    def element_size(self):
        return self.dtype.itemsize

    def data_ptr(self):
        return self._address

    def is_contiguous(self):
        return True

    def record_stream(self, stream):
        recorded.append((self._address, stream.cuda_stream))

    def view(self, arg, *more):
        if isinstance(arg, dtype):
            last = self.shape[-1] * self.dtype.itemsize // arg.itemsize
            return Tensor(self.shape[:-1] + (last,), arg, self.device, self._address)
        shape = tuple(arg) if isinstance(arg, (tuple, list)) else (arg,) + more
        assert math.prod(shape) * self.dtype.itemsize == self.numel() * self.dtype.itemsize, "view changes the size"
        return Tensor(shape, self.dtype, self.device, self._address)


def _alloc(shape, dtype=float32, device="cuda"):
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    t = Tensor(shape, dtype, device if isinstance(device, globals()["device"]) else globals()["device"](device), 0)
    nbytes = t.numel() * dtype.itemsize
    t._address = _next_address[0]
    _next_address[0] += (nbytes + 255) // 256 * 256 + 256
    allocations.append((t._address, nbytes, cuda._current.cuda_stream))
    return t


def empty(*shape, dtype=float32, device="cuda"):
    return _alloc(shape, dtype, device)


def zeros(*shape, dtype=float32, device="cuda"):
    return _alloc(shape, dtype, device)


class _Cuda:
    class Stream:
        def __init__(self, handle=0, dev="cuda"):
            self.cuda_stream, self.device = handle, device(dev)

    def __init__(self):
        outer = self

        class ExternalStream(outer.Stream):
            def __init__(self, stream_ptr, device=None):
                super().__init__(stream_ptr)

        self.ExternalStream = ExternalStream
        self._current = self.Stream(0)

    def current_stream(self, device=None):
        return self._current

    @contextlib.contextmanager
    def device(self, dev):
        yield

    @contextlib.contextmanager
    def stream(self, s):
        saved, self._current = self._current, s
        try:
            yield
        finally:
            self._current = saved


cuda = _Cuda()
