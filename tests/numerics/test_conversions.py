"""Element conversions of templates/qforge/numerics.cuh against independent implementations.

Expectations come from ml_dtypes / numpy only (never from the C++ code); the constants of the
docs/numerics.md tables (max finite, NaN encodings) are restated here.

  * fp8/fp6/fp4: ml_dtypes cast of np.clip(x, -max, max) (clipping first implements satfinite;
    ml_dtypes itself overflows e4m3 to NaN and e5m2 to Inf); NaN -> the spec's canonical byte.
  * int8: clip(rint(x), -128, 127), NaN -> 0.
  * bf16: ml_dtypes.bfloat16; fp16: numpy float16; NaN -> sign | 0x7FC0 / sign | 0x7E00.
  * e8m0_rne: ml_dtypes.float8_e8m0fnu (bit for bit, NaN/zero/negative -> 0xFF included).
  * e8m0_rceil: 2^E >= |v| with E minimal ("smallest power of two >= v", formats.md), i.e.
    E = ceil(log2|v|) + 127 clamped to [0, 254]; 0 -> 0, Inf -> 0xFE, NaN -> 0xFF.

Inputs: every bf16 bit pattern (exhaustive, through the tool's --bf16-input mode), and ~2.5M
fp32 values: random bit patterns, uniform and log-uniform values, every grid point and every
tie (midpoint) of each format with their nearest fp32 neighbours, and the special values.
"""
import ml_dtypes as md
import numpy as np
import pytest

F32 = np.float32

# name: (ml_dtypes type, max finite, canonical NaN byte from docs/numerics.md)
FLOAT_FORMATS = {
    "e4m3": (md.float8_e4m3fn, 448.0, 0x7F),
    "e5m2": (md.float8_e5m2, 57344.0, 0x7F),
    "e2m1": (md.float4_e2m1fn, 6.0, 0x7),
    "e2m3": (md.float6_e2m3fn, 7.5, 0x1F),
    "e3m2": (md.float6_e3m2fn, 28.0, 0x1F),
}
ALL_FORMATS = list(FLOAT_FORMATS) + ["int8", "e8m0_rne", "e8m0_rceil", "bf16", "f16"]


def bits(x):
    return np.asarray(x, dtype=F32).view(np.uint32)


def from_bits(u):
    return np.asarray(u, dtype=np.uint32).view(F32)


def finite_grid(t):
    """All finite values of a <= 8-bit ml_dtypes float type."""
    n = 1 << (8 * np.dtype(t).itemsize)
    width = {md.float4_e2m1fn: 16, md.float6_e2m3fn: 64, md.float6_e3m2fn: 64}.get(t, n)
    v = np.arange(width, dtype=np.uint8).view(t).astype(np.float64)
    return np.unique(v[np.isfinite(v)])


def with_midpoints(grid):
    """Positive grid values and the midpoints between consecutive ones (exact in fp32)."""
    g = np.unique(np.abs(grid))
    mids = (g[:-1] + g[1:]) / 2
    out = np.concatenate([g, mids])
    assert np.all(out.astype(F32).astype(np.float64) == out)
    return out.astype(F32)


def neighbours(centers, steps):
    """centers (positive fp32) and their fp32 neighbours at +-steps ulps, both signs."""
    b = bits(np.abs(centers)).astype(np.int64)
    out = [np.clip(b + k, 0, 0x7F800000) for k in steps]
    pos = np.concatenate(out).astype(np.uint32)
    return np.concatenate([pos, pos | np.uint32(0x80000000)])


def special_values():
    sp = [0.0, np.inf, 1.0, 2.0, 3.0, 0.5, 0.75, 1.5,
          np.finfo(F32).max, np.finfo(F32).tiny, 2.0**-149, 2.0**-127, 2.0**-128,
          1.5 * 2.0**127, 2.0**127, 65504.0, 65520.0, 65519.99, 1e-40, 1e30]
    for _, fmax, _ in FLOAT_FORMATS.values():
        sp += [fmax, fmax * 1.25, fmax * 2, fmax + fmax / 64]
    sp += [127.0, 127.5, 128.0, 128.5, 126.5, 0.49999997]
    pos = bits(np.array(sp, dtype=F32))
    nans = np.array([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000], dtype=np.uint32)
    allb = np.concatenate([pos, nans])
    allb = np.concatenate([allb, allb | np.uint32(0x80000000)])
    return neighbours(from_bits(allb[np.isfinite(from_bits(allb))] & np.uint32(0x7FFFFFFF)),
                      range(-2, 3)), allb


