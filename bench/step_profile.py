#!/usr/bin/env python3
"""Where a Linear-shaped step's time goes: the GPU timeline of quantize(x), quantize(w), gemm in eager
mode against the same step replayed from a CUDA graph, per recipe (torch.profiler's CUDA activity).

  python3 bench/step_profile.py [--recipes delayed_scaling,current_scaling] [--size 1024] [--steps 20]

Prints, per recipe: eager and graph us per step (CUDA events, as bench/binding_bench.py measures
them), the host us per call of each part and pair back to back (no profiler), then one eager step's driver calls and kernels in time order with their durations and the
GPU idle gap before each kernel (the last of --steps steps run back to back, as a training loop
queues them), and the same for a graph replay. A step whose eager time exceeds
both its host time and its graph time spends the difference in those gaps (what runs between the
kernels) or in kernels the graph does not run.
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import qforge.torch as qt  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from binding_bench import gpu_us as events_us, host_us, warm_up  # noqa: E402


def timeline(fn, steps: int):
    """(kind, name, start us, duration us, GPU idle us before) of the last of `steps` back-to-back
    calls of fn (one synchronize after all of them, so the queue is as a training loop keeps it):
    its GPU work and driver / runtime calls in start order, times relative to its first event."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    gpu, api = [], []
    for e in prof.events():
        row = (e.name, e.time_range.start, e.time_range.end - e.time_range.start)
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu.append(row)
        elif e.name.startswith(("cu", "cuda")) and "Synchronize" not in e.name:
            api.append(row)
    gpu.sort(key=lambda r: r[1])
    api.sort(key=lambda r: r[1])
    if len(gpu) < 2 * steps:
        return []
    per_gpu, per_api = len(gpu) // steps, len(api) // steps
    rows = [("gpu", n, s, d, s - (gpu[i - 1][1] + gpu[i - 1][2]))
            for i, (n, s, d) in enumerate(gpu) if i >= len(gpu) - per_gpu]
    rows += [("api", n, s, d, None) for n, s, d in (api[-per_api:] if per_api else [])]
    rows.sort(key=lambda r: r[2])
    t0 = rows[0][2]
    return [(k, n, s - t0, d, idle) for k, n, s, d, idle in rows]


def show(title: str, rows) -> None:
    print(f"  {title}")
    for kind, name, start, dur, idle in rows:
        gap = "" if idle is None else f" (GPU idle {max(0.0, idle):.1f} us before)"
        print(f"    {kind:3s} {start:8.1f} +{dur:6.1f} us  {name[:90]}{gap}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="delayed_scaling,current_scaling,float8_block_scaling,mxfp8")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-s", type=float, default=10.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    n = args.size
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) * 0.05
    warm_up(args.warmup_s, x)  # as bench/binding_bench.py: the loaded clocks
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
        host = host_us(step, 200, 5)
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
        print("  host us per call, back to back: " + ", ".join(f"{k} {host_us(f, 200, 5):.1f}" for k, f in parts.items()))
        show("eager step", timeline(step, args.steps))
        show("graph replay", timeline(graph.replay, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
