"""`qforge quantize` (CPU reference) against the independent numpy reference quantize_ref.py,
bit for bit, for every shipped recipe x role x usage x input dtype x shape.

Run:  python3 -m pytest -q tests/numerics/test_quantize_cli.py --qforge-bin=<cmake build dir>
"""
import glob
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quantize_ref as qr  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPES = sorted(glob.glob(os.path.join(ROOT, "recipes", "*.json")))
RECIPES = [r for r in RECIPES if not r.endswith("recipe.schema.json")]
ROLES = ["linear:input", "linear:weight", "linear:grad_output"]
USAGES = ["training", "inference"]
DTYPES = ["bf16", "fp32"]
SHAPES = [(32, 64), (48, 160), (64, 256), (1, 32)]

F32 = np.float32


def run(qforge, *args):
    p = subprocess.run([qforge, *map(str, args)], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def save_input(path, values, dtype):
    """Stores fp32 `values` as an input .npy of `dtype`; returns the fp32 values qforge sees."""
    stored, seen = qr.to_input_dtype(values, dtype)
    np.save(path, stored)
    return seen


def load_outputs(out_dir):
    with open(os.path.join(out_dir, "manifest.json")) as f:
        man = json.load(f)
    outs = {}
    for b in man["buffers"]:
        a = np.load(os.path.join(out_dir, b["file"]))
        assert list(a.shape) == b["shape"], b
        assert a.dtype.str == b["npy_descr"], b
        outs[b["name"]] = a
    return man, outs


def make_input(rng, m, k, outlier=True):
    scale = F32(2.0 ** rng.uniform(-8, 8))
    x = (rng.standard_normal((m, k)) * scale).astype(F32)
    # a few exact zeros (with both signs)
    idx = rng.integers(0, m * k, size=max(1, m * k // 50))
    x.flat[idx] = 0
    x.flat[idx[::2]] = -0.0
    if m > 2:
        x[1, :] = 0                                # zero rowwise blocks
        x[:, 0] = 0                                # zero columnwise blocks
        x[16:32, 32:48] = 0                        # a zero 16x16 tile
    if outlier:
        x[rng.integers(0, m), rng.integers(1, k)] = scale * F32(1000.0)
    return x


def compare(got, exp, ctx):
    assert sorted(got) == sorted(exp), f"{ctx}: buffers {sorted(got)} != expected {sorted(exp)}"
    for name, e in exp.items():
        g = got[name]
        e = np.asarray(e)
        if e.dtype == np.float32:
            e = e.view(np.uint32)
            g = g.view(np.uint32)
        assert g.dtype.itemsize == e.dtype.itemsize, f"{ctx}: {name} dtype {g.dtype} vs {e.dtype}"
        if g.shape != e.shape:
            assert g.size == e.size and g.ravel().shape == e.ravel().shape, \
                f"{ctx}: {name} shape {g.shape} vs expected {e.shape}"
            g, e = g.ravel(), e.ravel()
        g = g.view(e.dtype) if g.dtype != e.dtype else g
        bad = np.argwhere(g != e)
        if bad.size:
            first = [tuple(int(i) for i in b) for b in bad[:8]]
            pairs = [(f"{int(g[i]):#x}", f"{int(e[i]):#x}") for i in first]
            pytest.fail(f"{ctx}: {name}: {len(bad)} of {e.size} entries differ; first at {first}: "
                        f"(got, expected) {pairs}")


def seed_for(*parts):
    return zlib.crc32("|".join(map(str, parts)).encode())


CASES = [(r, role, u, d, s) for r in RECIPES for role in ROLES for u in USAGES for d in DTYPES for s in SHAPES]


def case_id(c):
    r, role, u, d, s = c
    return f"{os.path.basename(r)[:-5]}-{role.split(':')[1]}-{u}-{d}-{s[0]}x{s[1]}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_quantize_matches_reference(qforge, tmp_path, case):
    recipe_path, role, usage, dtype, (m, k) = case
    recipe = qr.load_recipe(recipe_path)
    rng = np.random.default_rng(seed_for(*case_id(case)))
    x = make_input(rng, m, k)
    xin = save_input(tmp_path / "x.npy", x, dtype)
    seed = int(rng.integers(0, 1 << 63)) | (1 << 40)
    offset = int(rng.integers(0, 1 << 40))
    scale = F32(300.0) / qr.amax_of(xin) if qr.amax_of(xin) > 0 else F32(1)
    args = ["quantize", "--recipe", recipe_path, "--role", role, "--input", tmp_path / "x.npy",
            "--out", tmp_path / "out", "--usage", usage, "--dtype", dtype,
            "--seed", seed, "--offset", offset]
    streams = None
    try:
        streams = qr.plan_streams(recipe, role, dtype, usage)
        qr.check_shape(streams, m, k)
        delayed = any(s["scaling"]["mode"] == "per_tensor_delayed" for s in streams)
    except qr.NotCovered as e:
        rc, _, err = run(qforge, *args)
        assert rc == 2, f"expected exit 2 ({e.args[0]}), got {rc}: {err}"
        assert {"no rule": "no rule", "columnwise": "columnwise", "rowwise": "rowwise",
                "shape": "shape"}[e.args[0]] in err, err
        return
    if delayed:
        args += ["--scale", repr(float(scale))]
    rc, out, err = run(qforge, *args)
    assert rc == 0, f"qforge failed ({rc}): {err}"
    man, got = load_outputs(tmp_path / "out")
    assert man["role"] == role and man["usage"] == usage and man["dtype"] == dtype
    assert man["shape"] == [m, k] and man["seed"] == seed and man["offset"] == offset
    assert len(out.strip().splitlines()) == len(man["buffers"])
    exp = qr.quantize(recipe, role, xin, dtype, usage=usage, seed=seed, offset=offset,
                      scales=F32(scale) if delayed else None)
    compare(got, exp, case_id(case))


def recipe_file(name):
    return os.path.join(ROOT, "recipes", name + ".json")


@pytest.mark.parametrize("name,role", [
    ("current_scaling", "linear:input"), ("current_scaling", "linear:grad_output"),
    ("delayed_scaling", "linear:input"), ("float8_block_scaling", "linear:weight"),
    ("float8_block_scaling", "linear:input"), ("mxfp8", "linear:input"),
    ("nvfp4", "linear:input"), ("nvfp4", "linear:weight"), ("nvfp4", "linear:grad_output"),
    ("hybrid_mxfp8_fwd_nvfp4_bwd", "linear:grad_output"), ("int8_weight_sr", "linear:weight"),
    ("int8_weight_sr", "linear:input"), ("w8a8_int8_inference", "linear:weight"),
    ("fp8_rowwise", "linear:input"),
])
def test_nan_inf(qforge, tmp_path, name, role):
    """NaN / +-Inf inputs give the documented outputs (fp32 input, so nothing is lost on the way)."""
    recipe = qr.load_recipe(recipe_file(name))
    m, k = 32, 64
    rng = np.random.default_rng(seed_for(name, role))
    x = make_input(rng, m, k, outlier=False)
    x[2, 5], x[3, 40], x[20, 7] = np.nan, np.inf, -np.inf
    x[5, 33] = -np.nan
    np.save(tmp_path / "x.npy", x)
    args = ["quantize", "--recipe", recipe_file(name), "--role", role, "--input", tmp_path / "x.npy",
            "--out", tmp_path / "out", "--seed", 7]
    delayed = name == "delayed_scaling"
    if delayed:
        args += ["--scale", "2.5"]
    rc, _, err = run(qforge, *args)
    assert rc == 0, err
    _, got = load_outputs(tmp_path / "out")
    exp = qr.quantize(recipe, role, x, "fp32", seed=7, scales=F32(2.5) if delayed else None)
    compare(got, exp, f"{name}-{role}")
    # Documented specifics, stated directly.
    if name == "current_scaling":
        # amax is Inf -> scale 1; NaN -> 0x7F; +-Inf -> +-max.
        assert got["amax"].view(np.uint32)[0] == 0x7F800000
        assert got["rowwise_scale_inv"][0] == 1.0
        rd = got["rowwise_data"]
        assert rd[2, 5] == 0x7F and rd[5, 33] == 0x7F
        assert rd[3, 40] == (0x7E if role == "linear:input" else 0x7B)
        assert rd[20, 7] == (0xFE if role == "linear:input" else 0xFB)
        assert got["columnwise_data"][5, 2] == 0x7F
    if name == "w8a8_int8_inference":
        rd = got["rowwise_data"].view(np.int8)
        assert rd[2, 5] == 0 and rd[5, 33] == 0  # NaN -> 0
        # rows with an Inf: scale Inf, multiplier 0: finite -> 0, Inf * 0 = NaN -> 0
        assert np.all(rd[3] == 0)
    if name == "nvfp4" and role == "linear:weight":
        rd = got["rowwise_data"]
        assert (rd[2, 2] >> 4) == 0x7 and (rd[5, 16] >> 4) == 0x7  # NaN -> +6 (no NaN in e2m1)


def test_grouped_nvfp4_sr_rht(qforge, tmp_path):
    """Grouped quantize with an empty member: SR indices count across the grouped buffer."""
    recipe = qr.load_recipe(recipe_file("nvfp4"))
    splits = [32, 0, 16, 48]
    m, k = sum(splits), 64
    rng = np.random.default_rng(11)
    x = np.concatenate([make_input(rng, mi, k) if mi else np.zeros((0, k), F32) for mi in splits])
    xin = save_input(tmp_path / "x.npy", x, "bf16")
    args = ["quantize", "--recipe", recipe_file("nvfp4"), "--role", "linear:grad_output",
            "--input", tmp_path / "x.npy", "--out", tmp_path / "out", "--seed", 0xABCDEF0123,
            "--offset", 5, "--splits", ",".join(map(str, splits))]
    rc, _, err = run(qforge, *args)
    assert rc == 0, err
    man, got = load_outputs(tmp_path / "out")
    assert man["splits"] == splits
    exp = qr.quantize(recipe, "linear:grad_output", xin, "bf16", seed=0xABCDEF0123, offset=5, splits=splits)
    compare({kk: v.ravel() for kk, v in got.items()}, {kk: v.ravel() for kk, v in exp.items()}, "grouped nvfp4")
    assert got["rowwise_amax"].size == len(splits) and got["rowwise_amax"][1] == 0


@pytest.mark.parametrize("name,role", [("mxfp8", "linear:input"), ("float8_block_scaling", "linear:input"),
                                       ("int8_weight_sr", "linear:weight"), ("fp8_rowwise", "linear:grad_output")])
def test_grouped_other(qforge, tmp_path, name, role):
    recipe = qr.load_recipe(recipe_file(name))
    splits = [3, 0, 37, 24]
    m, k = sum(splits), 160
    rng = np.random.default_rng(seed_for(name, "grouped"))
    x = make_input(rng, m, k)
    np.save(tmp_path / "x.npy", x)
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file(name), "--role", role, "--input",
                     tmp_path / "x.npy", "--out", tmp_path / "out", "--seed", 99, "--splits",
                     ",".join(map(str, splits)))
    assert rc == 0, err
    _, got = load_outputs(tmp_path / "out")
    exp = qr.quantize(recipe, role, x, "fp32", seed=99, splits=splits)
    compare({kk: v.ravel() for kk, v in got.items()}, {kk: v.ravel() for kk, v in exp.items()}, f"grouped {name}")


def test_fp32_input_rounded_to_dtype(qforge, tmp_path):
    """'<f4' input with --dtype bf16 / fp16 is rounded RNE to that dtype first."""
    recipe = qr.load_recipe(recipe_file("nvfp4"))
    rng = np.random.default_rng(5)
    x = make_input(rng, 32, 64)
    np.save(tmp_path / "x.npy", x)
    for dt in ("bf16", "fp16"):
        out = tmp_path / dt
        rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("nvfp4"), "--role", "linear:input",
                         "--input", tmp_path / "x.npy", "--out", out, "--dtype", dt)
        assert rc == 0, err
        _, got = load_outputs(out)
        compare(got, qr.quantize(recipe, "linear:input", qr.round_to_dtype(x, dt), dt), f"rounded {dt}")
    # fp16 input file, identity output keeps the fp16 bits.
    np.save(tmp_path / "h.npy", x.astype(np.float16))
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("int8_weight_sr"), "--role", "linear:input",
                     "--input", tmp_path / "h.npy", "--out", tmp_path / "h")
    assert rc == 0, err
    man, got = load_outputs(tmp_path / "h")
    assert man["dtype"] == "fp16"
    assert np.array_equal(got["rowwise_data"], x.astype(np.float16).view(np.uint16))
    assert np.array_equal(got["columnwise_data"], x.astype(np.float16).view(np.uint16).T)


