"""A bounded, least-recently-used table of GEMM plans (qforge.torch's dense and grouped plans).

Each plan of the compiled core holds its JIT GEMM and, once run, a small device buffer of group
offsets per device; an unbounded table grows with every new (operands, shapes, directions, dtype)
a process meets (varying sequence lengths, many layers of distinct sizes). This table keeps the
`maxsize` most recently used plans; an evicted plan is dropped, and with the last reference to it
its device buffers are freed. A caller that still holds a plan (`qt.gemm_plan(...)`) keeps it
alive.

The size: QFORGE_PLAN_CACHE_SIZE (a positive integer, or "unbounded"), default 256 per table;
`qforge.torch.set_plan_cache_size` changes it at run time. Torch-free, so CI tests it without a GPU.
"""
import os
import threading
from collections import OrderedDict
from typing import Callable, Hashable, Optional

DEFAULT_SIZE = 256
ENV = "QFORGE_PLAN_CACHE_SIZE"


def parse_size(value) -> Optional[int]:
    """A table size: a positive int, or None / "unbounded" for no bound. ValueError otherwise."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "unbounded"):
        return None
    n = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and value.strip().isdigit():
        n = int(value)
    if n is None or n < 1:
        raise ValueError(f"plan cache size: expected a positive integer or 'unbounded', got {value!r}")
    return n


def size_from_env() -> Optional[int]:
    raw = os.environ.get(ENV)
    if raw is None or raw == "":
        return DEFAULT_SIZE
    try:
        return parse_size(raw)
    except ValueError as e:
        raise ValueError(f"{ENV}: {e}") from None


class PlanCache:
    """key -> plan, at most `maxsize` entries (None: unbounded), least recently used evicted first.
    get() on a hit marks the entry used; lookups and inserts are thread-safe."""

    def __init__(self, maxsize: Optional[int] = DEFAULT_SIZE):
        self._d: "OrderedDict[Hashable, object]" = OrderedDict()
        self._lock = threading.Lock()
        self.maxsize = parse_size(maxsize)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        return key in self._d

    def keys(self):
        return list(self._d)

    def get(self, key):
        d = self._d
        p = d.get(key)
        if p is not None:
            try:
                d.move_to_end(key)
            except KeyError:  # evicted by another thread between the two calls: still a valid plan
                pass
        return p

    def get_or_create(self, key, make: Callable[[], object]):
        p = self.get(key)
        if p is None:
            p = make()  # outside the lock: building a plan may compile for seconds
            with self._lock:
                have = self._d.get(key)
                if have is not None:
                    return have
                self._d[key] = p
                self._trim()
        return p

    def resize(self, maxsize) -> None:
        """A new bound (None: unbounded); evicts down to it now."""
        n = parse_size(maxsize)
        with self._lock:
            self.maxsize = n
            self._trim()

    def clear(self) -> None:
        with self._lock:
            self._d.clear()

    def _trim(self) -> None:
        if self.maxsize is None:
            return
        while len(self._d) > self.maxsize:
            self._d.popitem(last=False)
            self.evictions += 1
