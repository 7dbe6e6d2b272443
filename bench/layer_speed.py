"""Forward + backward time of qforge.torch layers against the same layers in bf16, in one process:
  - an MoE feed-forward: GroupedLinear(8 experts, 7168 -> 4096) then (4096 -> 7168), 8 x 4096 tokens,
    against torch._grouped_mm in bf16 (with autograd);
  - a dense Linear 8192 -> 8192 on 8192 tokens against nn.Linear in bf16.
CUDA events, median of 20 timed steps after 5 warm-up steps; prints a markdown table.

    python3 bench/layer_speed.py [--json FILE]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import qforge.torch as qt  # noqa: E402

RECIPES = ["current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8_hopper", "nvfp4"]


def time_ms(step, iters=20, warmup=5):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    G, T, D, F = 8, 4096, 7168, 4096
    x = torch.randn(G * T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    offsets = torch.arange(0, (G + 1) * T, T, device="cuda", dtype=torch.int64)
    offs32 = offsets[1:].to(torch.int32)
    w1 = (torch.randn(G, D, F, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    w2 = (torch.randn(G, F, D, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    dy = torch.randn(G * T, D, device="cuda", dtype=torch.bfloat16)

    def bf16_moe():
        h = torch._grouped_mm(x, w1, offs=offs32)
        y = torch._grouped_mm(h, w2, offs=offs32)
        y.backward(dy)

    rows = []
    base_moe = time_ms(bf16_moe)
    moe_flops = 3 * 2 * 2 * G * T * D * F
    rows.append(("MoE 8 x 4096 tokens, 7168 -> 4096 -> 7168", "bf16 torch._grouped_mm", base_moe, 1.0, moe_flops))
    for name in RECIPES:
        r = qt.Recipes(str(ROOT / "recipes" / f"{name}.json"))
        l1 = qt.GroupedLinear(G, D, F, recipes=r, name="fc1", device="cuda")
        l2 = qt.GroupedLinear(G, F, D, recipes=r, name="fc2", device="cuda")

        def moe():
            y = l2(l1(x, offsets), offsets)
            y.backward(dy)

        t = time_ms(moe)
        rows.append(("", name, t, base_moe / t, moe_flops))
        print(rows[-1], flush=True)

    M = N = K = 8192
    xd = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gd = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    ref = nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)

    def dense(layer):
        def step():
            layer(xd).backward(gd)
        return step

    base_dense = time_ms(dense(ref))
    dense_flops = 3 * 2 * M * N * K
    rows.append(("Linear 8192^3", "bf16 nn.Linear", base_dense, 1.0, dense_flops))
    for name in RECIPES + ["delayed_scaling", "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr"]:
        lin = qt.Linear(K, N, bias=False, recipes=qt.Recipes(str(ROOT / "recipes" / f"{name}.json")), name="dense",
                        device="cuda")
        t = time_ms(dense(lin))
        rows.append(("", name, t, base_dense / t, dense_flops))
        print(rows[-1], flush=True)

    print(f"\n{time.strftime('%Y-%m-%d')}, {torch.cuda.get_device_name()}, torch {torch.__version__}: "
          "`python3 bench/layer_speed.py` (forward + backward, quantize included, CUDA events, median of 20)\n")
    print("| layer | recipe | ms | speed-up vs bf16 | TFLOP/s |")
    print("|---|---|---|---|---|")
    for layer, name, t, s, fl in rows:
        print(f"| {layer} | {name} | {t:.2f} | {s:.2f}x | {fl / t / 1e9:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps([dict(zip(("layer", "recipe", "ms", "speedup", "flops"), r)) for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