def test_delayed_named_scales(qforge, tmp_path):
    recipe = qr.load_recipe(recipe_file("delayed_scaling"))
    x = make_input(np.random.default_rng(3), 32, 64)
    np.save(tmp_path / "x.npy", x)
    base = ["quantize", "--recipe", recipe_file("delayed_scaling"), "--role", "linear:weight",
            "--input", tmp_path / "x.npy", "--out", tmp_path / "o"]
    rc, _, err = run(qforge, *base, "--scale", "1.0", "--scale", "scale=0.375")
    assert rc == 0, err
    _, got = load_outputs(tmp_path / "o")
    compare(got, qr.quantize(recipe, "linear:weight", x, "fp32", scales={"scale": F32(0.375)}), "named scale")
    rc, _, err = run(qforge, *base, "--usage", "inference", "--scale", "rowwise_scale=3")
    assert rc == 0, err
    _, got = load_outputs(tmp_path / "o")
    compare(got, qr.quantize(recipe, "linear:weight", x, "fp32", usage="inference", scales=F32(3)), "inference")
    rc, _, err = run(qforge, *base, "--scale", "bogus=2")
    assert rc == 2 and "--scale" in err and "bogus" in err
    rc, _, err = run(qforge, *base)
    assert rc == 2 and "--scale" in err


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
def test_missing_role(qforge, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 32), F32))
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("mxfp8"), "--input", tmp_path / "x.npy",
                     "--out", tmp_path / "o")
    assert rc == 2 and "--role" in err, err