def build_fp32_sample():
    rng = np.random.default_rng(20240611)
    parts = [rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)]
    parts.append(bits(rng.uniform(-600.0, 600.0, 200_000).astype(F32)))
    mag = np.exp2(rng.uniform(-150.0, 20.0, 300_000))
    sign = rng.integers(0, 2, mag.size) * 2 - 1
    parts.append(bits((mag * sign).astype(F32)))
    centers = []
    for t, _, _ in FLOAT_FORMATS.values():
        centers.append(with_midpoints(finite_grid(t)))
    centers.append(np.arange(0, 260, 0.5, dtype=F32))                      # int8 grid and ties
    k = np.arange(-149, 128)
    centers.append(np.ldexp(1.0, k).astype(F32))                          # e8m0 grid
    centers.append(np.ldexp(1.5, k[k < 127]).astype(F32))                 # e8m0 rne ties
    parts.append(neighbours(np.concatenate(centers), range(-3, 4)))
    f16 = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    parts.append(neighbours(with_midpoints(f16), (-1, 0, 1)))
    b16 = from_bits(np.arange(0x7F80, dtype=np.uint32) << 16).astype(np.float64)
    parts.append(neighbours(with_midpoints(b16), (-1, 0, 1)))
    near_specials, specials = special_values()
    parts += [near_specials, specials]
    return from_bits(np.concatenate(parts))


@pytest.fixture(scope="module")
def fp32_sample():
    x = build_fp32_sample()
    assert x.size > 2_000_000
    return x


# ------------------------------------------------------------------------------- expectations
def expect(fmt, x):
    """Expected encoding of fp32 values x (dtype uint8, or uint16 for bf16/f16)."""
    x = np.asarray(x, dtype=F32)
    nan = np.isnan(x)
    neg = (bits(x) >> 31).astype(bool)
    with np.errstate(all="ignore"):
        if fmt in FLOAT_FORMATS:
            t, fmax, nan_byte = FLOAT_FORMATS[fmt]
            y = np.clip(x, -fmax, fmax).astype(t).view(np.uint8).copy()
            y[nan] = nan_byte
            return y
        if fmt == "int8":
            r = np.clip(np.rint(x.astype(np.float64)), -128, 127)
            r[nan] = 0
            return r.astype(np.int8).view(np.uint8)
        if fmt == "bf16":
            y = x.astype(md.bfloat16).view(np.uint16).copy()
            y[nan] = np.where(neg[nan], 0xFFC0, 0x7FC0)
            return y
        if fmt == "f16":
            y = x.astype(np.float16).view(np.uint16).copy()
            y[nan] = np.where(neg[nan], 0xFE00, 0x7E00)
            return y
        if fmt == "e8m0_rne":
            return x.astype(md.float8_e8m0fnu).view(np.uint8)
        if fmt == "e8m0_rceil":
            a = np.abs(x.astype(np.float64))
            m, e = np.frexp(a)                     # a = m * 2^e, m in [0.5, 1)
            ceil_log2 = np.where(m == 0.5, e - 1, e)
            y = np.clip(ceil_log2 + 127, 0, 254)
            y = np.where(a == 0, 0, y)
            y = np.where(np.isinf(a), 0xFE, y)
            y = np.where(nan, 0xFF, y)
            return y.astype(np.uint8)
    raise ValueError(fmt)


def assert_bits_equal(fmt, x, got, want):
    bad = np.nonzero(got != want)[0]
    if bad.size:
        lines = [f"{fmt}: {bad.size} of {x.size} differ; first ones (x bits, x, got, want):"]
        for i in bad[:12]:
            lines.append(f"  0x{int(bits(x[i])):08X} {float(x[i])!r:>16} "
                         f"got 0x{int(got[i]):02X} want 0x{int(want[i]):02X}")
        pytest.fail("\n".join(lines))


# ------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_fp32_sample(qf_convert, fp32_sample, fmt):
    got = qf_convert(fmt, fp32_sample)
    assert_bits_equal(fmt, fp32_sample, got, expect(fmt, fp32_sample))


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_bf16_exhaustive(qf_convert, fmt):
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    x = from_bits(patterns.astype(np.uint32) << 16)  # exact widening
    assert np.array_equal(x[~np.isnan(x)],
                          patterns.view(md.bfloat16).astype(F32)[~np.isnan(x)])
    got = qf_convert(fmt, patterns, bf16_input=True)
    assert_bits_equal(fmt, x, got, expect(fmt, x))


def test_fp8_nan_stays_nan_in_ml_dtypes_too():
    """Sanity of the reference: the spec's NaN bytes are NaN in ml_dtypes, and the formats
    without NaN map it to +max (0x7 = +6, 0x1F = +7.5 / +28)."""
    for fmt in ("e4m3", "e5m2"):
        t, _, nan_byte = FLOAT_FORMATS[fmt]
        assert np.isnan(np.array([nan_byte], dtype=np.uint8).view(t).astype(F32)[0])
    for fmt in ("e2m1", "e2m3", "e3m2"):
        t, fmax, nan_byte = FLOAT_FORMATS[fmt]
        assert np.array([nan_byte], dtype=np.uint8).view(t).astype(F32)[0] == fmax


def test_negative_zero_and_tiny_negatives_keep_sign(qf_convert):
    x = np.array([-0.0, -1e-30, -2.0**-149], dtype=F32)
    for fmt in FLOAT_FORMATS:
        bits_ = FLOAT_FORMATS[fmt][0]
        sign = {"e2m1": 0x8, "e2m3": 0x20, "e3m2": 0x20}.get(fmt, 0x80)
        assert list(qf_convert(fmt, x)) == [sign] * 3, (fmt, bits_)
    assert list(qf_convert("int8", x)) == [0, 0, 0]
