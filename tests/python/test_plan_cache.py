"""qforge/_plan_cache.py, the bounded table of qforge.torch's GEMM plans, without torch or a GPU:
least recently used evicted first, a hit refreshes, resizing evicts at once, the size from
QFORGE_PLAN_CACHE_SIZE, bad sizes refused, and the compiled core's plans in a bounded table.
"""
import gc
import sys
import weakref
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
from qforge import _plan_cache  # noqa: E402
from qforge._plan_cache import PlanCache  # noqa: E402


class Plan:  # stands in for a compiled plan: weak-referenceable, so the test sees it freed
    def __init__(self, key):
        self.key = key


def test_least_recently_used_is_evicted_first():
    c = PlanCache(3)
    for k in "abc":
        c.get_or_create(k, lambda k=k: Plan(k))
    assert c.get("a").key == "a"  # a hit: "a" becomes the most recently used
    c.get_or_create("d", lambda: Plan("d"))
    assert c.keys() == ["c", "a", "d"] and "b" not in c and c.evictions == 1
    c.get_or_create("e", lambda: Plan("e"))
    assert c.keys() == ["a", "d", "e"] and len(c) == 3


def test_a_hit_builds_nothing_and_an_evicted_plan_is_dropped():
    c = PlanCache(2)
    built = []

    def make(k):
        built.append(k)
        return Plan(k)

    first = c.get_or_create("x", lambda: make("x"))
    assert c.get_or_create("x", lambda: make("x")) is first and built == ["x"]
    ref = weakref.ref(first)
    del first
    c.get_or_create("y", lambda: make("y"))
    c.get_or_create("z", lambda: make("z"))
    gc.collect()
    assert ref() is None  # the table held the only reference: evicting it freed the plan
    held = c.get_or_create("w", lambda: make("w"))
    c.resize(1)
    assert c.keys() == ["w"] and held.key == "w"


def test_resize_and_unbounded():
    c = PlanCache(None)
    for i in range(1000):
        c.get_or_create(i, lambda i=i: Plan(i))
    assert len(c) == 1000 and c.evictions == 0
    c.resize(10)
    assert c.keys() == list(range(990, 1000)) and c.evictions == 990
    c.resize("unbounded")
    c.get_or_create(-1, lambda: Plan(-1))
    assert len(c) == 11
    c.clear()
    assert len(c) == 0


@pytest.mark.parametrize("bad", [0, -3, "many", 2.5, True])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="plan cache size: expected a positive integer or 'unbounded'"):
        PlanCache(bad)


def test_size_from_the_environment(monkeypatch):
    monkeypatch.delenv(_plan_cache.ENV, raising=False)
    assert _plan_cache.size_from_env() == _plan_cache.DEFAULT_SIZE == 256
    monkeypatch.setenv(_plan_cache.ENV, "17")
    assert _plan_cache.size_from_env() == 17
    monkeypatch.setenv(_plan_cache.ENV, "unbounded")
    assert _plan_cache.size_from_env() is None
    monkeypatch.setenv(_plan_cache.ENV, "0")
    with pytest.raises(ValueError, match="QFORGE_PLAN_CACHE_SIZE: plan cache size"):
        _plan_cache.size_from_env()


def test_compiled_plans_in_a_bounded_table():
    from qforge import _ext
    try:
        C = _ext.load()
    except ImportError as e:
        pytest.skip(f"qforge._C not built: {e}")
    ctx = C.Context([str(ROOT / "recipes" / "current_scaling.json")])
    qx, qw = ctx.quantizer("linear:input"), ctx.quantizer("linear:weight")
    live = C.live_plan_buffers()  # plans of earlier tests in this process may still hold theirs
    c = PlanCache(2)
    for m in (128, 256, 384, 512):
        p = c.get_or_create(m, lambda m=m: C.GemmPlan(qx, qx.layout(m, 256), 0, qw, qw.layout(128, 256), 0))
        assert (p.m, p.n, p.k) == (m, 128, 256)
    assert c.keys() == [384, 512]
    # No plan ran, so none allocated device memory; the GPU test (test_torch_binding.py) counts
    # live_plan_buffers() across evictions of plans that ran.
    assert C.live_plan_buffers() == live