def test_role_without_rule(qforge, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 32), F32))
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("w8a8_int8_inference"), "--role",
                     "linear:grad_output", "--input", tmp_path / "x.npy", "--out", tmp_path / "o")
    assert rc == 2 and "no rule" in err, err


def _npy_with_header(header, payload, version=1):
    header = header + " " * ((-(len(header) + 11)) % 64) + "\n"
    n = len(header).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + n + header.encode() + payload


def _bad_npy_files(d):
    good = np.arange(64, dtype=F32).reshape(2, 32)
    np.save(d / "good.npy", good)
    raw = (d / "good.npy").read_bytes()
    payload = good.tobytes()
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
    files = {
        "garbage.npy": b"this is not an npy file at all" * 3,
        "empty.npy": b"",
        "magic_only.npy": b"\x93NUMPY\x01\x00",
        "truncated_header.npy": raw[:40],
        "truncated_data.npy": raw[:-7],
        "extra_data.npy": raw + b"\0\0\0\0",
        "huge_header_len.npy": b"\x93NUMPY\x01\x00\xff\xff{",
        "huge_header_len_v2.npy": b"\x93NUMPY\x02\x00\xff\xff\xff\x7f{",
        "bad_version.npy": b"\x93NUMPY\x09\x00" + raw[8:],
        "bad_shape.npy": _npy_with_header(hdr % "(2, x2)", payload),
        "negative_shape.npy": _npy_with_header(hdr % "(-2, 32)", payload),
        "overflow_shape.npy": _npy_with_header(hdr % "(4294967296, 4294967296, 4294967296)", payload),
        "wrong_shape.npy": _npy_with_header(hdr % "(3, 32)", payload),
        "missing_key.npy": _npy_with_header("{'descr': '<f4', 'shape': (2, 32), }", payload),
        "structured.npy": _npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 32), }",
                                           payload),
        "unterminated.npy": _npy_with_header("{'descr': '<f4, 'fortran_order': False", payload),
        "nul_header.npy": _npy_with_header("{'descr': '<f4\0', 'fortran_order': False, 'shape': (2, 32), }",
                                           payload),
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    np.save(d / "fortran.npy", np.asfortranarray(np.arange(64, dtype=F32).reshape(8, 8)))
    np.save(d / "bigendian.npy", good.astype(">f4"))
    np.save(d / "int32.npy", good.astype(np.int32))
    np.save(d / "float64.npy", good.astype(np.float64))
    np.save(d / "one_d.npy", np.zeros(32, F32))
    np.save(d / "three_d.npy", np.zeros((2, 2, 32), F32))
    (d / "v2.npy").write_bytes(_npy_with_header(hdr % "(2, 32)", payload, version=2))
    return sorted(list(files) + ["fortran.npy", "bigendian.npy", "int32.npy", "float64.npy", "one_d.npy",
                                 "three_d.npy"])


