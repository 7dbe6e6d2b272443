#!/usr/bin/env python3
"""Torch baselines for `qforge gemm` on identical problem sizes (docs/gemm.md), timed with CUDA events
(median of --iters after warm-up): torch._grouped_mm (bf16), torch._scaled_grouped_mm (fp8
rowwise scales, default and fast accumulation) and torch._scaled_mm (dense fp8, tensorwise and
rowwise) and torch._int_mm (dense int8 -> int32, cuBLAS) at the same total FLOPs. Prints one line per kernel and appends JSON lines to --json.

  python3 scripts/gemm_torch_baseline.py --groups 8 --m 4096 --n 4096 --k 7168 [--json FILE]
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=7168)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch

    dev = "cuda"
    g, m, n, k = a.groups, a.m, a.n, a.k
    flops = 2.0 * g * m * n * k
    torch.manual_seed(0)

    def bench(name, fn):
        try:
            fn()
            torch.cuda.synchronize()
            for _ in range(3):
                fn()
            times = []
            for _ in range(a.iters):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            times.sort()
            t = times[len(times) // 2]
            tf = flops / (t * 1e-3) / 1e12
            print(f"torch {name}: {t:.3f} ms, {tf:.1f} TFLOP/s", flush=True)
            rec = {"kernel": name, "groups": g, "m": m, "n": n, "k": k, "median_ms": t, "tflops": tf}
        except Exception as ex:  # report and go on: the API differs between torch versions
            print(f"torch {name}: unavailable ({type(ex).__name__}: {str(ex).splitlines()[0][:160]})", flush=True)
            rec = {"kernel": name, "error": str(ex)[:400]}
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(rec) + "\n")

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    offs = torch.arange(1, g + 1, device=dev, dtype=torch.int32) * m
    # bf16 grouped
    xa = torch.randn(g * m, k, device=dev, dtype=torch.bfloat16)
    wb = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16)
    bench("_grouped_mm bf16", lambda: torch._grouped_mm(xa, wb.transpose(-2, -1), offs=offs))
    del xa, wb
    # fp8 rowwise grouped
    qa = torch.randn(g * m, k, device=dev).to(torch.float8_e4m3fn)
    qb = torch.randn(g, n, k, device=dev).to(torch.float8_e4m3fn)
    sa = torch.rand(g * m, device=dev, dtype=torch.float32) + 0.5
    sb = torch.rand(g, n, device=dev, dtype=torch.float32) + 0.5
    for fast in (False, True):
        bench(f"_scaled_grouped_mm fp8 rowwise{' fast_accum' if fast else ''}",
              lambda fast=fast: torch._scaled_grouped_mm(qa, qb.transpose(-2, -1), sa, sb, offs=offs,
                                                         out_dtype=torch.bfloat16, use_fast_accum=fast))
    # dense fp8 at the same FLOPs: [g*m, k] x [k, n]
    qbd = qb[0]
    one = torch.ones((), device=dev, dtype=torch.float32)
    bench("_scaled_mm fp8 tensorwise (dense)",
          lambda: torch._scaled_mm(qa, qbd.t(), one, one, out_dtype=torch.bfloat16))
    bench("_scaled_mm fp8 rowwise (dense)",
          lambda: torch._scaled_mm(qa, qbd.t(), sa[:, None], sb[0][None, :], out_dtype=torch.bfloat16))
    del qa, qb, qbd
    # dense int8 at the same FLOPs (cuBLAS; s32 output, no scales: less epilogue work than qforge's
    # int8 GEMM, which scales and rounds to bf16)
    ia = torch.randint(-128, 128, (g * m, k), device=dev, dtype=torch.int8)
    ib = torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8)
    bench("_int_mm int8 (dense)", lambda: torch._int_mm(ia, ib.t()))


if __name__ == "__main__":
    sys.exit(main())
