"""The Python package (python/qforge) over libqforge.so.

Without a GPU: recipes, buffer queries, GEMM specs, ahead-of-time compilation and every error
path. With torch and a CUDA GPU: quantize outputs bit for bit against the CPU reference
(`qforge quantize --device cpu`), grouped calls, and an exact GEMM.

Run:  QFORGE_LIBRARY=BUILD/runtime/libqforge.so QFORGE_BIN=BUILD/tools/qforge \
      python3 -m pytest -q tests/python
"""
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fake_torch
import qforge  # noqa: E402
from qforge import _capi  # noqa: E402

RECIPES = ROOT / "recipes"


def has_gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


gpu = pytest.mark.skipif(not has_gpu(), reason="needs torch with a CUDA GPU")


# ------------------------------------------------------------------------------------------ layout

STRUCTS = {"qf_buffer_info": _capi.BufferInfoC, "qf_named_buffer": _capi.NamedBufferC,
           "qf_quantize_args": _capi.QuantizeArgsC, "qf_history_args": _capi.HistoryArgsC,
           "qf_gemm_spec": _capi.GemmSpecC, "qf_gemm_args": _capi.GemmArgsC,
           "qf_cache_evict_policy": _capi.CacheEvictPolicyC, "qf_cache_evict_result": _capi.CacheEvictResultC}


def test_struct_layouts_match_the_header(tmp_path):
    # Every ctypes struct against the header as a C compiler lays it out: the same fields, in the
    # same order, at the same offsets with the same sizes, and the same struct size.
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None:
        pytest.skip("no C compiler")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "runtime/qforge.h"', "int main(void) {"]
    for cname, py in STRUCTS.items():
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for field, _ in py._fields_:
            lines.append(f'printf("{cname} {field} %zu %zu\\n", offsetof({cname}, {field}), '
                         f'sizeof((({cname}*)0)->{field}));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    subprocess.run([cc, "-std=c11", "-I", str(ROOT), str(src), "-o", str(tmp_path / "layout")], check=True)
    c_layout = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True).stdout.split("\n")
    py_layout = []
    for cname, py in STRUCTS.items():
        py_layout.append(f"{cname} size {ctypes.sizeof(py)}")
        py_layout += [f"{cname} {f} {getattr(py, f).offset} {getattr(py, f).size}" for f, _ in py._fields_]
    assert c_layout[:-1] == py_layout
    # Every field of the C structs is declared (a field added to the header without one here).
    header = (ROOT / "runtime" / "qforge.h").read_text()
    for cname, py in STRUCTS.items():
        body = header.split(f"typedef struct {cname} {{")[1].split(f"}} {cname};")[0]
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        declared = re.findall(r"([A-Za-z_][A-Za-z_0-9]*)\s*(?:\[\d+\])?\s*[;,]", body)
        assert declared == [f for f, _ in py._fields_], cname
    for name in _capi.SIGNATURES:
        assert f"{name}(" in header, name


def test_library_exports_the_c_api_only():
    lib = qforge.library()
    for name in _capi.SIGNATURES:
        assert hasattr(lib, name)
    with pytest.raises(AttributeError):
        lib._ZN2qf11load_recipeERKNSt10filesystem7__cxx114pathE  # C++ internals stay hidden


def test_versions_agree():
    """The package, its pyproject.toml, the library it loaded and the CMake project are one version."""
    root = Path(__file__).resolve().parents[2]
    project = re.search(r"project\(qforge VERSION ([0-9.]+)", (root / "CMakeLists.txt").read_text()).group(1)
    pyproject = re.search(r'^version = "([0-9.]+)"', (root / "python" / "pyproject.toml").read_text(), re.M).group(1)
    assert qforge.__version__ == pyproject == project == qforge.library_version()
    major, minor = project.split(".")[:2]
    assert _capi.SONAME == f"libqforge.so.{major}.{minor}"
    assert Path(qforge.library()._name).resolve().name.startswith(_capi.SONAME)


def test_a_library_of_another_minor_version_is_skipped(monkeypatch):
    assert _capi.compatible(_capi.PACKAGE_VERSION)
    assert _capi.compatible(".".join(_capi.PACKAGE_VERSION.split(".")[:2] + ["99"]))
    monkeypatch.setattr(_capi, "PACKAGE_VERSION", "0.99.0")
    monkeypatch.setenv("QFORGE_LIBRARY", qforge.library()._name)
    with pytest.raises(OSError, match=r"version [0-9.]+, this package is 0\.99\.0 \(needs the same major\.minor\)"):
        _capi.load()


def test_missing_library_names_every_place_tried(monkeypatch):
    monkeypatch.setenv("QFORGE_LIBRARY", "/nonexistent/libqforge.so")
    with pytest.raises(OSError, match="QFORGE_LIBRARY.*nonexistent"):
        _capi.load()


# ---------------------------------------------------------------------------------------- recipes

def test_context_reads_recipes():
    with qforge.Context([RECIPES / "mxfp8_hopper.json", str(RECIPES / "nvfp4.json")]) as ctx:
        assert ctx.recipes == ["mxfp8_hopper", "nvfp4"]
        assert ctx.num_gemms("mxfp8_hopper") == 8
    with pytest.raises(ValueError, match="closed"):
        ctx.recipes