def test_bad_npy(qforge, tmp_path):
    names = _bad_npy_files(tmp_path)
    for name in names:
        rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("mxfp8"), "--role", "linear:input",
                         "--input", tmp_path / name, "--out", tmp_path / "o")
        assert rc == 2, f"{name}: exit {rc}: {err}"
        assert name in err, f"{name}: message does not name the file: {err}"
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("mxfp8"), "--role", "linear:input",
                     "--input", tmp_path / "good.npy", "--out", tmp_path / "o")
    assert rc == 0, err
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("mxfp8"), "--role", "linear:input",
                     "--input", tmp_path / "v2.npy", "--out", tmp_path / "o2")
    assert rc == 0, err
    assert np.array_equal(np.load(tmp_path / "o" / "rowwise_data.npy"), np.load(tmp_path / "o2" / "rowwise_data.npy"))


def test_rht_needs_m_multiple_of_16(qforge, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((24, 32), F32))
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("nvfp4"), "--role", "linear:input",
                     "--input", tmp_path / "x.npy", "--out", tmp_path / "o")
    assert rc == 2 and "24" in err and "16" in err and "shape" in err, err
    # grouped: every non-empty member must be a multiple of 16
    np.save(tmp_path / "y.npy", np.ones((32, 32), F32))
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("nvfp4"), "--role", "linear:grad_output",
                     "--input", tmp_path / "y.npy", "--out", tmp_path / "o", "--splits", "8,0,24")
    assert rc == 2 and "(8)" in err and "16" in err and "shape" in err, err


