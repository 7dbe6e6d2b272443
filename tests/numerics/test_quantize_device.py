"""`qforge quantize --device cuda`: on a machine without a usable GPU it must fail cleanly (exit 2,
the message naming --device); with one, its outputs must equal the CPU reference's bit for bit.

Run:  python3 -m pytest -q tests/numerics/test_quantize_device.py --qforge-bin=<cmake build dir>
"""
import json
import os
import subprocess

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CASES = [
    ("current_scaling.json", "linear:input", []),
    ("mxfp8.json", "linear:input", []),
    ("hybrid_mxfp8_fwd_nvfp4_bwd.json", "linear:input", []),
    ("delayed_scaling.json", "linear:weight", ["--scale", "2.5"]),
    ("mxfp8.json", "linear:input", ["--splits", "32,0,32"]),
    ("fp8_channel_variants", "linear:input", []),
    ("fp8_channel_variants", "linear:input", ["--splits", "40,0,24"]),
]
# Recipes written on the fly: variants the shipped ones do not use.
CUSTOM = {
    # fp8 per channel: e5m2 with an amax floor (rowwise), e4m3 power-of-two scales in the input's
    # layout (columnwise).
    "fp8_channel_variants": {
        "qforge_recipe": 1, "name": "fp8_channel_variants",
        "roles": [{"match": "*:*",
                   "rowwise": {"format": "e5m2", "scaling": {"mode": "per_channel", "epsilon": 0.25}},
                   "columnwise": {"format": "e4m3", "scaling": {"mode": "per_channel", "pow2": True},
                                  "layout": "same"}}],
    },
}


def recipe_path(tmp_path, name):
    if name in CUSTOM:
        path = tmp_path / (name + ".json")
        path.write_text(json.dumps(CUSTOM[name]))
        return path
    return os.path.join(ROOT, "recipes", name)


def run(qforge, *args):
    return subprocess.run([qforge, *map(str, args)], capture_output=True, text=True, timeout=300)


def outputs(out_dir):
    with open(os.path.join(out_dir, "manifest.json")) as f:
        man = json.load(f)
    return man, {b["name"]: np.load(os.path.join(out_dir, b["file"])) for b in man["buffers"]}


def test_bad_device_value(qforge, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.ones((64, 64), np.float32))
    p = run(qforge, "quantize", "--recipe", os.path.join(ROOT, "recipes", "mxfp8.json"), "--role",
            "linear:input", "--input", x, "--out", tmp_path / "o", "--device", "tpu")
    assert p.returncode == 2 and "--device" in p.stderr, p.stderr


@pytest.mark.parametrize("recipe,role,extra", CASES)
def test_device_cuda(qforge, tmp_path, recipe, role, extra):
    rng = np.random.default_rng(7)
    x = tmp_path / "x.npy"
    np.save(x, (rng.standard_normal((64, 128)) * 3).astype(np.float32))
    common = ["quantize", "--recipe", recipe_path(tmp_path, recipe), "--role", role,
              "--input", x, "--dtype", "bf16", *extra]
    gpu = run(qforge, *common, "--out", tmp_path / "gpu", "--device", "cuda")
    if gpu.returncode != 0:
        # No usable GPU here: a clean user error naming the flag, nothing written.
        assert gpu.returncode == 2, gpu.stderr
        assert "--device" in gpu.stderr and "no CUDA device" in gpu.stderr, gpu.stderr
        assert not (tmp_path / "gpu").exists()
        return
    cpu = run(qforge, *common, "--out", tmp_path / "cpu")
    assert cpu.returncode == 0, cpu.stderr
    man_g, out_g = outputs(tmp_path / "gpu")
    man_c, out_c = outputs(tmp_path / "cpu")
    assert man_g["device"] == "cuda" and man_c["device"] == "cpu"
    assert [b for b in man_g["buffers"]] == [b for b in man_c["buffers"]]
    for name, a in out_c.items():
        assert out_g[name].shape == a.shape and out_g[name].dtype == a.dtype, name
        assert np.array_equal(out_g[name].view(np.uint8), a.view(np.uint8)), name
