#!/usr/bin/env python3
"""Where a Linear-shaped step's time goes: the GPU timeline of quantize(x), quantize(w), gemm in eager
mode against the same step replayed from a CUDA graph, per recipe (torch.profiler's CUDA activity).

  python3 bench/step_profile.py [--recipes delayed_scaling,current_scaling] [--size 1024] [--steps 20]

Prints, per recipe: eager and graph us per step (CUDA events, as bench/binding_bench.py measures
them), the host us per call of each part and pair back to back (no profiler), then one eager step's driver calls and kernels in time order with their durations and the
GPU idle gap before each kernel, and the same for a graph replay. A step whose eager time exceeds
both its host time and its graph time spends the difference in those gaps (what runs between the
kernels) or in kernels the graph does not run.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import qforge.torch as qt  # noqa: E402


def events_us(fn, iters: int) -> float:
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


def host_us(fn, iters: int) -> float:
    torch.cuda.synchronize()
    per = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per.append((time.perf_counter() - t0) / iters * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def timeline(fn, steps: int):
    """(kind, name, start us, duration us) of the last of `steps` calls of fn: GPU work and driver
    / runtime calls, in start order, times relative to the step's first event."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
            torch.cuda.synchronize()
    rows = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append(("gpu", e.name, e.time_range.start, e.time_range.end - e.time_range.start))
        elif e.name.startswith(("cu", "cuda")) and "Synchronize" not in e.name:
            rows.append(("api", e.name, e.time_range.start, e.time_range.end - e.time_range.start))
    rows.sort(key=lambda r: r[2])
    gpu = [r for r in rows if r[0] == "gpu"]
    if not gpu:
        return []
    # The last step: its kernels are the last len(gpu) // steps GPU rows; its API calls start after the
    # previous step's last GPU row ended (each step ends with a synchronize).
    per = max(1, len(gpu) // steps)
    first = gpu[-per][2]
    prev_end = gpu[-per - 1][2] + gpu[-per - 1][3] if len(gpu) > per else 0
    last = [r for r in rows if r[2] >= prev_end and (r[0] == "gpu" or r[2] <= gpu[-1][2])]
    t0 = min(r[2] for r in last) if last else first
    return [(k, n, s - t0, d) for k, n, s, d in last]


def show(title: str, rows) -> None:
    print(f"  {title}")
    end = None
    for kind, name, start, dur in rows:
        gap = "" if kind != "gpu" or end is None else f" (GPU idle {max(0.0, start - end):.1f} us before)"
        print(f"    {kind:3s} {start:8.1f} +{dur:6.1f} us  {name[:90]}{gap}")
        if kind == "gpu":
            end = start + dur


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="delayed_scaling,current_scaling,float8_block_scaling,mxfp8")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    n = args.size
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) * 0.05
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {n}^3, "
          f"QFORGE_ONE_LAUNCH={os.environ.get('QFORGE_ONE_LAUNCH', 'unset')}")
    for name in args.recipes.split(","):
        r = qt.Recipes(str(ROOT / "recipes" / f"{name}.json"))
        qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
        kw = {"scale": torch.ones(1, device="cuda")} if qx.inputs else {}

        def step():
            return qt.gemm(qx(x, **kw), qw(w, **kw))

        step()
        torch.cuda.synchronize()
        eager = events_us(step, 200)
        host = host_us(step, 200)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        replay = events_us(graph.replay, 200)
        print(f"\n{name}: eager {eager:.1f} us per step, host {host:.1f} us, graph {replay:.1f} us "
              f"(eager / graph {replay / eager:.2f})")
        tx, tw = qx(x, **kw), qw(w, **kw)
        parts = {"quantize x": lambda: qx(x, **kw), "quantize w": lambda: qw(w, **kw),
                 "gemm": lambda: qt.gemm(tx, tw), "quantize x, w": lambda: (qx(x, **kw), qw(w, **kw)),
                 "quantize x, gemm": lambda: (qx(x, **kw), qt.gemm(tx, tw)),
                 "quantize x + synchronize": lambda: (qx(x, **kw), torch.cuda.synchronize())}
        print("  host us per call, back to back: " + ", ".join(f"{k} {host_us(f, 200):.1f}" for k, f in parts.items()))
        show("eager step", timeline(step, args.steps))
        show("graph replay", timeline(graph.replay, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