def test_reference_selftest():
    assert qr._selftest()


@pytest.mark.parametrize("extra,needle", [
    (["--splits", "3,4"], "--splits"), (["--splits", "3,-1,30"], "--splits"), (["--splits", "a"], "--splits"),
    (["--splits", " 32"], "--splits"), (["--splits", "32,"], "--splits"), (["--splits", "+32"], "--splits"),
    (["--dtype", "fp16"], "--dtype"), (["--seed", "-3"], "--seed"), (["--usage", "fast"], "--usage"),
    (["--scale", "2"], "--scale"), (["--bogus", "1"], "--bogus"),
])
def test_argument_errors(qforge, tmp_path, extra, needle):
    np.save(tmp_path / "x.npy", np.zeros((32, 64), np.uint16))  # bf16 bit patterns
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("mxfp8"), "--role", "linear:input",
                     "--input", tmp_path / "x.npy", "--out", tmp_path / "o", *extra)
    assert rc == 2 and needle in err, err


# ---------------------------------------------------------------------------------------------
# modes and layouts the shipped recipes do not use (the reference covers them all)
# ---------------------------------------------------------------------------------------------
CUSTOM_RECIPE = {
    "qforge_recipe": 1,
    "name": "custom_modes",
    "roles": [
        {"match": "t:mx_floor_swizzled",
         "rowwise": {"format": "e5m2", "scaling": {"mode": "mx", "block": [1, 32], "rule": "floor"},
                     "scale_layout": "swizzled"},
         "columnwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 1], "rule": "floor"},
                        "layout": "transposed", "scale_layout": "swizzled"}},
        {"match": "t:mx_2d",
         "rowwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 32]}, "scale_layout": "swizzled"},
         "columnwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 32]}, "layout": "same",
                        "scale_layout": "swizzled"}},
        {"match": "t:nvfp4_swizzled_sr",
         "rowwise": {"format": "e2m1", "scaling": {"mode": "nvfp4", "block": [1, 16]}, "rounding": "stochastic",
                     "scale_layout": "swizzled"},
         "columnwise": {"format": "e2m1", "scaling": {"mode": "nvfp4", "block": [16, 1]}, "rounding": "stochastic",
                        "rht": {"sign_mask": "0x1234"}, "layout": "transposed", "scale_layout": "swizzled"}},
        {"match": "t:current_pow2_eps",
         "rowwise": {"format": "e4m3", "scaling": {"mode": "per_tensor_current", "epsilon": 0.5, "pow2": True}},
         "columnwise": {"format": "e5m2", "scaling": {"mode": "per_tensor_current", "epsilon": 0.5, "pow2": True}}},
        {"match": "t:block_misc",
         "rowwise": {"format": "e4m3", "scaling": {"mode": "block", "block": [1, 16], "epsilon": 0.001, "pow2": False}},
         "columnwise": {"format": "e5m2", "scaling": {"mode": "block", "block": [32, 64], "pow2": True},
                        "layout": "same"}},
        {"match": "t:mx_fp6_sr",
         "rowwise": {"format": "e2m3", "scaling": {"mode": "mx", "block": [1, 32], "rule": "floor"},
                     "rounding": "stochastic"},
         "columnwise": {"format": "e3m2", "scaling": {"mode": "mx", "block": [32, 1]}, "rounding": "stochastic",
                        "layout": "transposed"}},
        {"match": "t:int8_same",
         "rowwise": {"format": "int8", "scaling": {"mode": "per_channel"}},
         "columnwise": {"format": "int8", "scaling": {"mode": "per_channel"}, "layout": "same",
                        "rounding": "stochastic"}},
        {"match": "t:fp8_channel_eps_same",
         "rowwise": {"format": "e5m2", "scaling": {"mode": "per_channel", "epsilon": 0.25}},
         "columnwise": {"format": "e4m3", "scaling": {"mode": "per_channel", "pow2": True}, "layout": "same"}},
        {"match": "t:identity_cast",
         "rowwise": {"format": "identity", "dtype": "fp32"},
         "columnwise": {"format": "identity", "dtype": "bf16", "layout": "transposed"}},
        {"match": "t:block_mn_major",
         "rowwise": {"format": "e4m3", "scaling": {"mode": "block", "block": [1, 128]}, "scale_layout": "mn_major"},
         "columnwise": {"format": "e5m2", "scaling": {"mode": "block", "block": [128, 1], "epsilon": 0.01},
                        "layout": "transposed", "scale_layout": "mn_major"}},
        {"match": "t:mx_fp4_delayed_rht",
         "rowwise": {"format": "e2m1", "scaling": {"mode": "mx", "block": [1, 32]}},
         "columnwise": {"format": "e4m3", "scaling": {"mode": "per_tensor_delayed", "margin": 1}, "rht": True}},
    ],
}
CUSTOM_CASES = [(r["match"], d, s) for r in CUSTOM_RECIPE["roles"] for d in ("bf16", "fp16", "fp32")
                for s in ((144, 64), (48, 160))]


