"""The binding's per-call launch path on a GPU: what its host-side shortcuts must leave unchanged.

A GEMM call copies its TMA tensor maps from a cache keyed by every argument of the encode (address,
dims, strides, box, swizzle, ...: runtime/tensor_map_cache.h) instead of encoding them each call; a
quantize call rebases its prebuilt call's buffers in place. Checked here: repeated GEMMs hit the
cache and give the same bits; an address that holds another shape's operands (as torch's caching
allocator hands blocks out again) gives the same bits as a fresh address; a CUDA graph captured on
cached maps replays the eager result; quantizes with changing scale inputs and amax_out give the
bits of quantizes into fresh allocations.

Skips without torch or a CUDA GPU. Run (scripts/gpu_binding.sh does):
  QFORGE_EXTENSION=BUILD/python/qforge/_C*.so QFORGE_LIBRARY=BUILD/runtime/libqforge.so \
  python3 -m pytest -q tests/python/test_launch_path.py
"""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import qforge.torch as qt  # noqa: E402
from qforge import _ext  # noqa: E402

C = _ext.load()
GEMM_RECIPES = ["current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8_hopper", "nvfp4", "int8_weight_sr"]


def make_input(m, k, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(m, k, generator=g) * 2).to(torch.bfloat16).cuda()


def same_bits(a, b) -> bool:
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(ints[a.dtype]), b.view(ints[b.dtype]))


def quantizers(recipe):
    r = qt.Recipes(str(ROOT / "recipes" / f"{recipe}.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    kw = {"scale": torch.full((1,), 0.5, device="cuda")} if qx.inputs else {}
    return qx, qw, kw


@pytest.mark.parametrize("recipe", GEMM_RECIPES)
def test_repeated_gemm_hits_the_map_cache_with_the_same_bits(recipe):
    qx, qw, kw = quantizers(recipe)
    tx, tw = qx(make_input(256, 512, 1), **kw), qw(make_input(384, 512, 2) * 0.1, **kw)
    first = qt.gemm(tx, tw, out_dtype=torch.float32)
    torch.cuda.synchronize()
    hits0, _, _ = C.tensor_map_cache_stats()
    for _ in range(5):
        again = qt.gemm(tx, tw, out_dtype=torch.float32)
        assert same_bits(again, first)
    hits1, _, _ = C.tensor_map_cache_stats()
    # The fused kernel's maps are A's and B's (fixed addresses here): both hit on every call. The
    # dequant route's are over its workspace, whose address the allocator may vary.
    route = qt.gemm_plan(tx, tw, out_dtype=torch.float32).route
    assert hits1 - hits0 >= (5 * 2 if route == "fused" else 1), (route, hits0, hits1)


@pytest.mark.parametrize("recipe", GEMM_RECIPES)
def test_reused_address_with_another_shape(recipe):
    """Both quantizes of A written at one address (another row count each), as the caching allocator
    reuses a block: each GEMM equals the same GEMM on a fresh allocation."""
    qx, qw, kw = quantizers(recipe)
    tw = qw(make_input(384, 512, 2) * 0.1, **kw)
    x1, x2 = make_input(256, 512, 3), make_input(128, 512, 4)
    n1, n2 = qx.layout(256, 512).nbytes, qx.layout(128, 512).nbytes
    block = torch.empty(max(n1, n2), dtype=torch.uint8, device="cuda")
    fresh1 = qt.gemm(qx(x1, **kw), tw, out_dtype=torch.float32)
    fresh2 = qt.gemm(qx(x2, **kw), tw, out_dtype=torch.float32)
    for _ in range(2):  # the second round: both maps at that address are in the cache
        at1 = qt.gemm(qx(x1, out=block[:n1], **kw), tw, out_dtype=torch.float32)
        assert same_bits(at1, fresh1)
        at2 = qt.gemm(qx(x2, out=block[:n2], **kw), tw, out_dtype=torch.float32)
        assert same_bits(at2, fresh2)


def test_graph_replay_on_cached_maps():
    qx, qw, kw = quantizers("float8_block_scaling")
    x, w = make_input(256, 512, 5), make_input(384, 512, 6) * 0.1

    def step():
        return qt.gemm(qx(x, **kw), qw(w, **kw))

    eager = step()
    step()  # the maps of the addresses the capture will use are likely in the cache now
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    g.replay()
    torch.cuda.synchronize()
    assert same_bits(out, eager)
    x.mul_(-1)  # new inputs, the same addresses: the replay reads them
    want = step()
    g.replay()
    torch.cuda.synchronize()
    assert same_bits(out, want)


@pytest.mark.parametrize("recipe", ["delayed_scaling"])
def test_quantize_rebases_scale_inputs_and_amax_out(recipe):
    """Scale inputs and amax_out are rebased into the prebuilt call in place: alternating them gives
    the bits of the same quantizes each made alone into a fresh allocation."""
    r = qt.Recipes(str(ROOT / "recipes" / f"{recipe}.json"))
    q = r.quantizer("linear:input")
    if not q.inputs:
        pytest.skip("no scale input")
    x = make_input(256, 512, 7)
    scales = [torch.full((1,), v, device="cuda") for v in (0.5, 2.0)]
    want = [q(x, scale=s) for s in scales]
    for round_ in range(3):
        for s, w in zip(scales, want):
            got = q(x, scale=s)
            for name in (b[0] for b in got.layout.buffers):
                assert torch.equal(got[name].view(torch.uint8), w[name].view(torch.uint8)), (round_, name)
    amax = torch.full((1,), -1.0, device="cuda")
    q(x, scale=scales[0], amax_out=amax)
    after = q(x, scale=scales[0])  # amax_out is not kept: the allocation's own amax slot again
    amax_name = next(b[0] for b in after.layout.buffers if "amax" in b[0])
    assert torch.equal(after[amax_name].view(torch.uint8), want[0][amax_name].view(torch.uint8))
    assert torch.equal(amax.view(torch.int32), want[0][amax_name].view(torch.int32))  # fp32 [1] each