def test_recipe_errors_name_the_file_or_json_path(tmp_path):
    with pytest.raises(qforge.UserError, match=r"nope\.json: no such recipe file"):
        qforge.Context(tmp_path / "nope.json")
    bad = {"qforge_recipe": 1, "name": "x", "roles": [{"match": "*:*", "rowwise": {"format": "e9m9"}}]}
    with pytest.raises(qforge.UserError, match=r"/roles/0/rowwise/format: unknown format \"e9m9\"") as e:
        qforge.Context.from_json(json.dumps(bad))
    assert e.value.status == _capi.QF_ERR_USER


def test_quantizer_outputs_describe_every_buffer():
    ctx = qforge.Context(RECIPES / "mxfp8_hopper.json")
    q = ctx.quantizer("linear:input")
    out = {b.name: b for b in q.outputs(256, 512)}
    assert list(out) == ["rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"]
    assert out["rowwise_data"] == qforge.BufferInfo("rowwise_data", "e4m3", "data", 1, 0, False, (256, 512),
                                                    256 * 512, None)
    # mn_major e8m0 grids: [blocks, rows padded to 4]
    assert out["rowwise_scale_inv"].shape == (16, 256) and out["rowwise_scale_inv"].scale_layout == "mn_major"
    assert out["columnwise_data"].shape == (512, 256)
    assert out["columnwise_scale_inv"].shape == (8, 512) and out["columnwise_scale_inv"].kind == "scale_inv"
    assert q.inputs() == [] and q.workspace_bytes(256, 512) == 0
    inference = ctx.quantizer("linear:input", usage="inference")
    assert [b.name for b in inference.outputs(256, 512)] == ["rowwise_data", "rowwise_scale_inv"]


def test_inputs_and_grouped_outputs():
    delayed = qforge.Context(RECIPES / "delayed_scaling.json").quantizer("linear:input", dtype="fp32")
    (scale,) = delayed.inputs()
    assert (scale.name, scale.kind, scale.shape, scale.stream) == ("scale", "scale", (1,), -1)
    grouped = qforge.Context(RECIPES / "mxfp8.json").quantizer("grouped_linear:input", grouped=True)
    flat = grouped.grouped_outputs(1000, 256, 3)
    assert [b.name for b in flat][0] == "rowwise_data" and all(len(b.shape) == 1 for b in flat)
    assert flat[0].bytes == 1000 * 256


def test_quantizer_errors_name_the_argument():
    hybrid = qforge.Context(RECIPES / "hybrid_mxfp8_fwd_nvfp4_bwd.json")
    with pytest.raises(qforge.UserError, match="linear:bias"):
        hybrid.quantizer("linear:bias")
    with pytest.raises(qforge.UserError, match=r"dtype: expected one of \['bf16', 'fp16', 'fp32'\], got 'fp64'"):
        hybrid.quantizer("linear:input", dtype="fp64")
    with pytest.raises(qforge.UserError, match="usage"):
        hybrid.quantizer("linear:input", usage="serving")
    q = hybrid.quantizer("linear:input")
    with pytest.raises(qforge.UserError, match=r"null pointer; expected a device buffer of 262144 bytes"):
        q.quantize_raw(0, 256, 512, {})
    with pytest.raises(qforge.UserError, match="num_members"):
        q.workspace_bytes(256, 512, members=0)


def test_strings_paths_and_integers_are_checked_before_the_c_api(tmp_path):
    # C strings end at a NUL: a name or text holding one is refused, not cut short.
    recipe = RECIPES / "mxfp8.json"
    with pytest.raises(qforge.UserError, match="text: a NUL character"):
        qforge.Context.from_json(recipe.read_text() + "\0 trailing garbage {{{")
    with pytest.raises(qforge.UserError, match="text: expected a string, got b"):
        qforge.Context.from_json(recipe.read_bytes())
    ctx = qforge.Context(os.fsencode(recipe))  # a bytes path is one path
    assert ctx.recipes == ["mxfp8"]
    with pytest.raises(qforge.UserError, match=r"recipes\[0\]: a NUL character"):
        qforge.Context(str(recipe) + "\0x")
    with pytest.raises(qforge.UserError, match=r"recipes\[1\]: expected a path, got 3"):
        qforge.Context([recipe, 3])
    with pytest.raises(qforge.UserError, match="role: a NUL character"):
        ctx.quantizer("linear:input\0x")
    with pytest.raises(qforge.UserError, match="recipe: expected a string, got 7"):
        ctx.quantizer("linear:input", recipe=7)
    with pytest.raises(qforge.UserError, match="scale_layout: expected a string"):
        qforge.Gemm("mxfp8", 256, 512, scale_layout=1)
    # The raw forms' addresses and byte counts fit their C types or are refused by name.
    q = ctx.quantizer("linear:input")
    with pytest.raises(qforge.UserError, match=r"buffers\['rowwise_data'\] bytes: 18446744073709551872 does not fit"):
        q.quantize_raw(1 << 40, 256, 512, {"rowwise_data": (2 << 40, (1 << 64) + 256)})
    with pytest.raises(qforge.UserError, match="input_ptr: -1 does not fit the C API's uint64"):
        q.quantize_raw(-1, 256, 512, {})
    with pytest.raises(qforge.UserError, match="stream: expected an integer"):
        q.quantize_raw(1 << 40, 256, 512, {}, stream=None)


