#!/usr/bin/env python3
"""First-call latency of the shipped quantize plans (docs/jit.md), on a GPU host: what a
framework's first step waits for, per plan, in up to three cache states, through qforge.torch
and, with --cpp, through the C++ API (bench/first_call.cpp).

  first_call.py [--qforge BUILD/tools/qforge] [--bundle DIR] [--cpp BUILD/bench/qforge_first_call]
                [--no-torch] [--shapes 4096x4096,4000x4000] [--states cold,shipped,warm]
                [--filter S] [--json OUT]

Once, unless --bundle names one: `qforge prewarm recipes --arch <this GPU's arch>` into a fresh
directory (its wall time is reported), which then plays the wheel's bundle. Then, for each shipped
recipe's linear:input (training; inference for inference-only recipes), bf16, each API, each
shape and each state, a fresh process timing its first call from reading the recipe to the output
on the device (synchronized), then a later call (its share of 20 back to back):
  cold     empty writable cache, no shipped root: NVRTC compile + module load + the call
  shipped  empty writable cache, the bundle as QFORGE_CACHE_SHIPPED_DIRS (the wheel's and an
           install's case): a shipped hit + module load + the call
  warm     the bundle as the writable cache: a disk hit + module load + the call
A shape of whole tiles takes the plan's program for interior tiles, one with edge tiles the program
for any tiles (the C++ child reports which). The torch API needs torch with CUDA, qforge._C
(QFORGE_EXTENSION) and libqforge (QFORGE_LIBRARY), as scripts/gpu_binding.sh sets them. The goals
(docs/jit.md): a shipped plan's first call within 50 ms plus the data movement; a warm start
within 1 ms per kernel. scripts/jit_report.sh runs this on a GPU host and puts the medians in its
latency table (bench/jit_time.py --first-call).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

# One process, one plan, one cache state: prints {"first_ms", "warm_us"}.
CHILD = r"""
import json, sys, time
import torch
import qforge.torch as qt
recipe, role, usage, m, k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t0 = time.perf_counter()
q = qt.Recipes(recipe).quantizer(role, usage=usage)
kw = {"scale": torch.ones(1, device="cuda")} if q.inputs else {}  # delayed scaling's scale input
y = q(x, **kw)
torch.cuda.synchronize()
t1 = time.perf_counter()
for _ in range(3):
    y = q(x, **kw)
torch.cuda.synchronize()
t2 = time.perf_counter()
n = 20
for _ in range(n):
    y = q(x, **kw)
torch.cuda.synchronize()
t3 = time.perf_counter()
print(json.dumps({"first_ms": (t1 - t0) * 1e3, "warm_us": (t3 - t2) / n * 1e6}))
"""


def recipes_and_usages():
    """(recipe path, usage) per shipped recipe: training where the recipe trains, else inference."""
    out = []
    for p in sorted((REPO / "recipes").glob("*.json")):
        if p.name == "recipe.schema.json":
            continue
        usage = "inference" if "inference" in p.stem else "training"
        out.append((p, usage))
    return out


def child(api, recipe, usage, shape, env):
    """One fresh process, one first call: {"first_ms", "warm_us", ...}."""
    if api == "torch":
        cmd = [sys.executable, "-c", CHILD, str(recipe), "linear:input", usage, str(shape[0]), str(shape[1])]
    else:  # the C++ child's path
        cmd = [api, str(recipe), "linear:input", usage, f"{shape[0]}x{shape[1]}"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{recipe.name} ({usage}, {api}): child failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def gpu_arch():
    """This GPU's arch (sm_90a, ...) from nvidia-smi, torch not needed."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"],
                           capture_output=True, text=True)
    except FileNotFoundError:
        sys.exit("first_call: no CUDA device (no nvidia-smi)")
    if r.returncode != 0 or not r.stdout.strip():
        sys.exit("first_call: no CUDA device (nvidia-smi found none)")
    cap, name = (v.strip() for v in r.stdout.strip().splitlines()[0].split(",", 1))
    major, minor = (int(v) for v in cap.split("."))
    return f"sm_{major}{minor}" + ("a" if major >= 9 else ""), name


def fill_tiles(rows):
    """A torch row takes the tiles of a C++ row of its recipe and shape, where there is one (a torch call
    takes the program the C++ call of the same plan and shape takes)."""
    tiles = {(r["recipe"], tuple(r["shape"])): r["tiles"] for r in rows if r.get("tiles")}
    for r in rows:
        r["tiles"] = r.get("tiles") or tiles.get((r["recipe"], tuple(r["shape"])), "")


