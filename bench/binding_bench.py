"""Host cost of the PyTorch binding (qforge.torch), against torch's own ops in the same process.

Measures, on 1024 x 1024 bf16 tensors (the GPU work is a few microseconds, so the host sets the pace):
  - host time per call (median of rounds of --calls calls, no sync inside a round) of one torch
    elementwise op (x.mul(2): the floor), each shipped training recipe's linear:input quantize
    (outputs allocated by the call) and its fprop GEMM;
  - a Linear-shaped step at 1024^3, eager time per step against the same step replayed from a
    CUDA graph (CUDA events; each the best of 5 rounds of 200 steps), three ways: the three separate calls (quantize input, quantize
    weight, fprop GEMM); the fused call qt.linear_forward (the same three in one call into the
    compiled core); and qt.Linear's forward (no bias, weight requiring grad: the autograd path,
    the weight's copy kept, so an input quantize and the GEMM in one fused call);
  - torch._dynamo.explain's graph breaks for a function calling quantize + GEMM + dequantize;
  - the Python share of a quantize call: the same call with the compiled core's launch call made a
    no-op (the argument checks, torch.empty and the QuantizedTensor; what the C++ side adds is the
    difference), and torch.empty of the layout's bytes alone;
  - the GEMMs' tensor-map cache (qforge._C.tensor_map_cache_stats(): hits, misses, entries) over
    each recipe's GEMM timing loop (every call after the first should hit) and over the whole run.
Before measuring, the GPU and the host are kept busy (--warmup-s seconds of GEMMs, then torch
ops): an idle H200 starts at a few hundred MHz, and calls timed in the first seconds of a process
ran up to 1.5x slower than later ones. The floor is measured again next to each recipe's rows and
each ratio is taken against the floor of its own recipe (the table's floor column).
Writes JSON (--json) and prints a markdown table.

    python3 bench/binding_bench.py --json results.json
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import qforge.torch as qt  # noqa: E402
from qforge import _ext  # noqa: E402


def map_cache_stats():
    """(hits, misses, entries) of the GEMMs' tensor-map cache, or None from a core without it."""
    C = _ext.load()
    return tuple(C.tensor_map_cache_stats()) if hasattr(C, "tensor_map_cache_stats") else None

class NoLaunch:
    """A quantizer's compiled core with its quantize (the launch call) a no-op, all else its own."""

    def __init__(self, c):
        self._real = c

    def quantize(self, *args):
        pass

    def __getattr__(self, name):
        return getattr(self._real, name)


def python_share_us(q, fn, calls: int, rounds: int) -> float:
    """Host us per call of fn (a call of q) with q's launch call a no-op."""
    real = q._c
    q._c = NoLaunch(real)
    try:
        return host_us(fn, calls, rounds)
    finally:
        q._c = real


RECIPES = ["delayed_scaling", "current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8", "mxfp8_hopper",
           "nvfp4", "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr"]