def test_amax_history_queries_and_checks():
    q = qforge.Context(RECIPES / "delayed_scaling.json").quantizer("linear:input")
    assert q.history_length() == q.history_length("scale") == 1024
    with pytest.raises(qforge.UserError, match=r'scale_name: no scale input "rowwise_scale"; expected "scale"'):
        q.history_length("rowwise_scale")
    # Sizes are checked before anything is launched (the addresses are never used).
    with pytest.raises(qforge.UserError, match="history.*4096"):
        q.update_amax_history_raw((1 << 30, 4092), (2 << 30, 4), (3 << 30, 4))
    mx = qforge.Context(RECIPES / "mxfp8.json").quantizer("linear:input")
    with pytest.raises(qforge.UserError, match="has no delayed-scaling stream"):
        mx.history_length()


def test_prepare_compiles_without_a_gpu(tmp_path):
    # In a fresh process: the kernel cache reads QFORGE_CACHE_DIR once per process.
    code = ("import qforge; q = qforge.Context(%r).quantizer('linear:input', usage='inference'); "
            "q.prepare('sm_90a')" % str(RECIPES / "delayed_scaling.json"))
    env = dict(os.environ, QFORGE_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT / "python"))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()], "the kernel went into the cache"
    q = qforge.Context(RECIPES / "delayed_scaling.json").quantizer("linear:input")
    with pytest.raises(qforge.UserError, match="sm_12"):
        q.prepare("sm_12")


def test_evict_cache_trims_the_kernel_cache(tmp_path):
    # In a fresh process with a cache of its own (QFORGE_CACHE_DIR is read once per process): two
    # recipes' kernels compiled (each plan's program for any tiles and for interior tiles), then a
    # dry run, the stale rule (nothing: this build's entries) and a size of 1 byte (every entry goes).
    code = ("import json, qforge\n"
            "for r in %r:\n"
            "    qforge.Context(r).quantizer('linear:input', usage='inference').prepare('sm_90a')\n"
            "print(json.dumps([qforge.evict_cache(max_bytes=1, dry_run=True), qforge.evict_cache(stale=True),\n"
            "                  qforge.evict_cache(max_bytes=1), qforge.evict_cache(unused_for=3600)]))\n"
            % [str(RECIPES / "mxfp8.json"), str(RECIPES / "float8_block_scaling.json")])
    cache = tmp_path / "cache"
    env = dict(os.environ, QFORGE_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT / "python"))
    out = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True).stdout
    dry, stale, fit, unused = json.loads(out.strip().splitlines()[-1])
    assert dry["removed"] == 4 and dry["kept"] == 0 and dry["removed_bytes"] > 0, dry
    assert stale == {"removed": 0, "kept": 4, "removed_bytes": 0, "kept_bytes": dry["removed_bytes"]}, stale
    assert fit == dry, fit
    assert unused == {"removed": 0, "kept": 0, "removed_bytes": 0, "kept_bytes": 0}, unused
    assert not [p for p in (cache / "qforge-v1").rglob("image.bin")], "an entry was left"
    for kwargs, match in (({}, "no rule set"), ({"unused_for": 0}, "unused_for"), ({"max_bytes": -1}, "max_bytes"),
                          ({"max_bytes": 1.5}, "max_bytes"), ({"stale": 1}, "stale"),
                          ({"stale": True, "dry_run": "yes"}, "dry_run")):
        with pytest.raises(qforge.UserError, match=match):
            qforge.evict_cache(**kwargs)


@pytest.mark.skipif(has_gpu() or os.path.exists("/dev/nvidia0"), reason="checks the no-GPU path")
def test_quantize_without_a_gpu_is_a_cuda_error():
    q = qforge.Context(RECIPES / "mxfp8.json").quantizer("linear:input")
    # Distinct, never dereferenced addresses: the driver is missing.
    buffers, at = {}, 1 << 30
    for b in q.outputs(64, 64):
        buffers[b.name] = (at, b.bytes)
        at += 1 << 20
    with pytest.raises(qforge.CudaError, match="libcuda"):
        q.quantize_raw(1 << 20, 64, 64, buffers)


# ------------------------------------------------------------------------------------------- GEMMs

def test_gemm_specs():
    g = qforge.Gemm("blockwise", n=4096, k=7168)
    assert g.describe() == "e4m3 x e4m3 blockwise N=4096 K=7168 -> bf16"
    a, b = g.scale_bytes(4096, 8)
    assert a == 4096 * 56 * 4 and b == 8 * 32 * 56 * 4
    assert g.workspace_bytes() == 0
    mx = qforge.Context(RECIPES / "mxfp8_hopper.json").gemm(0)
    assert "mxfp8 (mn_major scales)" in repr(mx)
    with pytest.raises(qforge.UserError, match=r"spec->n: expected a multiple of 8"):
        qforge.Gemm("blockwise", n=100, k=128)
    with pytest.raises(qforge.UserError, match="scaling"):
        qforge.Gemm("sparkly", n=128, k=128)
    with pytest.raises(qforge.UserError, match="index 99 out of range"):
        qforge.Context(RECIPES / "mxfp8_hopper.json").gemm(99)