@pytest.mark.parametrize("case", CUSTOM_CASES, ids=[f"{r[2:]}-{d}-{s[0]}x{s[1]}" for r, d, s in CUSTOM_CASES])
def test_custom_modes(qforge, tmp_path, case):
    role, dtype, (m, k) = case
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(CUSTOM_RECIPE))
    rng = np.random.default_rng(seed_for(*case))
    x = make_input(rng, m, k)
    if dtype == "fp16":
        x = np.clip(x / (qr.amax_of(x) / F32(1000)), -60000, 60000).astype(F32)
    xin = save_input(tmp_path / "x.npy", x, dtype)
    args = ["quantize", "--recipe", path, "--role", role, "--input", tmp_path / "x.npy", "--out", tmp_path / "o",
            "--seed", 2 ** 64 - 3, "--offset", 2 ** 33 + 1]
    if "delayed" in role:
        args += ["--scale", "0.75"]
    rc, _, err = run(qforge, *args)
    assert rc == 0, err
    _, got = load_outputs(tmp_path / "o")
    exp = qr.quantize(CUSTOM_RECIPE, role, xin, dtype, seed=2 ** 64 - 3, offset=2 ** 33 + 1,
                      scales=F32(0.75) if "delayed" in role else None)
    compare(got, exp, role)