def host_us(fn, calls: int, rounds: int) -> float:
    """Median over rounds of (wall time of `calls` back-to-back calls) / calls, in microseconds."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def warm_up(seconds: float, x: torch.Tensor) -> None:
    """Busy GPU and host for `seconds` (bf16 GEMMs, then x.mul(2) back to back), so the clocks the
    measurements run at are the loaded ones."""
    a = torch.randn(4096, 4096, device=x.device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
    for _ in range(20000):
        x.mul(2)
    torch.cuda.synchronize()


def eager_and_graph(step, iters: int = 200, rounds: int = 5):
    """(eager us per step, CUDA-graph replay us per step): each the best of `rounds` rounds of `iters`
    steps (a round that a host hiccup slowed does not count), the first call before capture."""
    eager = min(gpu_us(step, iters) for _ in range(rounds))
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return eager, min(gpu_us(graph.replay, iters) for _ in range(rounds))


def gpu_us(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    ap.add_argument("--warmup-s", type=float, default=10.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) * 0.05
    warm_up(args.warmup_s, x)
    floor = host_us(lambda: x.mul(2), args.calls, args.rounds)
    # One quantize's allocation (mxfp8_hopper's 1024^2 layout is about 1.1 MB) three ways, the first the
    # one qforge.torch makes: which one is cheapest on this host.
    dev, n = x.device, 1 << 20
    alloc = {"torch.empty(n, dtype=uint8, device=torch.device)": host_us(
                 lambda: torch.empty(n, dtype=torch.uint8, device=dev), args.calls, args.rounds),
             "torch.empty(n, dtype=uint8, device=index)": host_us(
                 lambda: torch.empty(n, dtype=torch.uint8, device=0), args.calls, args.rounds),
             "x.new_empty(n, dtype=uint8)": host_us(lambda: x.new_empty(n, dtype=torch.uint8), args.calls,
                                                    args.rounds)}
    for what, us in alloc.items():
        print(f"allocation {what}: {us:.2f} us", flush=True)
    rows = []
    for name in RECIPES:
        r = qt.Recipes(str(ROOT / "recipes" / f"{name}.json"))
        qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
        scale = torch.ones(1, device="cuda") if qx.inputs else None
        kw = {"scale": scale} if scale is not None else {}
        tx, tw = qx(x, **kw), qw(w, **kw)
        r_floor = host_us(lambda: x.mul(2), args.calls, args.rounds)
        q_host = host_us(lambda: qx(x, **kw), args.calls, args.rounds)
        q_python = python_share_us(qx, lambda: qx(x, **kw), args.calls, args.rounds)
        nbytes = qx.layout(1024, 1024).nbytes
        q_empty = host_us(lambda: torch.empty(nbytes, dtype=torch.uint8, device=x.device), args.calls, args.rounds)
        before = map_cache_stats()
        g_host = host_us(lambda: qt.gemm(tx, tw), args.calls, args.rounds)
        after = map_cache_stats()
        g_maps = None if before is None else {"hits": after[0] - before[0], "misses": after[1] - before[1]}

        def step():
            return qt.gemm(qx(x, **kw), qw(w, **kw))

        fkw = {f"{t}_scale": scale for t in ("x", "w")} if scale is not None else {}

        def fused():
            return qt.linear_forward(x, w, qx, qw, **fkw)

        lin = qt.Linear(1024, 1024, bias=False, recipes=r, name="bench", device="cuda")
        with torch.no_grad():
            lin.weight.copy_(w)

        def module():
            return lin(x)

        eager, replay = eager_and_graph(step)
        f_eager, f_replay = eager_and_graph(fused)
        m_eager, m_replay = eager_and_graph(module)
        f_host = host_us(fused, args.calls, args.rounds)
        rows.append({"recipe": name, "floor_us": r_floor, "quantize_host_us": q_host, "gemm_host_us": g_host, "outputs": len(tx.buffers),
                     "route": qt.gemm_plan(tx, tw).route, "linear_eager_us": eager, "linear_graph_us": replay,
                     "fused_host_us": f_host, "fused_eager_us": f_eager, "fused_graph_us": f_replay,
                     "module_eager_us": m_eager, "module_graph_us": m_replay, "gemm_map_cache": g_maps,
                     "quantize_python_us": q_python, "quantize_empty_us": q_empty})
        print(f"{name}: floor {r_floor:.1f} us, quantize {q_host:.1f} us (Python share {q_python:.1f} us, of it torch.empty {q_empty:.1f} us), gemm {g_host:.1f} us (tensor maps {g_maps}), linear eager {eager:.1f} / graph {replay:.1f} us, "
              f"fused {f_host:.1f} us host, {f_eager:.1f} / {f_replay:.1f} us, qt.Linear {m_eager:.1f} / {m_replay:.1f} us",
              flush=True)

    r = qt.Recipes(str(ROOT / "recipes" / "float8_block_scaling.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")

    def f(x, w):
        a, b = qx(x), qw(w)
        return qt.gemm(a, b), a.dequantize(torch.bfloat16)

    explain = torch._dynamo.explain(f)(x, w)
    for reason in explain.break_reasons:
        print("graph break:", reason, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "commit": commit, "torch_op_host_us": floor, "allocation_us": alloc, "graph_breaks": explain.graph_break_count, "rows": rows,
              "map_cache": map_cache_stats()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"\n{result['date']}, {result['gpu']}, torch {result['torch']}, commit {commit}; "
          f"`python3 bench/binding_bench.py`; torch op floor (x.mul(2)): {floor:.1f} us host per call after the "
          f"warm-up, {min(r['floor_us'] for r in rows):.1f}-{max(r['floor_us'] for r in rows):.1f} us next to the recipes; "
          f"torch._dynamo.explain graph breaks (quantize + gemm + dequantize): {explain.graph_break_count}; "
          f"tensor-map cache (hits, misses, entries) over the run: {result['map_cache']}\n")
    print("| recipe (1024^2 bf16) | outputs | floor us | quantize host us (x floor) | GEMM host us (x floor) | GEMM route | "
          "Linear step eager / graph us (ratio) | fused op eager / graph us (ratio) | "
          "qt.Linear forward eager / graph us (ratio) | quantize's Python share / torch.empty alone us |")
    print("|---|---|---|---|---|---|---|---|---|---|")

    def ratio(row, what):
        e, g = row[f"{what}_eager_us"], row[f"{what}_graph_us"]
        return f"{e:.1f} / {g:.1f} ({g / e:.2f})"

    for row in rows:
        fl = row["floor_us"]
        print(f"| {row['recipe']} | {row['outputs']} | {fl:.1f} | {row['quantize_host_us']:.1f} ({row['quantize_host_us'] / fl:.2f}x) | "
              f"{row['gemm_host_us']:.1f} ({row['gemm_host_us'] / fl:.2f}x) | {row['route']} | "
              f"{ratio(row, 'linear')} | {ratio(row, 'fused')} | {ratio(row, 'module')} | "
              f"{row['quantize_python_us']:.1f} / {row['quantize_empty_us']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