def test_gemm_dequant_route():
    g = qforge.Gemm("nvfp4", n=256, k=512, route="dequant")
    assert g.describe() == "e2m1 x e2m1 nvfp4 (dequant route) N=256 K=512 -> bf16"
    # fp16 copies of A [1000, 512] and B [4, 256, 512], then NVFP4's per-group alpha: 256-byte aligned parts.
    assert g.workspace_bytes(1000, 4) == 1000 * 512 * 2 + 4 * 256 * 512 * 2 + 256
    with pytest.raises(qforge.UserError, match="workspace_bytes: the dequant route's workspace holds the call's"):
        g.workspace_bytes()
    with pytest.raises(qforge.UserError, match="give extent and num_groups together"):
        g.workspace_bytes(1000)
    assert qforge.Gemm("blockwise", n=256, k=512).workspace_bytes(1000, 4) == 0
    with pytest.raises(qforge.UserError, match=r'spec->route: expected fused, dequant or auto, got "fast"'):
        qforge.Gemm("mxfp8", n=256, k=512, route="fast")
    with pytest.raises(qforge.UserError, match=r"spec->route: dequant: expected mxfp8 or nvfp4 scaling"):
        qforge.Gemm("blockwise", n=256, k=512, route="dequant")
    ctx = qforge.Context.from_json(json.dumps({
        "qforge_recipe": 1, "name": "r", "roles": [{"match": "*:*", "rowwise": {"format": "e4m3", "scaling": "mx"}}],
        "gemms": [{"scaling": "mxfp8", "n": 256, "k": 512, "route": "dequant", "tile": {"block_n": 256}}]}))
    assert "mxfp8 (dequant route)" in ctx.gemm(0).describe()


def test_gemm_auto_route():
    # Per call: the fused kernel with few tokens per expert, the dequant route (and its workspace) with many.
    g = qforge.Gemm("mxfp8", n=4096, k=7168, route="auto")
    assert g.describe() == "e4m3 x e4m3 mxfp8 (auto route) N=4096 K=7168 -> bf16"
    assert g.route_for(8 * 256, 8) == "fused"
    assert g.workspace_bytes(8 * 256, 8) == 0
    assert g.route_for(8 * 4096, 8) == "dequant"
    assert g.workspace_bytes(8 * 4096, 8) == 2 * (8 * 4096 * 7168 * 2)  # bf16 copies of A and B
    with pytest.raises(qforge.UserError, match="workspace_bytes: the auto route's workspace holds the call's"):
        g.workspace_bytes()
    with pytest.raises(qforge.UserError, match=r"num_groups: expected 1\.\.1048576, got 0"):
        g.route_for(1, 0)
    assert qforge.Gemm("tensor", n=4096, k=7168, route="auto").route_for(8 * 4096, 8) == "fused"
    ctx = qforge.Context.from_json(json.dumps({
        "qforge_recipe": 1, "name": "r", "roles": [{"match": "*:*", "rowwise": {"format": "e4m3", "scaling": "mx"}}],
        "gemms": [{"scaling": "mxfp8", "layout": "k_grouped", "m": 4096, "n": 7168, "route": "auto"},
                  {"scaling": "nvfp4", "layout": "k_grouped_members", "m": 4096, "n": 7168, "route": "auto"},
                  {"scaling": "nvfp4", "layout": "k_grouped_members", "m": 256, "n": 256, "route": "auto"}]}))
    assert ctx.gemm(0).route_for(8 * 1024, 8) == "dequant"
    assert ctx.gemm(1).route_for(8 * 1024, 8) == "dequant"  # per-member copies have the route too
    assert ctx.gemm(2).route_for(8 * 1024, 8) == "fused"  # h(256, 256) = 128
    # The same spec without a recipe: layout and m (k=0).
    g = qforge.Gemm("nvfp4", n=7168, k=0, layout="k_grouped_members", m=4096, route="auto")
    assert g.describe() == "e2m1 x e2m1 nvfp4 (auto route) k-grouped (members) M=4096 N=7168 -> bf16"
    assert g.route_for(8 * 1024, 8) == "dequant"
    with pytest.raises(qforge.UserError, match=r'spec->layout: expected m_grouped, k_grouped or k_grouped_members, got "wgrad"'):
        qforge.Gemm("nvfp4", n=7168, k=0, layout="wgrad", m=4096)
    with pytest.raises(qforge.UserError, match=r"spec->m: m-grouped: rows are per group at run time"):
        qforge.Gemm("nvfp4", n=7168, k=512, m=4096)


# -------------------------------------------------------------------------------------------- GPU

def qforge_bin():
    path = os.environ.get("QFORGE_BIN")
    if not path:
        found = sorted(ROOT.glob("build*/tools/qforge"))
        path = str(found[0]) if found else ""
    if not path or not os.path.exists(path):
        pytest.skip("QFORGE_BIN (the qforge CLI) not found")
    return path


def cpu_reference(tmp_path, recipe, role, x_bits, usage=None, splits=None, seed=0, offset=0):
    """The CLI's CPU outputs for the bf16 bit patterns x_bits: {buffer name: bytes}."""
    np.save(tmp_path / "x.npy", x_bits)
    cmd = [qforge_bin(), "quantize", "--recipe", str(RECIPES / recipe), "--role", role, "--input",
           str(tmp_path / "x.npy"), "--out", str(tmp_path / "ref"), "--dtype", "bf16", "--device", "cpu",
           "--seed", str(seed), "--offset", str(offset)]
    if usage:
        cmd += ["--usage", usage]
    if splits:
        cmd += ["--splits", ",".join(map(str, splits))]
    subprocess.run(cmd, check=True, capture_output=True)
    manifest = json.loads((tmp_path / "ref" / "manifest.json").read_text())
    return {b["name"]: np.load(tmp_path / "ref" / b["file"]).tobytes() for b in manifest["buffers"]}


def random_bf16(torch, m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 4).to(torch.bfloat16)
    return x, x.view(torch.int16).numpy().view(np.uint16)