@pytest.mark.parametrize("splits", [None, [150, 0, 61]], ids=["tensor", "grouped"])
def test_mn_major_block_scales(qforge, tmp_path, splits):
    """mn_major grids of 1x128 / 128x1 block scales: [blocks, rows padded to 4] per member, padding
    zero, over more than one block in both directions (compact and mn_major bytes differ)."""
    m, k = 211, 130  # rowwise grid [211, 2] (rows padded to 212), transposed [130, 2] (to 132)
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(CUSTOM_RECIPE))
    x = make_input(np.random.default_rng(seed_for("mn_major", str(splits))), m, k)
    np.save(tmp_path / "x.npy", x)
    args = ["quantize", "--recipe", path, "--role", "t:block_mn_major", "--input", tmp_path / "x.npy", "--out", tmp_path / "o"]
    if splits:
        args += ["--splits", ",".join(map(str, splits))]
    rc, _, err = run(qforge, *args)
    assert rc == 0, err
    _, got = load_outputs(tmp_path / "o")
    exp = qr.quantize(CUSTOM_RECIPE, "t:block_mn_major", x, "fp32", splits=splits)
    if splits:
        got, exp = {kk: v.ravel() for kk, v in got.items()}, {kk: v.ravel() for kk, v in exp.items()}
    else:
        assert got["rowwise_scale_inv"].shape == (2, 212) and got["columnwise_scale_inv"].shape == (2, 132)
        assert np.all(got["rowwise_scale_inv"][:, 211:] == 0) and np.all(got["columnwise_scale_inv"][:, 130:] == 0)
    compare(got, exp, "block_mn_major")


def test_sr_tie_rounds_down(qforge, tmp_path):
    """Stochastic rounding rounds up only when frac > u, u = (r >> 8) * 2^-24 (strictly): with
    per-channel scale 1 (channel amax 127), an element equal to u of its own random word stays
    at 0 and the next fp32 above it becomes 1."""
    recipe = qr.load_recipe(recipe_file("int8_weight_sr"))
    m, k, seed, offset = 8, 64, 0x0123456789ABCDEF, 77
    l = np.arange(m * k, dtype=np.uint64).reshape(m, k)
    u = ((qr.sr_bits(l, seed, offset, 0, "int8") >> np.uint32(8)).astype(np.float64) * 2.0 ** -24).astype(F32)
    x = u.copy()
    x[:, 1::2] = np.nextafter(u[:, 1::2], F32(2))
    x[:, 0] = 127
    x[1::2] *= -1
    np.save(tmp_path / "x.npy", x)
    rc, _, err = run(qforge, "quantize", "--recipe", recipe_file("int8_weight_sr"), "--role", "linear:weight",
                     "--input", tmp_path / "x.npy", "--out", tmp_path / "o", "--usage", "inference",
                     "--seed", seed, "--offset", offset)
    assert rc == 0, err
    _, got = load_outputs(tmp_path / "o")
    compare(got, qr.quantize(recipe, "linear:weight", x, "fp32", usage="inference", seed=seed, offset=offset),
            "sr tie")
    q = got["rowwise_data"].view(np.int8)[:, 1:].astype(int)
    sign = np.where(np.arange(m) % 2, -1, 1)[:, None]
    expect = np.where(np.arange(1, k) % 2 == 1, 1, 0)[None, :] * sign
    expect = np.where(u[:, 1:] == 0, expect, expect)  # u == 0 with x == 0: stays 0 either way
    assert np.array_equal(q, expect)
