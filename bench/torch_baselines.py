#!/usr/bin/env python3
"""Torch eager and torch.compile baselines for qforge's quantize kernels (docs/quantize.md).

For bf16 input, for each case below, this script
  1. checks that a plain torch implementation (eager, and the same function under
     torch.compile(fullgraph=True)) produces exactly the bytes that `qforge quantize` writes
     (data, scales, amax) on a moderate shape (default 2048x4096) and two input sets;
  2. times the eager and the compiled function with CUDA events at every size;
  3. writes OUT/torch_baselines.json (incrementally, after every measurement).

Cases (role linear:input; the numeric parameters are read from the recipe files):
  fp8_current     recipes/current_scaling.json       training   e4m3 per-tensor current scaling,
                                                                 rowwise + transposed columnwise
  fp8_delayed     recipes/delayed_scaling.json       training   e4m3 per-tensor, scale given
  mxfp8_rowwise   recipes/mxfp8.json                 inference  MXFP8 1x32, e8m0 scales
  mxfp8_both      recipes/mxfp8.json                 training   + 32x1 columnwise (recipe layout)
  fp8_block       recipes/float8_block_scaling.json  training   1x128 rowwise + 128x1 transposed
  fp8_current_rowwise, fp8_delayed_rowwise, fp8_block_rowwise: the same recipes, usage inference
                                                                 (rowwise only)

Semantics follow docs/numerics.md: compute_scale (eps, pow2, inf_value), RNE + satfinite fp8
encoding (clamp to +-max, then torch's RNE cast), e8m0 rceil/floor built from the fp32 bits,
element multiplier 2^(127-E) built from bits. The fp32 divisions of the spec (fmax/amax,
1/scale) are plain fp32 `/` (--div fp32, default): IEEE in eager; under torch.compile only
because main() sets torch._inductor.config.eager_numerics.division_rounding, which makes
Inductor emit tl.div_rn (Triton lowers fp32 `/` to div.full.f32, up to 2 ulp off). --div fp64
divides in fp64 and rounds to fp32 instead (torchao's amax_to_scale does this): also exactly
the correctly rounded quotient (53 >= 2*24+2), independent of that setting, but on an H200 it
made the compiled 1x128 block cast 1.4x slower (8192^2: 293 vs 205 us), so it is not the default.
The edge-value self-test and the agreement check show whether the chosen mode is exact.

Before all that, the numerics helpers are run on edge values (zeros, subnormals, Inf/NaN,
random bit patterns, fp8 grid points and midpoints) against tests/numerics/quantize_ref.py,
eager and compiled ("op_selftest" in the JSON).

Timing: per call with CUDA events (launch overhead included: time_ms), and the same calls
replayed from a CUDA graph (GPU time only: graph_time_ms). Inputs below 64 MiB rotate through
256 MiB of buffers so that L2 does not serve them.

Usage:
  python3 bench/torch_baselines.py --qforge build/tools/qforge --out OUT [--sizes 4096x4096 ...]
      [--quick] [--cases fp8_current,mxfp8_rowwise] [--iters 50] [--warmup 5]
      [--budget-s 480] [--check-shape 2048x4096] [--no-check] [--no-selftest] [--no-compile]
      [--no-graph] [--div fp32|fp64] [--device cuda|cpu] [--qforge-device cuda|cpu]
On an H200 the default run (8 cases x 6 sizes, check, self-test) takes about 2.5 minutes.
--device cpu (with --qforge-device cpu) exists to test the logic without a GPU (timings then
use time.perf_counter and mean nothing).
"""
import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections import OrderedDict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SCHEMA = "qforge-torch-baselines/1"

DEFAULT_SIZES = [(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (16384, 16384), (65536, 7168)]
QUICK_SIZES = [(2048, 2048), (8192, 8192)]

F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)
BF16_MAX = float(np.array([0x7F7F0000], dtype=np.uint32).view(np.float32)[0])
IN_DTYPE = "bf16"
IN_ITEMSIZE = 2

# format -> (torch dtype name, max finite, OCP emax)
FORMATS = {"e4m3": ("float8_e4m3fn", 448.0, 8), "e5m2": ("float8_e5m2", 57344.0, 15)}

CASES = {
    "fp8_current": dict(recipe="recipes/current_scaling.json", usage="training", mode="per_tensor_current"),
    "fp8_delayed": dict(recipe="recipes/delayed_scaling.json", usage="training", mode="per_tensor_delayed"),
    "mxfp8_rowwise": dict(recipe="recipes/mxfp8.json", usage="inference", mode="mx"),
    "mxfp8_both": dict(recipe="recipes/mxfp8.json", usage="training", mode="mx"),
    "fp8_block": dict(recipe="recipes/float8_block_scaling.json", usage="training", mode="block"),
    # rowwise only (usage inference), as qforge_bench also measures
    "fp8_current_rowwise": dict(recipe="recipes/current_scaling.json", usage="inference", mode="per_tensor_current"),
    "fp8_delayed_rowwise": dict(recipe="recipes/delayed_scaling.json", usage="inference", mode="per_tensor_delayed"),
    "fp8_block_rowwise": dict(recipe="recipes/float8_block_scaling.json", usage="inference", mode="block"),
}
ROLE = "linear:input"
DELAYED_SCALE = 100.0  # delayed scaling: scale given (|x| > 4.48 saturates at this scale)

BYTES_FORMULA = (
    "bytes = input_passes * M*K*2 (bf16 input, read once per pass the algorithm needs: 2 for "
    "per-tensor current scaling, whose scale needs the whole tensor's amax before any element "
    "is cast; 1 otherwise) + every output buffer once (fp8 data per direction, scale_inv: 4 B "
    "per-tensor / 4 B per 1x128 block / 1 B per 1x32 MX block, compact; amax 4 B). The 4-byte "
    "scale input of delayed scaling is not counted (as in bench/qforge_bench.cpp). "
    "gbps = bytes / time / 1e9."
)