@gpu
@pytest.mark.parametrize("recipe,role,usage", [
    ("mxfp8_hopper.json", "linear:input", None),
    ("float8_block_scaling.json", "linear:input", None),
    ("hybrid_mxfp8_fwd_nvfp4_bwd.json", "linear:input", None),
    ("nvfp4.json", "linear:grad_output", None),
    ("mxfp8.json", "linear:weight", "inference"),
])
def test_quantize_matches_the_cpu_reference(tmp_path, recipe, role, usage):
    import torch
    x, bits = random_bf16(torch, 256, 384, 1)
    q = qforge.Context(RECIPES / recipe).quantizer(role, usage=usage)
    out = q.quantize(x.cuda(), seed=7, offset=3)
    torch.cuda.synchronize()
    ref = cpu_reference(tmp_path, recipe, role, bits, usage, seed=7, offset=3)
    for name, t in out.items():
        if name in ref:
            assert t.contiguous().view(torch.uint8).cpu().numpy().tobytes() == ref[name], name
    assert set(ref) <= set(out)


@gpu
def test_grouped_quantize_matches_the_cpu_reference(tmp_path):
    import torch
    splits = [96, 0, 160]
    x, bits = random_bf16(torch, sum(splits), 256, 2)
    q = qforge.Context(RECIPES / "mxfp8_hopper.json").quantizer("grouped_linear:input", grouped=True)
    offsets = torch.tensor(np.cumsum([0] + splits), dtype=torch.int64, device="cuda")
    out = q.quantize(x.cuda(), member_rows=offsets)
    torch.cuda.synchronize()
    ref = cpu_reference(tmp_path, "mxfp8_hopper.json", "grouped_linear:input", bits, splits=splits)
    for name, data in ref.items():
        got = out[name].view(torch.uint8).cpu().numpy().tobytes()
        assert got[:len(data)] == data, name


@gpu
def test_outputs_are_allocated_in_their_element_types():
    import torch
    q = qforge.Context(RECIPES / "float8_block_scaling.json").quantizer("linear:input")
    out = q.quantize(torch.ones(256, 384, dtype=torch.bfloat16, device="cuda"))
    torch.cuda.synchronize()
    assert out["rowwise_data"].dtype == torch.float8_e4m3fn and out["rowwise_data"].shape == (256, 384)
    assert out["rowwise_scale_inv"].dtype == torch.float32 and out["rowwise_scale_inv"].shape == (256, 3)
    # all ones: each 1x128 block's scale is a power of two with 1 * scale <= 448, so 1 / 256
    assert torch.all(out["rowwise_scale_inv"] == 1 / 256)
    nvfp4 = qforge.Context(RECIPES / "nvfp4.json").quantizer("linear:input")
    packed = nvfp4.quantize(torch.ones(64, 128, dtype=torch.bfloat16, device="cuda"))["rowwise_data"]
    assert packed.dtype == torch.uint8 and packed.shape == (64, 64)  # e2m1x2: two per byte


@gpu
def test_delayed_scaling_step():
    # quantize -> roll the history with the amax output -> the next scale, as the CPU reference's
    # rule (margin 0, max of the history): scale = e5m2 max / amax.
    import torch
    q = qforge.Context(RECIPES / "delayed_scaling.json").quantizer("linear:grad_output", dtype="fp32")
    x = torch.tensor([[-3.5, 1.0], [0.25, 2.0]], device="cuda").repeat(32, 64)
    scale = torch.ones(1, device="cuda")
    history = torch.zeros(q.history_length(), device="cuda")
    scale_inv = torch.empty(1, device="cuda")
    out = q.quantize(x, inputs={"scale": scale})
    q.update_amax_history(history, out["amax"], scale, scale_inv=scale_inv)
    torch.cuda.synchronize()
    assert history[0].item() == 3.5 and torch.count_nonzero(history).item() == 1
    want = torch.tensor([57344.0]) / torch.tensor([3.5])
    assert torch.equal(scale.cpu(), want) and torch.equal(scale_inv.cpu(), 1 / want)


# ------------------------------------------------------------- torch paths without torch or a GPU

no_gpu = pytest.mark.skipif(has_gpu() or os.path.exists("/dev/nvidia0"),
                            reason="fake device addresses: only where nothing can launch")


@pytest.fixture
def fake_torch(monkeypatch):
    """tests/python/fake_torch.py as `torch`: the package's torch paths run up to the C API."""
    import fake_torch as ft
    monkeypatch.setitem(sys.modules, "torch", ft)
    ft.allocations.clear()
    return ft


@no_gpu
@pytest.mark.parametrize("recipe,role,grouped", [
    ("mxfp8_hopper.json", "linear:input", False),
    ("float8_block_scaling.json", "linear:weight", False),
    ("nvfp4.json", "linear:grad_output", False),
    ("hybrid_mxfp8_fwd_nvfp4_bwd.json", "grouped_linear:input", True),
    ("fp8_rowwise.json", "linear:input", False),
])
def test_quantize_buffers_pass_the_c_checks(fake_torch, recipe, role, grouped):
    # Everything the package allocates and passes is what the C API's checks ask for (names, sizes,
    # alignment, no overlap): the call gets as far as the launch, which fails for want of a driver.
    torch = fake_torch
    q = qforge.Context(RECIPES / recipe).quantizer(role, grouped=grouped)
    x = torch.empty((192, 256), dtype=torch.bfloat16)
    rows = torch.empty(4, dtype=torch.int64) if grouped else None
    with pytest.raises(qforge.CudaError, match="libcuda"):
        q.quantize(x, member_rows=rows, stream=7)
    made = [a for a in torch.allocations if a[0] not in (x.data_ptr(), getattr(rows, "data_ptr", lambda: 0)())]
    assert made and all(stream == 7 for _, _, stream in made), "allocated under the call's stream"
    # ... and every tensor the launch uses is recorded on it (not torch's current stream).
    recorded = {address for address, stream in torch.recorded if stream == 7}
    assert x.data_ptr() in recorded and all(address in recorded for address, _, _ in made)
    # A buffer of the wrong size is refused by name before any launch, as is a misspelt one.
    with pytest.raises(qforge.UserError, match="rowwise_data"):
        q.quantize(x, member_rows=rows, out={"rowwise_data": torch.empty(16, dtype=torch.uint8)})
    with pytest.raises(qforge.UserError, match="out: no output named 'rowwise_dat'; expected"):
        q.quantize(x, member_rows=rows, out={"rowwise_dat": torch.empty(16, dtype=torch.uint8)})
    torch.recorded.clear()
    with pytest.raises(qforge.CudaError):
        q.quantize(x, member_rows=rows)  # torch's current stream: nothing to record
    assert not torch.recorded