def summary(rows, states):
    """Median first-call ms per (api, tiles, state) over the rows."""
    out = {}
    for r in rows:
        for st in states:
            out.setdefault((r["api"], r["tiles"], st), []).append(r[st]["first_ms"])
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qforge", default=os.environ.get("QFORGE_BIN", "qforge"))
    ap.add_argument("--bundle", default="", help="an already prewarmed cache to play the bundle (no prewarm here)")
    ap.add_argument("--cpp", default="", help="BUILD/bench/qforge_first_call: time the C++ API too")
    ap.add_argument("--no-torch", action="store_true", help="the C++ API only")
    ap.add_argument("--shapes", default="4096x4096")
    ap.add_argument("--states", default="cold,shipped,warm")
    ap.add_argument("--filter", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.split("x", 1)) for s in args.shapes.split(",")]
        if any(len(sh) != 2 or min(sh) < 1 for sh in shapes):
            raise ValueError
    except ValueError:
        sys.exit(f"first_call: --shapes: expected MxK,... with M and K positive, got '{args.shapes}'")
    states = [s for s in args.states.split(",") if s]
    bad = [s for s in states if s not in ("cold", "shipped", "warm")]
    if bad:
        sys.exit(f"first_call: --states: expected cold, shipped or warm, got {', '.join(bad)}")
    apis = ([] if args.no_torch else ["torch"]) + ([args.cpp] if args.cpp else [])
    if not apis:
        sys.exit("first_call: nothing to time (--no-torch without --cpp)")
    if "torch" in apis:
        import torch  # noqa: F401  (fails early without torch)
        if not torch.cuda.is_available():
            sys.exit("first_call: torch sees no CUDA device")
    arch, device = gpu_arch()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(args.bundle) if args.bundle else Path(tmp) / "bundle"
        prewarm_s = None
        if not args.bundle:
            t0 = time.perf_counter()
            r = subprocess.run([args.qforge, "prewarm", str(REPO / "recipes"), "--arch", arch],
                               env={**os.environ, "QFORGE_CACHE_DIR": str(bundle)}, capture_output=True, text=True)
            prewarm_s = time.perf_counter() - t0
            if r.returncode != 0:
                sys.exit(f"first_call: qforge prewarm failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        rows = []
        for recipe, usage in recipes_and_usages():
            if args.filter and args.filter not in recipe.stem:
                continue
            for api in apis:
                api_name = "torch" if api == "torch" else "C++"
                for shape in shapes:
                    row = {"recipe": recipe.stem, "usage": usage, "api": api_name, "shape": list(shape)}
                    for state in states:
                        cache = Path(tmp) / f"{recipe.stem}-{state}-{len(rows)}"
                        env = dict(os.environ)
                        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))
                        env["QFORGE_CACHE_DIR"] = str(bundle if state == "warm" else cache)
                        env["QFORGE_CACHE_SHIPPED_DIRS"] = str(bundle) if state == "shipped" else ""
                        row[state] = child(api, recipe, usage, shape, env)
                    # Whether the call took the program for interior tiles (C++ reports it; a torch call
                    # takes the same program for the same shape).
                    row["tiles"] = next((row[s]["tiles"] for s in states if "tiles" in row[s]), "")
                    rows.append(row)
                    print(f"{recipe.stem:<28} {usage:<9} {api_name:<5} {shape[0]}x{shape[1]}  " +
                          "  ".join(f"{s} {row[s]['first_ms']:7.1f} ms" for s in states) +
                          f"  later calls {row[states[-1]]['warm_us']:6.1f} us", flush=True)
    fill_tiles(rows)
    where = f"{device} ({arch})" + (f"; `qforge prewarm recipes` {prewarm_s:.1f} s wall" if prewarm_s else "")
    print(f"\nFirst quantize call, bf16 linear:input of each shipped recipe, {where}")
    print("| recipe | api | shape | " + " | ".join(f"{s} ms" for s in states) + " | later calls us |")
    print("|---|---|---|" + "---|" * len(states) + "---|")
    for r in rows:
        print(f"| {r['recipe']} | {r['api']} | {r['shape'][0]}x{r['shape'][1]} | " +
              " | ".join(f"{r[s]['first_ms']:.1f}" for s in states) + f" | {r[states[-1]]['warm_us']:.1f} |")
    for (api, tl, st), med in sorted(summary(rows, states).items()):
        print(f"median, {api}, {tl or '?'} tiles, {st}: {med:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "arch": arch, "prewarm_s": prewarm_s,
                                               "states": states, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