class Unsupported(Exception):
    pass


def log(msg):
    print(f"[torch_baselines {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_size(s):
    s = s.strip().lower()
    if not s:
        raise ValueError("empty size")
    if "x" in s:
        m, k = s.split("x", 1)
        return int(m), int(k)
    return int(s), int(s)


def parse_sizes(items):
    out = []
    for it in items:
        for part in it.split(","):
            if part.strip():
                out.append(parse_size(part))
    return out


# ---------------------------------------------------------------------------------------------
# recipes
# ---------------------------------------------------------------------------------------------
def quantize_ref(repo=None):
    """tests/numerics/quantize_ref.py: the project's independent numpy reference (also the role
    resolution used here)."""
    repo = REPO if repo is None else repo
    sys.path.insert(0, str(repo / "tests" / "numerics"))
    try:
        import quantize_ref as qr
    finally:
        sys.path.pop(0)
    return qr


def resolve_rule(recipe, role):
    """The most specific rule of the recipe matching role (docs/recipes.md: most non-* parts wins)."""
    return quantize_ref().resolve_rule(recipe, role)


def stream_spec(spec, direction):
    s = spec.get("scaling", "none")
    if isinstance(s, str):
        s = {"mode": s}
    mode = s["mode"]
    out = {
        "dir": direction,
        "format": spec["format"],
        "mode": mode,
        "layout": spec.get("layout", "transposed") if direction == "columnwise" else "rowmajor",
        "scale_layout": spec.get("scale_layout", "compact"),
        "rounding": spec.get("rounding", "nearest"),
        "rht": spec.get("rht", False),
    }
    if mode == "per_tensor_current":
        out.update(epsilon=float(s.get("epsilon", 0.0)), pow2=bool(s.get("pow2", False)))
    elif mode == "per_tensor_delayed":
        out.update(margin=s.get("margin", 0))
    elif mode == "block":
        out.update(block=list(s.get("block", [1, 128] if direction == "rowwise" else [128, 1])),
                   epsilon=float(s.get("epsilon", 0.0)), pow2=bool(s.get("pow2", True)))
    elif mode == "mx":
        out.update(block=list(s.get("block", [1, 32] if direction == "rowwise" else [32, 1])),
                   rule=s.get("rule", "rceil"))
    return out


def load_case(case_name, repo=REPO):
    c = CASES[case_name]
    path = repo / c["recipe"]
    with open(path) as f:
        recipe = json.load(f)
    rule = resolve_rule(recipe, ROLE)
    if rule is None:
        raise Unsupported(f"{c['recipe']}: no rule matches {ROLE}")
    if "rowwise" not in rule:
        raise Unsupported(f"{c['recipe']}: no rowwise direction for {ROLE}")
    streams = [stream_spec(rule["rowwise"], "rowwise")]
    if c["usage"] == "training":
        if "columnwise" not in rule:
            raise Unsupported(f"{c['recipe']}: usage training needs a columnwise direction")
        streams.append(stream_spec(rule["columnwise"], "columnwise"))
    for s in streams:
        if s["mode"] != c["mode"]:
            raise Unsupported(f"{c['recipe']}: {s['dir']} scaling is {s['mode']}, case {case_name} expects {c['mode']}")
        if s["format"] not in FORMATS:
            raise Unsupported(f"{s['dir']} format {s['format']} (only e4m3/e5m2 here)")
        if s["rounding"] != "nearest" or s["rht"]:
            raise Unsupported(f"{s['dir']}: stochastic rounding / RHT not modelled")
        if "block" in s and s["block"][0] > 1 and s["block"][1] > 1:
            raise Unsupported(f"{s['dir']}: 2D blocks not modelled")
    return {
        "case": case_name,
        "recipe": recipe.get("name", Path(c["recipe"]).stem),
        "recipe_file": c["recipe"],
        "role": ROLE,
        "usage": c["usage"],
        "mode": c["mode"],
        "streams": streams,
        "directions": "+".join(s["dir"] for s in streams),
        "columnwise_layout": streams[1]["layout"] if len(streams) > 1 else None,
    }


# ---------------------------------------------------------------------------------------------
# the torch implementations (one Python function per case; eager and torch.compile run the same)
# ---------------------------------------------------------------------------------------------
DIVISION = {"mode": "fp32"}  # set by --div


def make_ops(torch, div=None):
    """The scalar rules of docs/numerics.md as torch functions (used by every case)."""
    div = div or DIVISION["mode"]

    if div == "fp64":
        def f32_div(num, den):
            # Correctly rounded fp32 num/den (den an fp32 tensor): fp64 division, then RNE to fp32
            # (torchao's amax_to_scale does the same to make eager and compile agree).
            d = den.double()
            return (torch.full_like(d, float(num)) / d).float()
    else:
        def f32_div(num, den):
            # fp32 division: IEEE in eager; under torch.compile only with
            # torch._inductor.config.eager_numerics.division_rounding (tl.div_rn), which main() sets.
            return torch.full_like(den, float(num)) / den

    def compute_scale(amax, fmax, eps, pow2, inf_value):
        if eps > 0:
            amax = torch.where(amax < float(F32(eps)), float(F32(eps)), amax)
        special = (amax == 0) | ~torch.isfinite(amax)
        scale = f32_div(fmax, amax)
        scale = torch.where(torch.isinf(scale), inf_value, scale)
        if pow2:
            scale = (scale.view(torch.int32) & -0x800000).view(torch.float32)  # & 0xFF800000
        return torch.where(special, 1.0, scale)

    def encode(v, fmt):
        tname, fmax, _ = FORMATS[fmt]
        return v.clamp(-fmax, fmax).to(getattr(torch, tname))

    def e8m0_rceil(v):
        u = v.view(torch.int32) & 0x7FFFFFFF
        exp = u >> 23
        man = u & 0x7FFFFF
        e = torch.where(exp == 0, (man > 0x400000).to(torch.int32), exp + (man != 0).to(torch.int32))
        e = torch.clamp(e, max=254)
        return torch.where(u > 0x7F800000, 255, torch.where(u == 0x7F800000, 254, e))

    def e8m0_floor(amax, emax):
        u = amax.view(torch.int32) & 0x7FFFFFFF
        exp = u >> 23
        man = u & 0x7FFFFF
        sub = ((man.to(torch.float32).view(torch.int32) >> 23) - 127) - 149  # floor(log2(man)) - 149
        fl2 = torch.where(exp == 0, sub, exp - 127)
        e = torch.clamp(fl2 - emax + 127, 0, 254)
        e = torch.where(amax == 0, 0, e)
        e = torch.where(torch.isinf(amax), 254, e)
        return torch.where(torch.isnan(amax), 255, e)

    def mx_multiplier(e):
        b = torch.where(e <= 253, (254 - e) << 23, torch.where(e == 254, 0x400000, 0x7FC00000))
        return b.to(torch.int32).view(torch.float32)

    inv_fmax = {f: float(F32(1) / F32(v[1])) for f, v in FORMATS.items()}  # fl(1/fmax), fp32

    return types.SimpleNamespace(f32_div=f32_div, compute_scale=compute_scale, encode=encode,
                                 e8m0_rceil=e8m0_rceil, e8m0_floor=e8m0_floor,
                                 mx_multiplier=mx_multiplier, inv_fmax=inv_fmax)


def build_fn(spec, torch, div=None):
    """Returns (fn, output names, input_passes). fn(x) or fn(x, scale) -> tuple of tensors."""
    streams = spec["streams"]
    mode = spec["mode"]

    o = make_ops(torch, div)
    f32_div, compute_scale, encode = o.f32_div, o.compute_scale, o.encode
    e8m0_rceil, e8m0_floor, mx_multiplier, inv_fmax = o.e8m0_rceil, o.e8m0_floor, o.mx_multiplier, o.inv_fmax

    def blocked_stream(x, s):
        """Block / MX stream on x [M, K] -> (data, scale_inv) in the recipe's layout."""
        M, K = x.shape
        br, bc = s["block"]
        if s["dir"] == "rowwise":
            L = bc
            if K % L:
                raise Unsupported(f"K={K} is not a multiple of the block {L}")
            xb = x.view(M, K // L, L)
            axis = 2
        else:
            L = br
            if M % L:
                raise Unsupported(f"M={M} is not a multiple of the block {L}")
            xb = x.view(M // L, L, K)
            axis = 1
        amax = xb.abs().amax(axis).float()
        fmt = s["format"]
        if s["mode"] == "block":
            scale = compute_scale(amax, FORMATS[fmt][1], s["epsilon"], s["pow2"], BF16_MAX)
            q = encode(xb.float() * scale.unsqueeze(axis), fmt).view(M, K)
            sc = f32_div(1.0, scale)
        else:
            if s["rule"] == "rceil":
                e = e8m0_rceil(amax * inv_fmax[fmt])
            else:
                e = e8m0_floor(amax, FORMATS[fmt][2])
            q = encode(xb.float() * mx_multiplier(e).unsqueeze(axis), fmt).view(M, K)
            sc = e.to(torch.uint8)
        if s["dir"] == "columnwise" and s["layout"] == "transposed":
            q = q.t().contiguous()
            sc = sc.t().contiguous()
        return q, sc

    names = []
    if mode in ("block", "mx"):
        for s in streams:
            names += [f"{s['dir']}_data", f"{s['dir']}_scale_inv"]

        def fn(x):
            outs = []
            for s in streams:
                outs.extend(blocked_stream(x, s))
            return tuple(outs)

        return fn, names, 1

    amax_name = "amax" if len(streams) > 1 else "rowwise_amax"
    for s in streams:
        names += [f"{s['dir']}_data", f"{s['dir']}_scale_inv"]
    names.append(amax_name)

    def layout(q, s):
        return q.t().contiguous() if (s["dir"] == "columnwise" and s["layout"] == "transposed") else q

    if mode == "per_tensor_current":
        def fn(x):
            amax = x.abs().amax().float()
            xf = x.float()
            outs = []
            prev = None
            for s in streams:
                key = (s["format"], s["epsilon"], s["pow2"])
                if prev is not None and prev[0] == key:
                    q, sinv = prev[1], prev[2]
                else:
                    scale = compute_scale(amax, FORMATS[s["format"]][1], s["epsilon"], s["pow2"], FLT_MAX)
                    q = encode(xf * scale, s["format"])
                    sinv = f32_div(1.0, scale).reshape(1)
                    prev = (key, q, sinv)
                outs += [layout(q, s), sinv]
            outs.append(amax.reshape(1))
            return tuple(outs)

        return fn, names, 2

    if mode == "per_tensor_delayed":
        if len(streams) > 1 and streams[0]["format"] != streams[1]["format"]:
            raise Unsupported("delayed scaling with different formats per direction (two scale inputs)")

        def fn(x, scale):
            q = encode(x.float() * scale, streams[0]["format"])
            sinv = f32_div(1.0, scale).reshape(1)
            outs = []
            for s in streams:
                outs += [layout(q, s), sinv]
            outs.append(x.abs().amax().float().reshape(1))
            return tuple(outs)

        return fn, names, 1

    raise Unsupported(f"mode {mode}")


def selftest_values(seed=7):
    """fp32 test vectors: edge values + random bit patterns (v: any, incl. Inf/NaN), finite values
    spread over the fp8 ranges (f), and every E8M0 code (e)."""
    rng = np.random.default_rng(seed)
    edge_bits = [0x00000000, 0x00000001, 0x00000002, 0x003FFFFF, 0x00400000, 0x00400001, 0x007FFFFF,
                 0x00800000, 0x00800001, 0x3F800000, 0x3F800001, 0x3FC00000, 0x43E00000, 0x43E00001,
                 0x7F000000, 0x7F7FFFFF, 0x7F7F0000, 0x7F800000, 0x7FC00000, 0x7F800001, 0x0DA7F6B2,
                 0x3B124925, 0x2F800000, 0x1F800000]
    rand_bits = rng.integers(0, 2**31, size=1 << 16, dtype=np.uint64).astype(np.uint32)
    v = np.concatenate([np.array(edge_bits, dtype=np.uint32), rand_bits]).view(np.float32)
    # finite values around the e4m3 / e5m2 grids: exponents -30..18, random mantissas and signs,
    # plus the exact grid points and midpoints of e4m3 near max and in the subnormal range
    ex = rng.integers(-30, 19, size=1 << 16)
    f = (rng.uniform(1.0, 2.0, size=1 << 16) * np.exp2(ex) * rng.choice([-1.0, 1.0], size=1 << 16)).astype(np.float32)
    grid = np.array([448, 464, 480, 416, 432, 440, 456, 57344, 61440, 2 ** -9, 1.5 * 2 ** -9, 2 ** -10,
                     3 * 2 ** -10, 2 ** -7 + 2 ** -10, 0.0, -0.0, 2 ** -16, 2 ** -17, 3 * 2 ** -17], dtype=np.float32)
    f = np.concatenate([grid, -grid, f]).astype(np.float32)
    e = np.arange(256, dtype=np.int32)
    return v, f, e


def op_selftest(torch, device, do_compile, repo=REPO, div=None):
    """The numerics helpers (make_ops) on edge values vs tests/numerics/quantize_ref.py (the
    project's independent numpy reference), eager and under torch.compile on `device`."""
    qr = quantize_ref(repo)
    o = make_ops(torch, div)
    v, f, e = selftest_values()
    pos = np.abs(v)
    posfin = pos[np.isfinite(pos) & (pos > 0)]
    F = np.float32
    exp = OrderedDict()
    np_err = np.seterr(all="ignore")
    exp["e8m0_rceil"] = qr.e8m0_rceil(pos)
    exp["e8m0_rceil_of_amax_over_448"] = qr.e8m0_rceil((pos * (F(1) / F(448))).astype(F))
    exp["e8m0_floor_e4m3"] = qr.e8m0_floor(pos, 8)
    exp["e8m0_floor_e5m2"] = qr.e8m0_floor(pos, 15)
    exp["mx_multiplier"] = qr.mx_multiplier(e).view(np.uint32)
    exp["scale_per_tensor"] = qr.compute_scale(pos, 448.0, 0.0, False, qr.FLT_MAX).view(np.uint32)
    exp["scale_block_pow2"] = qr.compute_scale(pos, 448.0, 0.0, True, qr.DTYPE_MAX["bf16"]).view(np.uint32)
    exp["scale_eps_e5m2"] = qr.compute_scale(pos, 57344.0, 1e-6, False, qr.FLT_MAX).view(np.uint32)
    exp["reciprocal"] = qr.recip(posfin).view(np.uint32)
    exp["encode_e4m3"] = qr.encode_rn(f, "e4m3")
    exp["encode_e5m2"] = qr.encode_rn(f, "e5m2")
    np.seterr(**np_err)
    inv448 = o.inv_fmax["e4m3"]

    def fn(pos_t, posfin_t, f_t, e_t):
        return (o.e8m0_rceil(pos_t), o.e8m0_rceil(pos_t * inv448), o.e8m0_floor(pos_t, 8), o.e8m0_floor(pos_t, 15),
                o.mx_multiplier(e_t), o.compute_scale(pos_t, 448.0, 0.0, False, FLT_MAX),
                o.compute_scale(pos_t, 448.0, 0.0, True, BF16_MAX), o.compute_scale(pos_t, 57344.0, 1e-6, False, FLT_MAX),
                o.f32_div(1.0, posfin_t), o.encode(f_t, "e4m3"), o.encode(f_t, "e5m2"))

    args = [torch.from_numpy(a.copy()).to(device) for a in (pos, posfin, f, e)]
    out = {"vectors": {"amax_like": int(pos.size), "finite": int(f.size), "e8m0": int(e.size)}, "reference": "tests/numerics/quantize_ref.py"}
    impls = [("torch_eager", fn)]
    if do_compile:
        torch._dynamo.reset()
        impls.append(("torch_compile", torch.compile(fn, fullgraph=True, dynamic=False)))
    ok = True
    for impl, g in impls:
        res = {}
        try:
            got = g(*args)
            for (name, want), t in zip(exp.items(), got):
                t = t.detach().cpu()
                if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                    a = t.view(torch.uint8).numpy()
                elif t.dtype == torch.float32:
                    a = t.view(torch.int32).numpy().view(np.uint32)
                else:
                    a = t.numpy()
                want = np.asarray(want)
                a = a.astype(want.dtype) if a.dtype != want.dtype else a
                bad = np.nonzero(a.reshape(-1) != want.reshape(-1))[0]
                r = {"mismatches": int(bad.size), "elements": int(want.size)}
                if bad.size:
                    r["examples"] = [{"index": int(i), "got": int(a.reshape(-1)[i]), "want": int(want.reshape(-1)[i])} for i in bad[:5]]
                res[name] = r
                ok = ok and bad.size == 0
        except Exception as ex:  # noqa: BLE001
            res = {"error": err_text(ex)}
            ok = False
        out[impl] = res
    out["ok"] = ok
    return out


def extra_args(spec, torch, device):
    if spec["mode"] == "per_tensor_delayed":
        return (torch.full((1,), DELAYED_SCALE, dtype=torch.float32, device=device),)
    return ()


def qforge_extra_args(spec):
    if spec["mode"] == "per_tensor_delayed":
        return ["--scale", repr(float(F32(DELAYED_SCALE)))]
    return []


def scale_input_bytes(spec):
    return 4 if spec["mode"] == "per_tensor_delayed" else 0


# ---------------------------------------------------------------------------------------------
# comparison helpers
# ---------------------------------------------------------------------------------------------
def to_bytes_np(t, torch):
    """Any torch tensor -> (numpy uint8 [n, itemsize], itemsize)."""
    t = t.detach().contiguous().reshape(-1)  # 1-D: stride 1 even for size-1 dims
    isz = t.element_size()
    b = t.view(torch.uint8).cpu().numpy().reshape(-1)
    return b.reshape(-1, isz) if isz > 0 else b, isz


def unswizzle(flat, rows, cols):
    """qforge's GEMM-swizzled 128x4-tile scale layout (templates/qforge/layout.cuh) -> compact."""
    pr, pc = -(-rows // 128) * 128, -(-cols // 4) * 4
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    off = ((r // 128) * (pc // 4) + (c // 4)) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)
    flat = np.asarray(flat).reshape(-1)
    if flat.size < pr * pc:
        raise ValueError(f"swizzled scale buffer has {flat.size} entries, expected >= {pr * pc}")
    return flat[off]


def from_mn_major(flat, rows, cols):
    """qforge's mn_major scale layout ([cols, rows padded to 4]) -> compact [rows, cols]."""
    pr = -(-rows // 4) * 4
    flat = np.asarray(flat).reshape(-1)
    if flat.size < pr * cols:
        raise ValueError(f"mn_major scale buffer has {flat.size} entries, expected >= {pr * cols}")
    return np.ascontiguousarray(flat[:pr * cols].reshape(cols, pr)[:, :rows].T)


def compare_arrays(a_bytes, b_bytes, isz, max_examples=5):
    """Element-wise comparison of two [n, isz] uint8 arrays."""
    res = {"elements": int(a_bytes.shape[0])}
    if a_bytes.shape != b_bytes.shape:
        res.update(mismatches=None, equal=False, error=f"size differs: {a_bytes.shape[0]} vs {b_bytes.shape[0]} elements")
        return res
    diff = np.any(a_bytes != b_bytes, axis=1)
    n = int(diff.sum())
    res.update(mismatches=n, equal=n == 0)
    if n:
        idx = np.nonzero(diff)[0][:max_examples]
        res["examples"] = [
            {"index": int(i), "a": a_bytes[i][::-1].tobytes().hex(), "b": b_bytes[i][::-1].tobytes().hex()}
            for i in idx
        ]
    return res


def compare_outputs(names, outs_a, outs_b, torch):
    """torch outputs vs torch outputs (eager vs compile), bytes; -> dict name -> result."""
    res = {}
    for nm, a, b in zip(names, outs_a, outs_b):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            res[nm] = {"equal": False, "error": f"shape/dtype differ: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"}
            continue
        if a.device.type == "cuda":
            isz = a.element_size()
            view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[isz]
            d = a.contiguous().reshape(-1).view(view) != b.contiguous().reshape(-1).view(view)
            n = int(d.sum().item())
            res[nm] = {"elements": int(a.numel()), "mismatches": n, "equal": n == 0}
        else:
            ab, isz = to_bytes_np(a, torch)
            bb, _ = to_bytes_np(b, torch)
            res[nm] = compare_arrays(ab, bb, isz)
    return res


def bf16_bits_np(v):
    """fp32 -> bf16 bits, RNE (finite inputs)."""
    u = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u >> 16) & 1) + 0x7FFF
    return ((u + r) >> 16).astype(np.uint16)


def check_inputs(m, k, seed):
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal((m, k), dtype=np.float32)
    wide = (rng.standard_normal((m, k), dtype=np.float32) *
            np.exp2(rng.integers(-20, 21, size=(m, k))).astype(np.float32)).astype(np.float32)
    return {"normal": bf16_bits_np(normal), "wide": bf16_bits_np(wide)}


def run_qforge(qforge, spec, npy_path, out_dir, qdev, timeout=300):
    cmd = [str(qforge), "quantize", "--recipe", str(REPO / spec["recipe_file"]), "--role", spec["role"],
           "--usage", spec["usage"], "--input", str(npy_path), "--out", str(out_dir), "--device", qdev]
    cmd += qforge_extra_args(spec)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}")
    with open(Path(out_dir) / "manifest.json") as f:
        man = json.load(f)
    bufs = {}
    for b in man["buffers"]:
        bufs[b["name"]] = (np.load(Path(out_dir) / b["file"]), b)
    return bufs, cmd


def compare_with_qforge(spec, names, outs, qbufs, torch):
    res = {"buffers": {}, "missing_in_torch": [], "missing_in_qforge": []}
    stream_of = {s["dir"]: s for s in spec["streams"]}
    ok = True
    for nm, t in zip(names, outs):
        if nm not in qbufs:
            res["missing_in_qforge"].append(nm)
            ok = False
            continue
        arr, desc = qbufs[nm]
        tb, isz = to_bytes_np(t, torch)
        qarr = arr
        direction = desc.get("direction")
        st = stream_of.get(direction) if direction else None
        if desc.get("kind") == "scale_inv" and st is not None and st.get("scale_layout") == "swizzled" and t.dim() == 2:
            qarr = unswizzle(arr, t.shape[0], t.shape[1])
        if desc.get("kind") == "scale_inv" and st is not None and st.get("scale_layout") == "mn_major" and t.dim() == 2:
            qarr = from_mn_major(arr, t.shape[0], t.shape[1])
        qb = np.ascontiguousarray(qarr).view(np.uint8).reshape(-1)
        if qb.size % isz:
            r = {"equal": False, "error": f"qforge buffer of {qb.size} B is not a multiple of {isz}"}
        else:
            r = compare_arrays(tb, qb.reshape(-1, isz), isz)
        r["torch_shape"] = list(t.shape)
        r["qforge_shape"] = list(np.asarray(arr).shape)
        res["buffers"][nm] = r
        ok = ok and bool(r.get("equal"))
    for nm, (_, desc) in qbufs.items():
        if nm not in names:
            res["missing_in_torch"].append(nm)
            if desc.get("kind") in ("data", "scale_inv"):
                ok = False
    res["ok"] = ok
    return res


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def time_fn(fn, xs, extra, iters, warmup, torch, device):
    """Median (and min/max) per-call time in ms; inputs rotate through xs."""
    n = len(xs)
    for i in range(warmup):
        fn(xs[i % n], *extra)
    if device == "cuda":
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            x = xs[(warmup + i) % n]
            starts[i].record()
            out = fn(x, *extra)
            ends[i].record()
            del out
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        ts = []
        for i in range(iters):
            x = xs[(warmup + i) % n]
            t0 = time.perf_counter()
            out = fn(x, *extra)
            ts.append((time.perf_counter() - t0) * 1e3)
            del out
    ts.sort()
    return {"time_ms": float(np.median(ts)), "min_ms": float(ts[0]), "max_ms": float(ts[-1]), "iters": len(ts)}


def time_graph(fn, xs, extra, iters, warmup, torch):
    """GPU time per call without launch overhead: one CUDA graph holding one call per rotated
    input, replayed; median replay time / len(xs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(xs[0], *extra)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [fn(x, *extra) for x in xs]
    try:
        for _ in range(max(1, warmup)):
            g.replay()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            g.replay()
            ends[i].record()
        torch.cuda.synchronize()
        ts = sorted(s_.elapsed_time(e) / len(xs) for s_, e in zip(starts, ends))
    finally:
        del outs
        del g
    return {"graph_time_ms": float(np.median(ts)), "graph_min_ms": float(ts[0]), "graph_calls_per_replay": len(xs)}


def make_inputs(m, k, count, torch, device, seed):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    xs = []
    for _ in range(count):
        xs.append(torch.randn((m, k), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16))
    return xs


def output_bytes(outs):
    return int(sum(t.numel() * t.element_size() for t in outs))


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
class Writer:
    def __init__(self, path, doc):
        self.path = Path(path)
        self.doc = doc

    def flush(self):
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, self.path)


def err_text(e):
    s = f"{type(e).__name__}: {e}"
    return s if len(s) < 4000 else s[:2000] + " ... " + s[-1500:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qforge", default=str(REPO / "build/tools/qforge"), help="qforge CLI binary (agreement check)")
    ap.add_argument("--out", required=True, help="output directory (torch_baselines.json)")
    ap.add_argument("--sizes", nargs="+", default=None, help="MxK sizes (space or comma separated), default: 1024^2 .. 16384^2, 65536x7168")
    ap.add_argument("--quick", action="store_true", help="sizes 2048^2 and 8192^2, 20 iterations, 3 warm-up")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    ap.add_argument("--iters", type=int, default=None, help="timed iterations per measurement (default 50, quick 20; at least 20)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 5, quick 3)")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="stop starting new measurements after this many seconds (0: no limit); the rest is recorded as skipped")
    ap.add_argument("--check-shape", default="2048x4096", help="shape of the agreement check")
    ap.add_argument("--check-seed", type=int, default=1234)
    ap.add_argument("--no-check", action="store_true", help="skip the agreement check against qforge")
    ap.add_argument("--no-selftest", action="store_true", help="skip the edge-value test of the numerics helpers")
    ap.add_argument("--no-compile", action="store_true", help="time torch eager only")
    ap.add_argument("--no-graph", action="store_true", help="skip the extra CUDA-graph timing (GPU time without launch overhead)")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"], help="torch device (default cuda if available)")
    ap.add_argument("--qforge-device", default=None, choices=["cuda", "cpu"], help="qforge quantize --device (default: same as --device)")
    ap.add_argument("--div", choices=["fp32", "fp64"], default="fp32",
                    help="how the fp32 quotients fmax/amax and 1/scale are computed: fp32 `/` (default; exact in "
                         "eager, and under compile through Inductor's eager_numerics.division_rounding, set here) "
                         "or in fp64 then rounded to fp32 (exact without that setting, slower compiled block casts)")
    ap.add_argument("--rotate-below-mib", type=float, default=64.0, help="rotate input buffers below this input size")
    ap.add_argument("--rotate-total-mib", type=float, default=256.0, help="total size of the rotated input buffers")
    ap.add_argument("--keep-check-files", action="store_true", help="keep the check inputs/outputs (under OUT/check)")
    args = ap.parse_args(argv)

    t_start = time.time()
    DIVISION["mode"] = args.div
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch  # noqa: E402 (after argparse so that --help works without torch)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    qdev = args.qforge_device or device
    sizes = parse_sizes(args.sizes) if args.sizes else (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    iters = max(20, args.iters if args.iters is not None else (20 if args.quick else 50))
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    case_names = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in case_names:
        if c not in CASES:
            ap.error(f"unknown case {c!r}; known: {', '.join(CASES)}")
    check_shape = parse_size(args.check_shape)

    # torch.compile settings: one graph per (case, shape), no automatic dynamic shapes.
    compile_cfg = {"mode": "default", "fullgraph": True, "dynamic": False}
    try:
        import torch._dynamo
        import torch._inductor.config as inductor_config
        for attr in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, attr):
                setattr(torch._dynamo.config, attr, 64)
        if hasattr(inductor_config, "eager_numerics") and hasattr(inductor_config.eager_numerics, "division_rounding"):
            inductor_config.eager_numerics.division_rounding = True  # fp32 `/` -> tl.div_rn (IEEE), as in eager
            compile_cfg["inductor.eager_numerics.division_rounding"] = True
        elif args.div == "fp32":
            compile_cfg["warning"] = ("this torch has no inductor eager_numerics.division_rounding: compiled fp32 "
                                      "divisions may be approximate; use --div fp64")
    except Exception as e:  # noqa: BLE001
        compile_cfg["config_error"] = err_text(e)

    dev_name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    l2 = None
    if device == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None

    rotate_below = int(args.rotate_below_mib * 2**20)
    rotate_total = int(max(args.rotate_total_mib * 2**20, 4 * (l2 or 0)))
    doc = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": dev_name,
        "torch_device": device,
        "qforge_device": qdev,
        "l2_cache_bytes": l2,
        "torch": torch.__version__,
        "torch_cuda": getattr(torch.version, "cuda", None),
        "triton": triton_version,
        "python": platform.python_version(),
        "qforge": str(args.qforge),
        "input_dtype": IN_DTYPE,
        "role": ROLE,
        "sizes": [list(s) for s in sizes],
        "compile": compile_cfg,
        "timing": {
            "method": "cuda_events per call" if device == "cuda" else "time.perf_counter per call (CPU test mode)",
            "stat": "median", "iters": iters, "warmup": warmup,
            "rotate_inputs_below_bytes": rotate_below, "rotated_inputs_total_bytes": rotate_total,
            "note": "time_ms: each call is timed on its own (start/end event around it, no sync in between); "
                    "a call includes its launch overhead where the GPU waits for the CPU (eager's many small "
                    "kernels, torch.compile's guard check + wrapper). Outputs are allocated by torch per call. "
                    "graph_time_ms (cuda, unless --no-graph): the same calls captured in one CUDA graph (one "
                    "call per rotated input buffer), median replay time / calls: GPU time without launch overhead.",
        },
        "bytes_formula": BYTES_FORMULA,
        "delayed_scale": DELAYED_SCALE,
        "division": args.div,
        "cases": {},
        "agreement": [],
        "results": [],
        "skipped": [],
        "errors": [],
    }
    writer = Writer(out_dir / "torch_baselines.json", doc)
    writer.flush()

    specs, fns = {}, {}
    for c in case_names:
        try:
            spec = load_case(c)
            fn, names, passes = build_fn(spec, torch)
            specs[c] = spec
            fns[c] = (fn, names, passes)
            doc["cases"][c] = {k: spec[k] for k in ("recipe", "recipe_file", "role", "usage", "mode", "directions", "columnwise_layout")}
            doc["cases"][c]["streams"] = spec["streams"]
            doc["cases"][c]["outputs"] = names
            doc["cases"][c]["input_passes"] = passes
        except Exception as e:  # noqa: BLE001
            doc["errors"].append({"case": c, "stage": "setup", "error": err_text(e)})
            log(f"{c}: setup failed: {err_text(e)}")
    writer.flush()

    def budget_left():
        return args.budget_s <= 0 or (time.time() - t_start) < args.budget_s

    def compile_fn(fn):
        torch._dynamo.reset()
        return torch.compile(fn, fullgraph=True, dynamic=False, mode=None)

    # ---- 0. the numerics helpers on edge values (vs tests/numerics/quantize_ref.py) ----
    if not args.no_selftest:
        try:
            st = op_selftest(torch, device, not args.no_compile)
        except Exception as e:  # noqa: BLE001
            st = {"ok": None, "error": err_text(e)}
        doc["op_selftest"] = st
        summary = {impl: (sum(v.get("mismatches", 0) for v in st[impl].values()) if "error" not in st[impl] else st[impl]["error"][:200])
                   for impl in ("torch_eager", "torch_compile") if isinstance(st.get(impl), dict)}
        log(f"op self-test: ok={st.get('ok')} mismatches={summary} {st.get('error', '')}")
        writer.flush()

    # ---- 1. agreement with qforge ----
    agreement_ok = {}  # (case, impl) -> bool
    if not args.no_check:
        qforge = Path(args.qforge)
        work = Path(tempfile.mkdtemp(prefix="qf_torch_check_"))
        try:
            cm, ck = check_shape
            inputs = check_inputs(cm, ck, args.check_seed)
            npys = {}
            for ds, bits in inputs.items():
                npys[ds] = work / f"x_{ds}_{cm}x{ck}.npy"
                np.save(npys[ds], bits)
            for c in specs:
                spec, (fn, names, _) = specs[c], fns[c]
                cfn, cerr = None, None
                if not args.no_compile:
                    cfn = compile_fn(fn)
                for ds, bits in inputs.items():
                    entry = {"case": c, "recipe": spec["recipe"], "role": spec["role"], "usage": spec["usage"],
                             "shape": [cm, ck], "dataset": ds, "qforge_device": qdev}
                    try:
                        if not qforge.exists():
                            raise FileNotFoundError(f"qforge binary {qforge} not found")
                        qout = work / f"q_{c}_{ds}"
                        try:
                            qbufs, cmd = run_qforge(qforge, spec, npys[ds], qout, qdev)
                            entry["qforge_device"] = qdev
                        except Exception as e:  # noqa: BLE001
                            if qdev == "cpu":
                                raise
                            entry["qforge_cuda_error"] = err_text(e)
                            log(f"{c}/{ds}: qforge --device {qdev} failed, using the CPU reference: {err_text(e)}")
                            qbufs, cmd = run_qforge(qforge, spec, npys[ds], qout, "cpu")
                            entry["qforge_device"] = "cpu"
                        entry["qforge_cmd"] = " ".join(cmd)
                        if args.keep_check_files:
                            dst = out_dir / "check" / f"q_{c}_{ds}"
                            shutil.rmtree(dst, ignore_errors=True)
                            shutil.copytree(qout, dst)
                    except Exception as e:  # noqa: BLE001
                        entry["error"] = err_text(e)
                        doc["agreement"].append(dict(entry, impl="qforge", ok=None))
                        log(f"{c}/{ds}: qforge run failed: {err_text(e)}")
                        writer.flush()
                        continue
                    x = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).to(device)
                    extra = extra_args(spec, torch, device)
                    impls = [("torch_eager", fn)] + ([] if args.no_compile else [("torch_compile", cfn)])
                    for impl, f in impls:
                        e2 = dict(entry, impl=impl)
                        try:
                            if f is None:
                                raise RuntimeError(cerr or "no compiled function")
                            outs = f(x, *extra)
                            if device == "cuda":
                                torch.cuda.synchronize()
                            r = compare_with_qforge(spec, names, outs, qbufs, torch)
                            e2.update(r)
                            del outs
                        except Exception as e:  # noqa: BLE001
                            e2.update(ok=False, error=err_text(e))
                            if impl == "torch_compile":
                                e2["traceback"] = traceback.format_exc()[-3000:]
                        agreement_ok[(c, impl)] = bool(agreement_ok.get((c, impl), True) and e2.get("ok"))
                        doc["agreement"].append(e2)
                        mism = {k: v.get("mismatches") for k, v in e2.get("buffers", {}).items()}
                        log(f"check {c}/{ds}/{impl}: ok={e2.get('ok')} mismatches={mism} {e2.get('error', '')[:300]}")
                        writer.flush()
                    del x
                if args.keep_check_files:
                    for ds, p in npys.items():
                        (out_dir / "check").mkdir(exist_ok=True)
                        shutil.copy(p, out_dir / "check" / p.name)
        except Exception as e:  # noqa: BLE001
            doc["errors"].append({"stage": "check", "error": err_text(e), "traceback": traceback.format_exc()[-3000:]})
            log(f"agreement check failed: {err_text(e)}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        writer.flush()

    # ---- 2. timing ----
    for (m, k) in sizes:
        in_bytes = m * k * IN_ITEMSIZE
        nbuf = 1
        if device == "cuda" and in_bytes < rotate_below:
            nbuf = max(2, math.ceil(rotate_total / in_bytes))
        xs = None
        for c in specs:
            spec, (fn, names, passes) = specs[c], fns[c]
            base = {"case": c, "recipe": spec["recipe"], "recipe_file": spec["recipe_file"], "role": spec["role"],
                    "usage": spec["usage"], "directions": spec["directions"],
                    "columnwise_layout": spec["columnwise_layout"], "shape": [m, k], "dtype": IN_DTYPE,
                    "input_bytes": in_bytes, "input_passes": passes, "rotated_buffers": nbuf}
            impls = ["torch_eager"] + ([] if args.no_compile else ["torch_compile"])
            if not budget_left():
                for impl in impls:
                    doc["skipped"].append(dict(base, impl=impl, reason=f"time budget of {args.budget_s} s used up"))
                writer.flush()
                continue
            try:
                if xs is None:
                    xs = make_inputs(m, k, nbuf, torch, device, seed=1000 + m + k)
                extra = extra_args(spec, torch, device)
            except Exception as e:  # noqa: BLE001
                for impl in impls:
                    doc["results"].append(dict(base, impl=impl, time_ms=None, error=err_text(e)))
                log(f"{c} {m}x{k}: input allocation failed: {err_text(e)}")
                writer.flush()
                xs = None
                if device == "cuda":
                    torch.cuda.empty_cache()
                continue
            ref_outs = None
            for impl in impls:
                r = dict(base, impl=impl)
                t0 = time.time()
                try:
                    if impl == "torch_eager":
                        f = fn
                    else:
                        f = compile_fn(fn)
                    outs = f(xs[0], *extra)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    if impl == "torch_compile":
                        r["compile_s"] = round(time.time() - t0, 3)
                    ob = output_bytes(outs)
                    r["output_bytes"] = ob
                    r["bytes"] = passes * in_bytes + ob
                    r["bytes_breakdown"] = {"input_reads": passes * in_bytes, "outputs": ob,
                                            "scale_inputs_not_counted": scale_input_bytes(spec)}
                    if impl == "torch_eager":
                        ref_outs = outs
                    else:
                        if ref_outs is not None:
                            cmp = compare_outputs(names, ref_outs, outs, torch)
                            r["equal_to_eager"] = all(v.get("equal") for v in cmp.values())
                            if not r["equal_to_eager"]:
                                r["eager_comparison"] = cmp
                        ref_outs = None
                    del outs
                    r.update(time_fn(f, xs, extra, iters, warmup, torch, device))
                    r["time_us"] = r["time_ms"] * 1e3
                    r["gbps"] = r["bytes"] / (r["time_ms"] * 1e-3) / 1e9
                    if device == "cuda" and not args.no_graph:
                        try:
                            r.update(time_graph(f, xs, extra, iters, warmup, torch))
                            r["graph_gbps"] = r["bytes"] / (r["graph_time_ms"] * 1e-3) / 1e9
                        except Exception as e:  # noqa: BLE001
                            r["graph_error"] = err_text(e)
                            torch.cuda.synchronize()
                    r["agreement_ok"] = agreement_ok.get((c, impl))
                    log(f"{c} {m}x{k} {impl}: {r['time_ms'] * 1e3:.1f} us, {r['gbps']:.0f} GB/s"
                        + (f" (compile {r['compile_s']} s)" if "compile_s" in r else ""))
                except Exception as e:  # noqa: BLE001
                    r.update(time_ms=None, error=err_text(e))
                    if impl == "torch_compile":
                        r["traceback"] = traceback.format_exc()[-3000:]
                    log(f"{c} {m}x{k} {impl}: failed: {err_text(e)[:500]}")
                    if device == "cuda":
                        torch.cuda.synchronize()
                doc["results"].append(r)
                writer.flush()
            ref_outs = None
        xs = None
        if device == "cuda":
            torch.cuda.empty_cache()

    doc["elapsed_s"] = round(time.time() - t_start, 1)
    writer.flush()
    n_ok = sum(1 for r in doc["results"] if r.get("time_ms") is not None)
    bad = [a for a in doc["agreement"] if a.get("ok") is False]
    log(f"done in {doc['elapsed_s']} s: {n_ok} timings, {len(doc['skipped'])} skipped, "
        f"{len(bad)} failed agreement checks -> {writer.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