@no_gpu
def test_delayed_scaling_step_passes_the_c_checks(fake_torch):
    torch = fake_torch
    q = qforge.Context(RECIPES / "delayed_scaling.json").quantizer("linear:input")
    scale = torch.empty(1)
    with pytest.raises(qforge.CudaError, match="libcuda"):
        q.quantize(torch.empty((64, 64), dtype=torch.bfloat16), inputs={"scale": scale})
    with pytest.raises(qforge.UserError, match="scale"):
        q.quantize(torch.empty((64, 64), dtype=torch.bfloat16))  # the scale input is missing
    with pytest.raises(qforge.CudaError, match="libcuda"):
        q.update_amax_history(torch.empty(1024), torch.empty(1), scale, scale_inv=torch.empty(1))
    with pytest.raises(qforge.UserError, match="history"):
        q.update_amax_history(torch.empty(1000), torch.empty(1), scale)
    with pytest.raises(qforge.UserError, match="scale_inv.*overlaps.*scale"):
        q.update_amax_history(torch.empty(1024), torch.empty(1), scale, scale_inv=scale)
    with pytest.raises(qforge.UserError, match="amax: expected a CUDA tensor, got None"):
        q.update_amax_history(torch.empty(1024), None, scale)
    with pytest.raises(qforge.UserError, match=r"inputs\['scale'\]: expected a float32 tensor, got torch.int64"):
        q.quantize(torch.empty((64, 64), dtype=torch.bfloat16), inputs={"scale": torch.empty(1, dtype=torch.int64)})
    # An output's name among the inputs would replace the output the kernels write.
    with pytest.raises(qforge.UserError, match=r"inputs: no input named 'amax'; expected \['scale'\]"):
        q.quantize(torch.empty((64, 64), dtype=torch.bfloat16), inputs={"scale": scale, "amax": torch.empty(1)})


