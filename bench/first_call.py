#!/usr/bin/env python3
"""First-call latency of the shipped quantize plans through qforge.torch (docs/jit.md), on a GPU
host with torch: what a framework's first step waits for, per plan, in three cache states.

  first_call.py [--qforge BUILD/tools/qforge] [--shape 4096x4096] [--filter S] [--json OUT]

Once: `qforge prewarm recipes --arch <this GPU's arch>` into a fresh directory (its wall time is
reported), which then plays the wheel's bundle. Then, for each shipped recipe's linear:input
(training; inference for inference-only recipes), bf16, three fresh processes, each timing its
first call from the quantizer's creation to the output on the host (torch.cuda.synchronize), and a
warm call after it:
  cold     empty writable cache, no shipped root: NVRTC compile + module load + the call
  shipped  empty writable cache, the prewarmed directory as QFORGE_CACHE_SHIPPED_DIRS (the wheel's
           case): a shipped hit + module load + the call
  warm     the prewarmed directory as the writable cache: a disk hit + module load + the call
Needs torch with CUDA, qforge._C (QFORGE_EXTENSION) and libqforge (QFORGE_LIBRARY), as
scripts/gpu_binding.sh sets them. The goals (docs/jit.md): a shipped plan's first call within
50 ms plus the data movement; a warm start within 1 ms per kernel.
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


def child(recipe, usage, shape, env):
    r = subprocess.run([sys.executable, "-c", CHILD, str(recipe), "linear:input", usage, str(shape[0]),
                        str(shape[1])], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{recipe.name} ({usage}): child failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qforge", default=os.environ.get("QFORGE_BIN", "qforge"))
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--filter", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split("x"))
    import torch  # noqa: F401  (fails early without torch)
    if not torch.cuda.is_available():
        sys.exit("first_call: no CUDA device")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}" + ("a" if major >= 9 else "")
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
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
            row = {"recipe": recipe.stem, "usage": usage}
            for state in ("cold", "shipped", "warm"):
                cache = Path(tmp) / f"{recipe.stem}-{state}"
                env = dict(os.environ)
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))
                env["QFORGE_CACHE_DIR"] = str(bundle if state == "warm" else cache)
                env["QFORGE_CACHE_SHIPPED_DIRS"] = str(bundle) if state == "shipped" else ""
                row[state] = child(recipe, usage, shape, env)
            rows.append(row)
            print(f"{recipe.stem:<28} {usage:<9} cold {row['cold']['first_ms']:8.1f} ms  shipped "
                  f"{row['shipped']['first_ms']:7.1f} ms  warm {row['warm']['first_ms']:7.1f} ms  "
                  f"steady {row['warm']['warm_us']:7.1f} us", flush=True)
    print(f"\nFirst quantize call, {shape[0]}x{shape[1]} bf16 linear:input, {torch.cuda.get_device_name()} "
          f"({arch}); `qforge prewarm recipes` {prewarm_s:.1f} s wall\n")
    print("| recipe | usage | cold (compile) ms | shipped bundle ms | warm cache ms | later calls us |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['recipe']} | {r['usage']} | {r['cold']['first_ms']:.1f} | {r['shipped']['first_ms']:.1f} | "
              f"{r['warm']['first_ms']:.1f} | {r['warm']['warm_us']:.1f} |")
    if rows:
        med = {s: statistics.median(r[s]["first_ms"] for r in rows) for s in ("cold", "shipped", "warm")}
        print(f"| median | | {med['cold']:.1f} | {med['shipped']:.1f} | {med['warm']:.1f} | |")
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": shape, "arch": arch, "prewarm_s": prewarm_s, "rows": rows},
                                              indent=1))


if __name__ == "__main__":
    main()