@no_gpu
def test_gemm_run_passes_the_c_checks(fake_torch):
    torch = fake_torch
    gemm = qforge.Gemm("tensor", n=128, k=256)
    a_bytes, b_bytes = gemm.scale_bytes(256, 2)
    a = torch.empty((256, 256), dtype=torch.float8_e4m3fn)
    b = torch.empty((2, 128, 256), dtype=torch.float8_e4m3fn)
    d = torch.empty((256, 128), dtype=torch.bfloat16)
    offsets = torch.empty(3, dtype=torch.int64)
    sa, sb = torch.empty(a_bytes // 4), torch.empty(b_bytes // 4)
    with pytest.raises(qforge.CudaError, match="libcuda"):
        gemm.run(a, b, d, a_scale=sa, b_scale=sb, group_offsets=offsets)
    with pytest.raises(qforge.UserError, match=r"\bd\b"):
        gemm.run(a, b, torch.empty((255, 128), dtype=torch.bfloat16), a_scale=sa, b_scale=sb, group_offsets=offsets)
    # Arrays the C API reads by num_groups alone.
    with pytest.raises(qforge.UserError, match="group_offsets: expected 3 elements for 2 groups, got 2"):
        gemm.run(a, b, d, a_scale=sa, b_scale=sb, group_offsets=torch.empty(2, dtype=torch.int64), num_groups=2)
    with pytest.raises(qforge.UserError, match="alpha: expected 2 elements for 2 groups, got 1"):
        gemm.run(a, b, d, a_scale=sa, b_scale=sb, group_offsets=offsets, alpha=torch.empty(1))
    with pytest.raises(qforge.UserError, match="d: expected a CUDA tensor, got None"):
        gemm.run(a, b, None, a_scale=sa, b_scale=sb, group_offsets=offsets)


class FakeDriver:
    """libcuda's context calls, recorded; `current` is the context cuCtxGetCurrent reports."""

    def __init__(self, current):
        self.current, self.calls = current, []

    def cuCtxGetCurrent(self, pctx):
        pctx._obj.value = self.current
        return 0

    def cuInit(self, flags):
        return 0

    def cuDeviceGet(self, pdev, ordinal):
        pdev._obj.value = ordinal
        self.calls.append(("get", ordinal))
        return 0

    def cuDevicePrimaryCtxRetain(self, pctx, dev):
        pctx._obj.value = 0x1000 + dev.value
        self.calls.append(("retain", dev.value))
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.calls.append(("set", ctx.value))
        return 0


def test_a_thread_without_a_context_gets_the_primary_one(fake_torch, monkeypatch):
    # The C API launches in the current context; a thread that made no CUDA runtime call has none.
    dev = fake_torch.device("cuda")
    dev.index = 3
    idle = FakeDriver(current=None)
    monkeypatch.setattr(qforge, "_cuda_driver", [idle])
    qforge._current_context(fake_torch, dev)
    assert idle.calls == [("get", 3), ("retain", 3), ("set", 0x1003)]
    busy = FakeDriver(current=0x42)
    monkeypatch.setattr(qforge, "_cuda_driver", [busy])
    qforge._current_context(fake_torch, dev)
    assert busy.calls == []
    monkeypatch.setattr(qforge, "_cuda_driver", [None])  # no libcuda: left to the C API's error
    qforge._current_context(fake_torch, dev)


def test_small_arrays_are_checked_for_their_dtype(fake_torch):
    # The C API takes their addresses only; a wrong dtype would be read as garbage.
    torch = fake_torch
    q = qforge.Context(RECIPES / "delayed_scaling.json").quantizer("linear:input")
    with pytest.raises(qforge.UserError, match="history: expected a float32 tensor, got torch.float16"):
        q.update_amax_history(torch.zeros(1024, dtype=torch.float16), torch.zeros(1), torch.zeros(1))
    g = qforge.Context(RECIPES / "mxfp8.json").quantizer("grouped_linear:input", grouped=True)
    with pytest.raises(qforge.UserError, match="member_rows: expected a int64 tensor, got torch.int32"):
        g.quantize(torch.zeros(64, 64, dtype=torch.bfloat16), member_rows=torch.zeros(3, dtype=torch.int32))
    gemm = qforge.Gemm("tensor", n=128, k=128)
    a = torch.zeros(128, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(qforge.UserError, match="group_offsets: expected a int64 tensor, got torch.int32"):
        gemm.run(a, a, a, group_offsets=torch.zeros(3, dtype=torch.int32))


@gpu
def test_quantize_from_a_fresh_thread():
    # A thread that made no CUDA runtime call has no current context until the package sets one.
    import threading
    import torch
    q = qforge.Context(RECIPES / "mxfp8.json").quantizer("linear:input")
    x = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
    want = q.quantize(x)
    torch.cuda.synchronize()
    got, errors = {}, []

    def run():
        try:
            got.update(q.quantize(x))
            torch.cuda.synchronize()
        except Exception as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors
    for name, w in want.items():
        assert torch.equal(got[name].view(torch.uint8), w.view(torch.uint8)), name


@gpu
def test_errors_on_tensors_name_the_argument():
    import torch
    q = qforge.Context(RECIPES / "mxfp8.json").quantizer("linear:input")
    with pytest.raises(qforge.UserError, match=r"x: expected a 2-D bf16 CUDA tensor, got torch.float32"):
        q.quantize(torch.zeros(64, 64, device="cuda"))
    with pytest.raises(qforge.UserError, match="x: expected a CUDA tensor"):
        q.quantize(torch.zeros(64, 64, dtype=torch.bfloat16))
    with pytest.raises(qforge.UserError, match="member_rows"):
        q.quantize(torch.zeros(64, 64, dtype=torch.bfloat16, device="cuda"),
                   member_rows=torch.zeros(2, dtype=torch.int64, device="cuda"))


def _torch_on_sm90():
    """torch, where the GPU runs the grouped GEMM kernels (sm_90a); else the test skips."""
    import torch
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped GEMM kernels are sm_90a")
    return torch


@gpu
def test_tensor_scaled_gemm_is_exact_on_small_integers():
    # Per-tensor fp8 with unit scales on small integers: every product and sum is exact in fp32, and
    # |D| <= 128 * 2 * 1 = 256 is an integer bf16 holds exactly, so D must equal the integer product.
    torch = _torch_on_sm90()
    groups, rows, n, k = 2, 128, 128, 128
    g = torch.Generator().manual_seed(3)
    a_int = torch.randint(-2, 3, (groups * rows, k), generator=g).float()
    b_int = torch.randint(-1, 2, (groups, n, k), generator=g).float()
    a = a_int.to(torch.float8_e4m3fn).cuda()
    b = b_int.to(torch.float8_e4m3fn).cuda()
    d = torch.empty(groups * rows, n, dtype=torch.bfloat16, device="cuda")
    gemm = qforge.Gemm("tensor", n=n, k=k)
    a_bytes, b_bytes = gemm.scale_bytes(groups * rows, groups)
    ones = lambda nbytes: torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")  # noqa: E731
    offsets = torch.tensor([0, rows, 2 * rows], dtype=torch.int64, device="cuda")
    gemm.run(a, b, d, a_scale=ones(a_bytes), b_scale=ones(b_bytes), group_offsets=offsets)
    torch.cuda.synchronize()
    want = torch.cat([a_int[i * rows:(i + 1) * rows] @ b_int[i].T for i in range(groups)])
    assert torch.equal(d.float().cpu(), want)


@gpu
@pytest.mark.parametrize("route", ["fused", "dequant", "auto"])
def test_mxfp8_gemm_routes_are_exact_on_small_integers(route):
    # MXFP8 with e8m0 scales 2^0 and 2^1 per 32 of K on small integers: every product and sum is
    # exact in fp32, so both routes (the dequant one allocating its workspace on the stream) give the
    # integer product.
    torch = _torch_on_sm90()
    groups, rows, n, k = 2, 96, 128, 256
    g = torch.Generator().manual_seed(5)
    a_int = torch.randint(-2, 3, (groups * rows, k), generator=g).float()
    b_int = torch.randint(-1, 2, (groups, n, k), generator=g).float()
    a_exp = torch.randint(127, 129, (groups * rows, k // 32), generator=g)
    b_exp = torch.randint(127, 129, (groups, n, k // 32), generator=g)
    gemm = qforge.Gemm("mxfp8", n=n, k=k, route=route, out_dtype="fp32")  # |D| up to 2048: fp32 holds it
    d = torch.empty(groups * rows, n, dtype=torch.float32, device="cuda")
    offsets = torch.tensor([0, rows, 2 * rows], dtype=torch.int64, device="cuda")
    gemm.run(a_int.to(torch.float8_e4m3fn).cuda(), b_int.to(torch.float8_e4m3fn).cuda(), d,
             a_scale=a_exp.to(torch.uint8).cuda(), b_scale=b_exp.to(torch.uint8).cuda(), group_offsets=offsets)
    torch.cuda.synchronize()
    a_val = a_int * torch.repeat_interleave(2.0 ** (a_exp - 127).float(), 32, dim=1)
    b_val = b_int * torch.repeat_interleave(2.0 ** (b_exp - 127).float(), 32, dim=2)
    want = torch.cat([a_val[i * rows:(i + 1) * rows] @ b_val[i].T for i in range(groups)])
    assert torch.equal(d.float().cpu(), want)


@gpu
@pytest.mark.parametrize("route", ["fused", "dequant"])
def test_mxfp8_members_wgrad_from_the_spec_is_exact(route):
    # A K-grouped members spec made without a recipe (layout, m; k=0): two members of 64 and 96
    # tokens, each its own A_g [m, M_g] and B_g [N, M_g] back to back with its own e8m0 grid
    # [rows, M_g / 32]; small integers times 2^0 or 2^1 sum exactly in fp32 on both routes.
    torch = _torch_on_sm90()
    m, n, tokens = 128, 128, (64, 96)
    g = torch.Generator().manual_seed(7)
    a_int = [torch.randint(-2, 3, (m, t), generator=g).float() for t in tokens]
    b_int = [torch.randint(-1, 2, (n, t), generator=g).float() for t in tokens]
    a_exp = [torch.randint(127, 129, (m, t // 32), generator=g) for t in tokens]
    b_exp = [torch.randint(127, 129, (n, t // 32), generator=g) for t in tokens]
    gemm = qforge.Gemm("mxfp8", n=n, k=0, layout="k_grouped_members", m=m, route=route, out_dtype="fp32")
    def flat(parts, dtype, size=0):  # the members back to back (scale grids: in buffers of scale_bytes)
        t = torch.cat([p.flatten() for p in parts])
        return torch.cat([t, t.new_zeros(max(size - t.numel(), 0))]).to(dtype).cuda()
    sa_bytes, sb_bytes = gemm.scale_bytes(sum(tokens), len(tokens))  # room for one partial block per member
    d = torch.empty(len(tokens), m, n, dtype=torch.float32, device="cuda")
    offsets = torch.tensor([0, tokens[0], sum(tokens)], dtype=torch.int64, device="cuda")
    gemm.run(flat(a_int, torch.float8_e4m3fn), flat(b_int, torch.float8_e4m3fn), d,
             a_scale=flat(a_exp, torch.uint8, sa_bytes), b_scale=flat(b_exp, torch.uint8, sb_bytes),
             group_offsets=offsets, k_total=sum(tokens))
    torch.cuda.synchronize()
    val = lambda x, e: x * torch.repeat_interleave(2.0 ** (e - 127).float(), 32, dim=1)
    want = torch.stack([val(a_int[i], a_exp[i]) @ val(b_int[i], b_exp[i]).T for i in range(len(tokens))])
    assert torch.equal(d.cpu(), want)


def test_integer_and_string_arguments_are_checked():
    # ctypes would truncate or wrap these; each is a UserError naming the argument instead.
    ctx = qforge.Context(RECIPES / "mxfp8.json")
    q = ctx.quantizer("linear:input")
    with pytest.raises(qforge.UserError, match=r"m: 18446744073709551744 does not fit the C API's int64"):
        q.outputs(2**64 + 128, 256)
    with pytest.raises(qforge.UserError, match=r"m: expected an integer, got 128.7"):
        q.outputs(128.7, 256)
    assert len(q.outputs(np.int64(128), 256)) == len(q.outputs(128, 256))  # numpy integers are integers
    g = ctx.quantizer("grouped_linear:input", grouped=True)
    with pytest.raises(qforge.UserError, match=r"members: 4294967300 does not fit the C API's int32"):
        g.grouped_outputs(128, 256, 2**32 + 4)
    with pytest.raises(qforge.UserError, match=r"index: 4294967296 does not fit"):
        qforge.Context(RECIPES / "mxfp8_hopper.json").gemm(2**32)
    with pytest.raises(qforge.UserError, match=r"n: 18446744073709551872 does not fit"):
        qforge.Gemm("tensor", 2**64 + 256, 256)
    with pytest.raises(qforge.UserError, match=r"role: expected a string, got None"):
        ctx.quantizer(None)
    with pytest.raises(qforge.UserError, match=r"arch: expected a string, got None"):
        q.prepare(None)
    with pytest.raises(qforge.UserError, match=r"block_n: expected an integer, got True"):
        qforge.Gemm("tensor", 256, 256, block_n=True)
    with pytest.raises(qforge.UserError, match=r"ordered: expected an integer, got 'on'"):
        qforge.Gemm("tensor", 256, 256, ordered="on")
