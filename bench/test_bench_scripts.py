"""Tests of bench/report.py, bench/torch_baselines.py, bench/sass_hotspots.py, bench/ablate.py,
bench/jit_time.py (its trace split) and bench/sass_diff.py that need no GPU (sass_diff's compile
test needs libnvrtc, as the build does).

  python3 -m pytest bench/test_bench_scripts.py -q

report.py runs on synthetic qforge_bench.json / torch_baselines.json. The torch_baselines
tests need torch (CPU is enough) and skip without it; the end-to-end one also needs the built
CLI (build/tools/qforge, or $QFORGE_BIN) and compares torch's outputs with `qforge quantize
--device cpu` byte for byte.
"""
import json
import os
import random
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
import sass_diff  # noqa: E402
import sass_hotspots  # noqa: E402

SIZES = [(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (16384, 16384), (65536, 7168)]


def synthetic_qforge(copy_gbps=4200.0):
    rnd = random.Random(0)
    results = []
    combos = [("current_scaling", "linear:input", "training", "row+col", 2),
              ("current_scaling", "linear:input", "inference", "rowwise", 2),
              ("delayed_scaling", "linear:input", "training", "rowwise+columnwise", 1),
              ("mxfp8", "linear:input", "inference", "rowwise", 1),
              ("mxfp8", "linear:input", "training", "rowwise+columnwise", 1),
              ("float8_block_scaling", "linear:input", "training", "rowwise+columnwise", 1),
              ("float8_block_scaling", "linear:weight", "training", "rowwise+columnwise", 1),
              ("nvfp4", "linear:grad_output", "training", "rowwise+columnwise", 2)]
    for rec, role, usage, dirs, kernels in combos:
        for (m, k) in SIZES:
            n = m * k
            outs = n * (2 if "columnwise" in dirs else 1)
            b = kernels * 2 * n + outs + n // 16
            ratio = min(0.93, 0.25 + 0.1 * (n.bit_length() - 20)) * rnd.uniform(0.9, 1.0)
            gbps = ratio * copy_gbps
            e = {"recipe": rec, "role": role, "usage": usage, "directions": dirs, "shape": [m, k],
                 "grouped": False, "time_us": b / (gbps * 1e3), "bytes": b, "gbps": gbps, "ratio": ratio,
                 "kernels": kernels, "tile": [32, 128, 256], "extra_field": {"ignored": True}}
            if n <= 2048 * 2048:
                e["e2e_us"] = e["time_us"] + 9.0
                e["host_us"] = 3.25
                e["graph_us"] = e["time_us"] * 0.75
            e["form"] = "one_launch" if n <= 2048 * 2048 and kernels == 2 else "separate"
            if n >= 8192 * 8192:
                e["tiles"] = "interior"  # a program for interior tiles only served it
            results.append(e)
    results.append({"recipe": "nvfp4", "role": "linear:input", "usage": "training", "shape": [1, 7],
                    "grouped": False, "error": "synthetic: RHT needs M % 16 == 0"})
    # grouped MoE-like entries (list of [M, K] members), one with a list of ints + shape
    groups = [[rnd.choice([0, 512, 1024, 3072]), 7168] for _ in range(8)]
    m_tot = sum(g[0] for g in groups)
    results.append({"recipe": "recipes/mxfp8.json", "role": "grouped_linear:input", "usage": "training",
                    "directions": "rowwise+columnwise", "groups": groups, "grouped": True, "time_us": 150.0,
                    "bytes": 4 * m_tot * 7168, "gbps": 4 * m_tot * 7168 / 150e3, "ratio": 0.7, "kernels": 1})
    results.append({"recipe": "nvfp4", "role": "grouped_linear:input", "usage": "training",
                    "groups": [4096, 0, 8192], "shape": [12288, 7168], "grouped": True, "time_us": 90.0,
                    "bytes": 3 * 12288 * 7168, "gbps": 3 * 12288 * 7168 / 90e3, "kernels": 2})
    floor = {"plain": {"host_us": 3.0, "e2e_us": 8.5, "b2b_us": 2.7, "graph_us": 1.25},
             "cooperative": {"host_us": 3.1, "e2e_us": 8.6, "b2b_us": 2.8, "graph_us": 1.5}}
    return {"device": "NVIDIA H200", "copy_gbps": copy_gbps, "launch_floor": floor, "results": results, "version": 1}


def synthetic_torch(q):
    cases = {"fp8_current": ("current_scaling", "training", "rowwise+columnwise", 2),
             "fp8_delayed": ("delayed_scaling", "training", "rowwise+columnwise", 1),
             "mxfp8_rowwise": ("mxfp8", "inference", "rowwise", 1),
             "mxfp8_both": ("mxfp8", "training", "rowwise+columnwise", 1),
             "fp8_block": ("float8_block_scaling", "training", "rowwise+columnwise", 1)}
    results, agreement = [], []
    for case, (rec, usage, dirs, passes) in cases.items():
        for impl in ("torch_eager", "torch_compile"):
            agreement.append({"case": case, "recipe": rec, "role": "linear:input", "usage": usage,
                              "shape": [2048, 4096], "dataset": "normal", "impl": impl, "qforge_device": "cuda",
                              "ok": True, "buffers": {"rowwise_data": {"mismatches": 0, "elements": 8388608, "equal": True}},
                              "missing_in_torch": [], "missing_in_qforge": []})
        for (m, k) in SIZES:
            qe = [e for e in q["results"] if e["recipe"] == rec and e.get("usage") == usage and e.get("shape") == [m, k]][0]
            for impl, slow in (("torch_eager", 4.0), ("torch_compile", 1.6)):
                r = {"case": case, "recipe": rec, "recipe_file": f"recipes/{rec}.json", "role": "linear:input",
                     "usage": usage, "directions": dirs, "shape": [m, k], "dtype": "bf16", "impl": impl,
                     "input_bytes": 2 * m * k, "bytes": qe["bytes"], "time_ms": qe["time_us"] * slow / 1e3,
                     "graph_time_ms": qe["time_us"] * slow * 0.8 / 1e3, "agreement_ok": True}
                r["gbps"] = r["bytes"] / (r["time_ms"] * 1e-3) / 1e9
                if case == "fp8_block" and impl == "torch_compile" and m == 65536:
                    r = {k2: v for k2, v in r.items() if k2 not in ("time_ms", "gbps", "graph_time_ms")}
                    r["time_ms"] = None
                    r["error"] = "InductorError: synthetic failure\nsecond line"
                results.append(r)
    return {"schema": "qforge-torch-baselines/1", "device": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0",
            "compile": {"mode": "default", "fullgraph": True, "dynamic": False},
            "timing": {"method": "cuda_events per call", "stat": "median", "iters": 50, "warmup": 5,
                       "rotate_inputs_below_bytes": 64 << 20, "rotated_inputs_total_bytes": 256 << 20},
            "bytes_formula": "synthetic", "results": results, "agreement": agreement,
            "skipped": [{"case": "fp8_block", "shape": [1, 1], "impl": "torch_eager", "reason": "synthetic"}],
            "errors": []}


def write(tmp, name, doc):
    p = tmp / name
    p.write_text(json.dumps(doc))
    return p


def test_report_full(tmp_path):
    q = synthetic_qforge()
    t = synthetic_torch(q)
    write(tmp_path, "qforge_bench.json", q)
    write(tmp_path, "torch_baselines.json", t)
    out = tmp_path / "out"
    assert report.main(["--in", str(tmp_path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    for rec in ("current_scaling", "delayed_scaling", "mxfp8", "float8_block_scaling", "nvfp4"):
        assert f"### {rec}\n" in md
    assert "8 groups" in md and "3 groups, 12288x7168" in md
    # torch comparison: every case x size row matched a qforge entry; speedups 4.00x / 1.60x
    comp = md.split("## qforge vs torch.compile vs torch eager")[1].split("\n## ")[0]
    rows = [line for line in comp.splitlines() if line.startswith("| fp8_") or line.startswith("| mxfp8")]
    assert len(rows) == 5 * len(SIZES)
    assert all(r.split("|")[4].strip() != "-" for r in rows)  # qforge time present
    # ratios on GPU (graph) time: eager 4.0 * 0.8, compile 1.6 * 0.8
    assert sum("3.20x" in r for r in rows) == 5 * len(SIZES)
    assert sum("1.28x" in r for r in rows) == 5 * len(SIZES) - 1
    assert "error" in [c.strip() for c in rows[-1].split("|")]
    assert "synthetic failure" in md and "skipped: torch fp8_block" in md
    assert "RHT needs M % 16 == 0" in md and "call+sync (us)" in md and "graph (us)" in md
    assert "plain launch: host 3.0 us, back to back 2.7 us, in a graph 1.2 us, launch + sync 8.5 us" in md
    per_recipe = md.split("## qforge vs torch.compile vs torch eager")[0]
    small = [line for line in per_recipe.splitlines() if "| 1024x1024 |" in line]
    assert small and all("| 3.2 |" in line for line in small)  # host_us, one decimal
    # The form column: small two-kernel plans run one launch, everything else separate launches.
    assert any(line.rstrip().endswith("| one launch |") for line in small)
    big = [line for line in per_recipe.splitlines() if "| 16384x16384 |" in line]
    assert big and all(line.rstrip().endswith("| separate |") or line.rstrip().endswith("| separate, interior |")
                       for line in big)
    assert any(line.rstrip().endswith("| separate, interior |") for line in big)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not available" in md
    else:
        assert (out / "bandwidth.png").stat().st_size > 10000


def test_report_names_each_runs_note_and_date(tmp_path):
    # A report that merges runs (qforge_bench.json from one run, torch_baselines.json from an
    # earlier one) says so in its header.
    q = synthetic_qforge()
    q["note"] = "one process per recipe, merged"
    t = synthetic_torch(q)
    t["created"] = "2026-11-25T01:08:39+00:00"
    write(tmp_path, "qforge_bench.json", q)
    write(tmp_path, "torch_baselines.json", t)
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "out"), "--no-plot"]) == 0
    head = (tmp_path / "out" / "report.md").read_text().split("## ")[0]
    assert "- qforge benchmark note: one process per recipe, merged." in head
    assert "(run of 2026-11-25T01:08:39+00:00)" in head
    del q["note"], t["created"]
    write(tmp_path, "qforge_bench.json", q)
    write(tmp_path, "torch_baselines.json", t)
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "out2"), "--no-plot"]) == 0
    head = (tmp_path / "out2" / "report.md").read_text().split("## ")[0]
    assert "note" not in head and "run of" not in head


def test_report_only_one_file(tmp_path):
    q = synthetic_qforge()
    write(tmp_path, "qforge_bench.json", q)
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "a"), "--no-plot"]) == 0
    md = (tmp_path / "a" / "report.md").read_text()
    assert "torch_baselines.json` not found" in md and "No torch results." in md
    os.remove(tmp_path / "qforge_bench.json")
    write(tmp_path, "torch_baselines.json", synthetic_torch(q))
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "report.md").read_text()
    assert "qforge_bench.json` not found" in md and "No qforge results." in md
    os.remove(tmp_path / "torch_baselines.json")
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "c")]) == 2


def test_report_tolerant_fields(tmp_path):
    # no copy_gbps, no ratio, no gbps (computed from bytes/time), time_ms instead of time_us,
    # recipe given as a path, unknown extra fields, a malformed entry
    q = {"device": "X", "results": [
        {"recipe": "recipes/current_scaling.json", "role": "linear:input", "usage": "training",
         "shape": [2048, 2048], "time_ms": 0.01, "bytes": 20_000_000, "foo": [1, 2]},
        {"recipe": "mxfp8", "shape": "bogus"},
        "not a dict"]}
    t = {"results": [{"case": "fp8_current", "recipe": "current_scaling", "recipe_file": "recipes/current_scaling.json",
                      "role": "linear:input", "usage": "training", "directions": "rowwise+columnwise",
                      "shape": [2048, 2048], "impl": "torch_eager", "time_ms": 0.05, "bytes": 20_000_000, "gbps": 400.0}]}
    write(tmp_path, "qforge_bench.json", q)
    write(tmp_path, "torch_baselines.json", t)
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| 2000 |" in md  # 20e6 B / 10 us = 2000 GB/s
    assert "5.00x" in md and "50.0* |" in md  # no graph time: the per-call time, starred


def test_find_qforge_matching():
    q = [{"recipe": "mxfp8", "role": "linear:input", "usage": "training", "shape": [4, 8], "time_us": 1.0},
         {"recipe": "mxfp8", "role": "linear:input", "usage": "inference", "shape": [4, 8], "time_us": 2.0},
         {"recipe": "mxfp8", "role": "linear:input", "directions": "rowwise", "shape": [4, 8], "time_us": 3.0,
          "dtype": "fp32"},
         {"recipe": "mxfp8", "role": "linear:input", "directions": "rowwise", "shape": [4, 8], "grouped": True,
          "time_us": 4.0}]
    t = {"recipe": "mxfp8", "role": "linear:input", "usage": "inference", "directions": "rowwise", "shape": [4, 8]}
    assert report.find_qforge(q, t)["time_us"] == 2.0
    t2 = dict(t, usage="training", directions="rowwise+columnwise")
    assert report.find_qforge(q, t2)["time_us"] == 1.0
    assert report.find_qforge(q, dict(t, shape=[8, 8])) is None


# ---------------------------------------------------------------------------------------------
# torch_baselines (CPU)
# ---------------------------------------------------------------------------------------------
try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


@needs_torch
def test_unswizzle_matches_reference():
    import numpy as np
    import torch_baselines as tb
    sys.path.insert(0, str(REPO / "tests" / "numerics"))
    import quantize_ref as qr
    for rows, cols in [(1, 1), (130, 7), (256, 8), (33, 129)]:
        g = np.random.default_rng(rows * cols).integers(0, 255, size=(rows, cols), dtype=np.uint8)
        sw = qr._layout_scales(g, True)
        assert np.array_equal(tb.unswizzle(sw, rows, cols), g)


def test_from_mn_major_matches_reference():
    """torch_baselines reads qforge's mn_major scale grids back in the compact order (numpy only)."""
    import numpy as np
    import torch_baselines as tb
    sys.path.insert(0, str(REPO / "tests" / "numerics"))
    import quantize_ref as qr
    for rows, cols in [(1, 1), (130, 7), (256, 2), (33, 129)]:
        g = np.random.default_rng(rows + cols).standard_normal((rows, cols)).astype(np.float32)
        mn = qr._mn_major(g)
        assert mn.shape == (cols, -(-rows // 4) * 4)
        assert np.array_equal(tb.from_mn_major(mn, rows, cols), g)
    with pytest.raises(ValueError, match="mn_major scale buffer has 3 entries, expected >= 4"):
        tb.from_mn_major(np.zeros(3, np.float32), 2, 1)


@needs_torch
def test_op_selftest_cpu():
    import torch_baselines as tb
    st = tb.op_selftest(torch, "cpu", do_compile=False)
    assert st["ok"], st


@needs_torch
def test_load_cases():
    import torch_baselines as tb
    for c in tb.CASES:
        spec = tb.load_case(c)
        fn, names, passes = tb.build_fn(spec, torch)
        assert names[0] == "rowwise_data"
        assert passes == (2 if c.startswith("fp8_current") else 1)


QFORGE = Path(os.environ.get("QFORGE_BIN", REPO / "build" / "tools" / "qforge"))


@needs_torch
@pytest.mark.skipif(not QFORGE.exists(), reason="qforge CLI not built")
def test_torch_baselines_cpu_end_to_end(tmp_path):
    import torch_baselines as tb
    rc = tb.main(["--qforge", str(QFORGE), "--out", str(tmp_path), "--device", "cpu", "--sizes", "128x256",
                  "--iters", "20", "--warmup", "1", "--check-shape", "256x512", "--no-compile", "--no-selftest"])
    assert rc == 0
    d = json.loads((tmp_path / "torch_baselines.json").read_text())
    assert d["schema"] == tb.SCHEMA
    assert len(d["agreement"]) == 2 * len(tb.CASES)
    assert all(a["ok"] for a in d["agreement"]), [a for a in d["agreement"] if not a["ok"]]
    assert len(d["results"]) == len(tb.CASES)
    for r in d["results"]:
        assert r["time_ms"] > 0 and r["agreement_ok"] is True
        n = 128 * 256
        assert r["bytes"] == r["input_passes"] * 2 * n + r["output_bytes"]
    # the report reads it
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path / "rep"), "--no-plot"]) == 0


def test_gemm_section_ratios(tmp_path):
    """gemm.jsonl (qforge gemm --json + torch baselines) becomes a table with ratios to torch."""
    recs = [
        {"gemm": "e4m3 x e4m3 blockwise N=4096 K=7168 -> bf16", "groups": [4096] * 8, "layout": "contiguous",
         "n": 4096, "k": 7168, "bench": {"median_ms": 2.0, "tflops": 900.0}},
        {"gemm": "e2m1 x e2m1 nvfp4 N=4096 K=7168 -> bf16", "groups": [4096] * 8, "layout": "contiguous",
         "scaling": "nvfp4", "n": 4096, "k": 7168, "bench": {"median_ms": 4.0, "tflops": 450.0}},
        {"gemm": "e4m3 x e4m3 tensor k-grouped M=4096 N=7168 -> bf16", "groups": [4096] * 8, "layout": "k_grouped",
         "m": 4096, "n": 7168, "k": 0, "bench": {"median_ms": 1.5, "tflops": 1200.0}},
        {"gemm": "e4m3 x e4m3 blockwise k-grouped (members) M=4096 N=7168 -> bf16", "groups": [4096] * 8,
         "layout": "k_grouped_members", "m": 4096, "n": 7168, "k": 0, "bench": {"median_ms": 2.4, "tflops": 750.0}},
        {"kernel": "_scaled_grouped_mm fp8 rowwise", "groups": 8, "m": 4096, "n": 4096, "k": 7168, "tflops": 1125.0},
        {"kernel": "_scaled_mm fp8 tensorwise (dense)", "groups": 8, "m": 4096, "n": 4096, "k": 7168, "tflops": 1440.0},
        {"kernel": "_grouped_mm bf16", "error": "unavailable"},
    ]
    (tmp_path / "gemm.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\nnot json\n")
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path), "--no-plot"]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "## Grouped GEMM" in text
    row = next(l for l in text.splitlines() if "blockwise" in l and "8 x 4096 x N 4096 x K 7168" in l)
    assert "| 900 |" in row and "0.80x" in row and "62%" in row and "100%" in row
    nv = next(l for l in text.splitlines() if "nvfp4" in l and "8 x 4096 x N 4096 x K 7168" in l)
    assert "| 450 |" in nv and nv.rstrip().endswith("50% | - |")
    wgrad = next(l for l in text.splitlines() if l.startswith("| wgrad 8"))
    assert "8 x 32768 tokens, M 4096 N 7168" in wgrad and "| 1200 |" in wgrad
    assert wgrad.rstrip().endswith("| - |")  # no per-tensor fprop in the records
    members = next(l for l in text.splitlines() if l.startswith("| wgrad (per-member copies)"))
    assert "| 750 |" in members and "e4m3 x e4m3 blockwise" in members
    assert members.rstrip().endswith("| 83% |")  # of the blockwise fprop at the same FLOPs
    assert "torch _scaled_grouped_mm fp8 rowwise" in text


def test_gemm_section_pairs_rounds(tmp_path):
    """A file of several rounds (qforge records, then that round's torch run): each record's ratios
    use its own round's torch run and blockwise / fprop records, not the last round's."""
    def q(gemm, tf, layout="contiguous", **kw):
        r = {"gemm": gemm, "groups": [4096] * 8, "layout": layout, "n": 4096, "k": 7168, "bench": {"tflops": tf}}
        r.update(kw)
        return r

    def torch(tf):
        return {"kernel": "_scaled_grouped_mm fp8 rowwise", "groups": 8, "m": 4096, "n": 4096, "k": 7168, "tflops": tf}

    wgrad = dict(layout="k_grouped", m=4096, n=7168, k=0, scaling="blockwise")
    recs = []
    for blockwise, rowwise, wg, t in [(1000.0, 1200.0, 700.0, 1000.0), (1100.0, 1210.0, 880.0, 1100.0)]:
        recs += [q("e4m3 x e4m3 blockwise N=4096 K=7168 -> bf16", blockwise, scaling="blockwise"),
                 q("e4m3 x e4m3 rowwise N=4096 K=7168 -> bf16", rowwise, scaling="rowwise"),
                 q("e4m3 x e4m3 blockwise k-grouped M=4096 N=7168 -> bf16", wg, **wgrad), torch(t)]
    (tmp_path / "gemm.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path), "--no-plot"]) == 0
    lines = (tmp_path / "report.md").read_text().splitlines()
    rowwise = [l for l in lines if "e4m3 x e4m3 rowwise" in l]
    assert "| 1.20x |" in rowwise[0] and "| 1.10x |" in rowwise[1]  # 1200 / 1000, 1210 / 1100
    assert "| 120% |" in rowwise[0] and "| 110% |" in rowwise[1]  # of the round's blockwise
    wgrads = [l for l in lines if l.startswith("| wgrad")]
    assert wgrads[0].rstrip().endswith("| 70% |") and wgrads[1].rstrip().endswith("| 80% |")
    # Records without the "scaling" field (older files): the word after the formats, suffixes
    # in parentheses skipped.
    old = [q("e4m3 x e4m3 blockwise (mn_major scales) N=4096 K=7168 -> bf16", 1000.0),
           q("e4m3 x e4m3 blockwise (mn_major scales) k-grouped M=4096 N=7168 -> bf16", 750.0,
             **dict(wgrad, scaling=None))]
    (tmp_path / "gemm.jsonl").write_text("\n".join(json.dumps(r) for r in old) + "\n")
    assert report.main(["--in", str(tmp_path), "--out", str(tmp_path), "--no-plot"]) == 0
    old_lines = (tmp_path / "report.md").read_text().splitlines()
    assert next(l for l in old_lines if l.startswith("| 8 x 4096")).rstrip().endswith("| 100% | - |")
    assert next(l for l in old_lines if l.startswith("| wgrad")).rstrip().endswith("| 75% |")
    assert any("torch _scaled_grouped_mm fp8 rowwise" in l and "1000 / 1100" in l for l in lines)


# ---------------------------------------------------------------------------------------------
# ablate.py (scripts/ablate.sh): stage-removal variants of the cast kernel's headers
# ---------------------------------------------------------------------------------------------
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import ablate  # noqa: E402

QF_HEADERS = REPO / "templates" / "qforge"


def test_every_ablation_applies_to_the_shipped_headers(tmp_path):
    headers = ablate.read_headers(QF_HEADERS)
    outs = {}
    for name in ablate.ABLATIONS:
        out = ablate.apply(name, headers)
        assert out != headers, name
        for header, _, replacement in ablate.ABLATIONS[name][1]:
            assert replacement in out[header], name
        outs[name] = tuple(sorted(out.items()))
    assert len(set(outs.values())) == len(outs)  # every variant is its own kernel
    assert ablate.main(["check", str(QF_HEADERS)]) == 0
    # apply writes the headers the ablation edits, and only those.
    assert ablate.main(["apply", "no-partials", str(QF_HEADERS), str(tmp_path)]) == 0
    assert [f.name for f in tmp_path.iterdir()] == ["cast_tile.cuh"]
    assert (tmp_path / "cast_tile.cuh").read_text() == ablate.apply("no-partials", headers)["cast_tile.cuh"]


def test_ablation_errors_name_what_is_wrong(tmp_path, capsys):
    headers = ablate.read_headers(QF_HEADERS)
    with pytest.raises(ablate.AblationError, match="unknown ablation 'no-such'"):
        ablate.apply("no-such", headers)
    # A header edited so that an anchor moved: the ablation is named, not silently a no-op.
    moved = dict(headers, **{"cast_tile.cuh": headers["cast_tile.cuh"].replace("column_partials<Cfg>(src, part);", "x();")})
    with pytest.raises(ablate.AblationError, match=r"ablation 'no-partials'.*occurs 0 times in cast_tile.cuh"):
        ablate.apply("no-partials", moved)
    for h in ablate.edited_headers():
        (tmp_path / h).write_text("// no anchors\n")
    assert ablate.main(["check", str(tmp_path)]) == 1
    assert "ablate: error: ablation 'no-entries'" in capsys.readouterr().err
    assert ablate.main(["apply", "no-entries", str(tmp_path / "missing"), str(tmp_path / "o")]) == 1
    assert ablate.main(["frobnicate"]) == 2


def _bench_json(path, rows):
    path.write_text(json.dumps({"copy_gbps": 3000.0, "results": [
        {"recipe": r, "role": "linear:input", "usage": "training", "shape": [m, k], "grouped": False, "time_us": t}
        for r, m, k, t in rows] + [{"recipe": "x", "role": "y", "usage": "training", "shape": [1, 1], "error": "e"}]}))


def test_ablate_report_table(tmp_path, capsys):
    _bench_json(tmp_path / "shipped__1__0.json", [("mxfp8_hopper", 16384, 16384, 459.2)])
    _bench_json(tmp_path / "shipped__2__0.json", [("mxfp8_hopper", 16384, 16384, 458.8)])
    _bench_json(tmp_path / "no-entries__1__0.json", [("mxfp8_hopper", 16384, 16384, 383.9)])
    _bench_json(tmp_path / "no-entries__2__0.json", [("mxfp8_hopper", 16384, 16384, 383.9)])
    _bench_json(tmp_path / "no-rowwise__1__0.json", [("mxfp8_hopper", 16384, 16384, 317.7)])
    table = ablate.report(tmp_path)
    lines = table.splitlines()
    assert lines[0] == "| case (us per call) | shipped | no-entries | no-rowwise |"
    assert lines[2] == "| mxfp8_hopper linear:input training 16384x16384 | 458.8-459.2 | 383.9 | 317.7 |"
    assert len(lines) == 3  # the error entry is not a case
    assert ablate.main(["report", str(tmp_path)]) == 0 and capsys.readouterr().out == table
    (tmp_path / "bogus__1__0.json").write_text("{}")
    with pytest.raises(ablate.AblationError, match="'bogus' is neither 'shipped', an ablation, rev:REV nor tree:DIR"):
        ablate.report(tmp_path)
    with pytest.raises(ablate.AblationError, match="no qforge_bench results"):
        ablate.report(tmp_path / "nothing-here")


def test_ablate_report_graph_metric(tmp_path, capsys):
    """METRIC=graph_us: the GPU time per call of the small cases; cases without it are left out."""
    (tmp_path / "shipped__1__0.json").write_text(json.dumps({"results": [
        {"recipe": "nvfp4", "role": "linear:input", "usage": "training", "shape": [1024, 1024], "time_us": 11.8,
         "graph_us": 10.4},
        {"recipe": "nvfp4", "role": "linear:input", "usage": "training", "shape": [16384, 16384], "time_us": 657.0}]}))
    lines = ablate.report(tmp_path, "graph_us").splitlines()
    assert lines[2:] == ["| nvfp4 linear:input training 1024x1024 | 10.4 |"]
    assert ablate.main(["report", str(tmp_path), "graph_us"]) == 0 and "| 10.4 |" in capsys.readouterr().out
    with pytest.raises(ablate.AblationError, match="no qforge_bench results with e2e_us"):
        ablate.report(tmp_path, "e2e_us")


def test_ablate_report_whole_trees(tmp_path):
    """rev:REV variants (the tree at a commit) and tree:DIR ones (a source tree copied into the
    repository root), scripts/ablate.sh's whole-tree variants, come after the ablations, rev first."""
    _bench_json(tmp_path / "tree:base__1__0.json", [("nvfp4", 16384, 16384, 680.0)])
    _bench_json(tmp_path / "rev:HEAD~1__1__0.json", [("nvfp4", 16384, 16384, 677.0)])
    _bench_json(tmp_path / "no-rowwise__1__0.json", [("nvfp4", 16384, 16384, 502.0)])
    _bench_json(tmp_path / "shipped__1__0.json", [("nvfp4", 16384, 16384, 657.0)])
    lines = ablate.report(tmp_path).splitlines()
    assert lines[0] == "| case (us per call) | shipped | no-rowwise | rev:HEAD~1 | tree:base |"
    assert lines[2] == "| nvfp4 linear:input training 16384x16384 | 657.0 | 502.0 | 677.0 | 680.0 |"
    assert ablate.is_revision("rev:37ab1dd") and not ablate.is_revision("rev:") and not ablate.is_revision("no-entries")
    assert ablate.is_tree("tree:base-73b4d5f")
    for bad in ("tree:", "tree:.", "tree:..", "tree:a/b", "base"):
        assert not ablate.is_tree(bad), bad


@pytest.mark.parametrize("variant,message", [
    ("tree:no-such-dir", "./no-such-dir holds no qforge source tree"),
    ("tree:a/b", "expected tree:DIR, DIR one directory of the repository root"),
    ("tree:..", "expected tree:DIR, DIR one directory of the repository root"),
    ("rev:no-such-rev", "'no-such-rev' is not a commit of this repository"),
    ("no-such-ablation", "unknown ablation 'no-such-ablation'"),
])
def test_ablate_sh_checks_variants_before_building(tmp_path, variant, message):
    """scripts/ablate.sh names a bad variant and stops before its first build."""
    r = subprocess.run(["bash", str(REPO / "scripts" / "ablate.sh"), str(tmp_path / "out")], cwd=REPO,
                       env={**os.environ, "ABLATIONS": variant}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert message in r.stdout + r.stderr
    assert not (tmp_path / "out" / "build.log").exists()


@pytest.mark.parametrize("base,message", [
    ("HEAD~1", "BASE: expected rev:REV or tree:DIR, got 'HEAD~1'"),
    ("tree:no-such-dir", "./no-such-dir holds no qforge source tree"),
    ("tree:a/b", "expected tree:DIR, DIR one directory of the repository root"),
    ("rev:no-such-rev", "'no-such-rev' is not a commit of this repository"),
])
def test_gemm_ab_sh_checks_its_base_before_building(tmp_path, base, message):
    """scripts/gemm_ab.sh (the GEMM A/B, sharing scripts/tree_variants.sh with ablate.sh) names a
    bad BASE and stops before building anything."""
    r = subprocess.run(["bash", str(REPO / "scripts" / "gemm_ab.sh"), str(tmp_path / "out"), base], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert message in r.stdout + r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,message", [
    (["--no-such-option"], "scripts/bench.sh: unknown argument '--no-such-option'"),
    (["--sizes"], "--sizes: expected MxK,MxK,... after it"),
    (["--quick", "extra"], "scripts/bench.sh: unknown argument 'extra'"),
])
def test_bench_sh_names_a_bad_argument_before_building(tmp_path, args, message):
    """scripts/bench.sh names a bad argument and stops before creating its output or building."""
    r = subprocess.run(["bash", str(REPO / "scripts" / "bench.sh"), str(tmp_path / "out"), *args], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.skipif(NVCC is None or not QFORGE.exists(), reason="needs nvcc and the qforge CLI")
def test_ablated_kernels_compile_for_sm90a(tmp_path):
    """Each variant's kernels compile, so scripts/ablate.sh's builds time real kernels: the cast
    kernel of mxfp8_hopper's training plan (both directions, transposed 32-row blocks, staged
    entries) and nvfp4's, which also serves the one-launch form (the pre-pass with the RHT, the
    grid barriers)."""
    units = []
    for recipe, kind in (("mxfp8_hopper", "cast_kernel"), ("nvfp4", "cast_kernel")):
        out = subprocess.run([str(QFORGE), "inspect", str(REPO / "recipes" / (recipe + ".json")), "--role", "linear:input",
                              "--usage", "training", "--source"], check=True, capture_output=True, text=True).stdout
        lines = out.splitlines()
        start = lines.index("// ---- source")
        # The complete program (every kernel); the separate form's program, which follows it, is
        # the same without the fused kernel.
        end = lines.index("// ---- separate form") if "// ---- separate form" in lines else len(lines)
        kernel = next(l for l in lines[start:end] if l.startswith("// %s: " % kind)).split(": ", 1)[1]
        src = "\n".join(lines[start + 1:end]) + "\ntemplate __global__ void %s(const qf::QuantizeArgs);\n" % kernel
        units.append(tmp_path / ("%s.cu" % recipe))
        units[-1].write_text(src)
    for name in ablate.ABLATIONS:
        inc = tmp_path / name
        shutil.copytree(REPO / "templates", inc)
        for header, text in ablate.apply(name, ablate.read_headers(QF_HEADERS)).items():
            (inc / "qforge" / header).write_text(text)
        for unit in units:
            r = subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "-std=c++17", "-I", str(inc), str(unit),
                                "-o", str(tmp_path / (name + unit.stem + ".cubin"))], capture_output=True, text=True)
            assert r.returncode == 0, (name, unit.name, r.stderr[-2000:])


_SRC_HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
               '"# Samples","Instructions Executed","Thread Instructions Executed","stall_long_sb","stall_barrier",'
               '"stall_long_sb (Not Issued)"')


def _src_csv(path, kernels):
    lines = ["==PROF== Connected to process 1 (qforge_bench)"]
    for name, rows in kernels:
        lines += ['"Kernel Name","%s",' % name, _SRC_HEADER]
        # The samples split 2:1 between long scoreboard and barrier (the "Not Issued" column ignored).
        lines += ['"0x%x","%s","%d","0","%d","%s","0","%d","%d","999"' % (a, sass, s, s, n, s * 2 // 3, s - s * 2 // 3)
                  for a, sass, n, s in rows]
    path.write_text("\n".join(lines) + "\n")


def test_sass_hotspots_runs_and_mix(tmp_path, capsys):
    # A load block run once per warp (2 instructions, 1,000,000 times: the thousands separator),
    # then a loop body run 3,000,000 times whose predicated branch is still a BRA.
    rows = [(0x10, "LDG.E.128 R4, desc[UR8][R6.64]", 1000000, 90), (0x20, "STS.128 [R0], R4", 1000000, 10),
            (0x30, "FMNMX R1, |R4|, R1, !PT", 3000000, 30), (0x40, "@!P1 BRA 0x30", 3000000, 0)]
    _src_csv(tmp_path / "k.csv", [("cast_kernel<A>", rows), ("cast_kernel<B>", [(0x10, "EXIT", 5, 1)])])
    text = (tmp_path / "k.csv").read_text().replace('"1000000"', '"1,000,000"')
    (tmp_path / "k.csv").write_text(text)
    kernels = sass_hotspots.parse(text.splitlines())
    assert [k for k, _ in kernels] == ["cast_kernel<A>", "cast_kernel<B>"]
    assert kernels[0][1][0][2] == 1000000 and sass_hotspots.opcode("@!P1 BRA 0x30") == "BRA"
    assert kernels[0][1][0][4] == {"long_sb": 60, "barrier": 30}
    runs = sass_hotspots.runs(kernels[0][1])
    assert [(r["start"], r["executed"], r["length"], r["instructions"]) for r in runs] == [
        ("0x10", 1000000, 2, 2000000), ("0x30", 3000000, 2, 6000000)]
    out = sass_hotspots.report(kernels, blocks=1)
    assert "8.0 M warp instructions executed, 130 warp-stall samples" in out
    assert "  FMNMX        3.0M   37.5     23.1" in out and "  LDG          1.0M   12.5     69.2" in out
    assert "  0x30 x3000000      2   75.0   23.1  FMNMX:1 BRA:1  [long_sb 67% barrier 33%]" in out
    assert "  stall reasons: long_sb 66% barrier 34%" in out
    assert "0x10 x1000000" not in out  # blocks=1: only the hottest run
    assert sass_hotspots.main([str(tmp_path / "k.csv")]) == 0 and "kernel cast_kernel<B>" in capsys.readouterr().out


def test_sass_hotspots_errors_name_the_problem(tmp_path, capsys):
    (tmp_path / "plain.csv").write_text('"Address","Source"\n"0x10","EXIT"\n')
    assert sass_hotspots.main([str(tmp_path / "plain.csv")]) == 1
    assert "no 'Instructions Executed' column" in capsys.readouterr().err
    (tmp_path / "empty.csv").write_text("==PROF== Disconnected\n")
    assert sass_hotspots.main([str(tmp_path / "empty.csv")]) == 1
    assert "no SASS rows" in capsys.readouterr().err
    assert sass_hotspots.main([str(tmp_path / "missing.csv")]) == 1
    assert sass_hotspots.main([]) == 2


# ---------------------------------------------------------------------------------------------
# sass_diff.py: which cached kernels a change of the device headers changes
# ---------------------------------------------------------------------------------------------


def test_sass_diff_strips_addresses():
    a = "        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;\n\n  /*0010*/  EXIT ;"
    b = "/*0100*/ IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;\n/*0110*/      EXIT ;"
    assert sass_diff.normalize_sass(a) == sass_diff.normalize_sass(b)
    assert sass_diff.normalize_sass(a) != sass_diff.normalize_sass(b.replace("R1,", "R2,"))


def test_sass_diff_kernel_identity_is_the_configs_a_kernel_names():
    # A generated source of one program: the row kernel's identity takes CfgRow and its base Cfg
    # and S0, not the other structs the program defines.
    src = ("// Generated\n#include \"qforge/cast.cuh\"\n\nnamespace qf_gen {\n"
           "struct S0 {\n  static constexpr long long kIndex = 0;\n};\n"
           "struct A1 {\n  static constexpr long long kSlot = 1;\n};\n"
           "struct Cfg {\n  static constexpr long long kThreads = 128;\n};\n"
           "struct CfgRow : Cfg {\n  static constexpr long long kThreads = 256;\n};\n}  // namespace qf_gen\n")
    structs = sass_diff.gen_structs(src)
    assert set(structs) == {"S0", "A1", "Cfg", "CfgRow"}
    assert structs["CfgRow"][0] == "Cfg"
    fused = "qf::row_kernel<qf_gen::CfgRow, qf_gen::S0>"
    ident = sass_diff.kernel_identity("sm_90a", ["-O3"], fused, structs)
    assert [n for n, _ in ident[3]] == ["Cfg", "CfgRow", "S0"]
    # The same kernel in a program without A1: the same identity; another Cfg: another one.
    alone = {k: v for k, v in structs.items() if k != "A1"}
    assert sass_diff.kernel_identity("sm_90a", ["-O3"], fused, alone) == ident
    other = dict(alone, Cfg=(None, "struct Cfg {\nstatic constexpr long long kThreads = 64;\n};"))
    assert sass_diff.kernel_identity("sm_90a", ["-O3"], fused, other) != ident
    assert sass_diff.kernel_identity("sm_100a", ["-O3"], fused, alone) != ident


def test_sass_diff_nv_info_drops_the_parameter_banks_symbol_index():
    # EIFMT_SVAL PARAM_CBANK (symbol 7, offset 0x210, size 0x60), EIFMT_HVAL attr 0x1b, EIFMT_NVAL 0x1c
    a = bytes([0x04, 0x0A, 8, 0, 7, 0, 0, 0, 0x10, 0x02, 0x60, 0, 0x03, 0x1B, 0xFF, 0, 0x01, 0x1C])
    b = bytes([0x04, 0x0A, 8, 0, 2, 0, 0, 0, 0x10, 0x02, 0x60, 0, 0x03, 0x1B, 0xFF, 0, 0x01, 0x1C])
    assert sass_diff.nv_info(a) == sass_diff.nv_info(b)
    assert sass_diff.nv_info(a) == [(0x0A, bytes([0x10, 0x02, 0x60, 0])), (0x1B, bytes([0xFF, 0])), (0x1C, b"")]
    c = bytes(b[:14]) + bytes([0x7F, 0]) + bytes(b[16:])
    assert sass_diff.nv_info(c) != sass_diff.nv_info(b)


def _header_tree(root, body):
    # kTable: a namespace-scope constexpr array indexed at run time, which NVRTC emits as an
    # internal-linkage symbol whose name changes with every compile (so do the CUBIN's bytes).
    (root / "qforge").mkdir(parents=True)
    (root / "qforge" / "k.cuh").write_text(
        "#pragma once\nnamespace qf_test { constexpr int kTable[4] = {1, 2, 3, 5}; }\n"
        "template <int N> __global__ void qf_test_kernel(int* p) { " + body + " }\n")
    return root


def test_sass_diff_compiles_cached_sources_against_both_header_trees(tmp_path, capsys):
    """A cache entry's source compiled by NVRTC against two header trees: a comment changes
    nothing, a changed statement is named; errors exit 2. (Needs libnvrtc, as the build does.)"""
    try:
        sass_diff.load_nvrtc()
    except sass_diff.SassDiffError as e:
        if os.environ.get("QFORGE_NVRTC"):  # ctest names the build's libnvrtc: it must load
            raise
        pytest.skip(str(e))
    store = "p[threadIdx.x] = N * qf_test::kTable[threadIdx.x % 4];"
    base = _header_tree(tmp_path / "base", store)
    comment = _header_tree(tmp_path / "comment", "// the value\n  " + store)
    changed = _header_tree(tmp_path / "changed", store.replace("N *", "N +"))
    entry = tmp_path / "cache" / "qforge-v1" / "ab" / ("ab" + "0" * 62)
    entry.mkdir(parents=True)
    (entry / "source.cu").write_text('#include "qforge/k.cuh"\n')
    (entry / "meta.json").write_text(json.dumps({
        "options": ["--std=c++17", "--gpu-architecture=sm_90a"], "target": "sm_90a",
        "lowered_names": {"qf_test_kernel<3>": "_Z14qf_test_kernelILi3EEvPi"},
        "metadata": {"kind": "test", "what": "store"}}))
    (tmp_path / "cache" / "qforge-v1" / "ab" / "stray.txt").write_text("not an entry")
    cache = str(tmp_path / "cache")
    # Two compiles of one source a second apart differ in their bytes (the internal names carry a
    # per-compile token) but not in their code.
    nvrtc = sass_diff.load_nvrtc()
    label, source, options, names = sass_diff.cache_entries(cache)[0]
    first = sass_diff.compile_cubin(nvrtc, source, options, names, base)
    time.sleep(1.1)
    second = sass_diff.compile_cubin(nvrtc, source, options, names, base)
    assert first != second and b"_INTERNAL_" in first
    assert sass_diff.code_sections(first) == sass_diff.code_sections(second)
    modes = [["--cubin"]] + ([[]] if sass_diff.find_nvdisasm() else [])
    for mode in modes:
        assert sass_diff.main(["--base", str(base), "--templates", str(comment), "--cache", cache] + mode) == 0
        assert "1 kernels compared" in capsys.readouterr().out
        assert sass_diff.main(["--base", str(base), "--templates", str(changed), "--cache", cache] + mode) == 1
        out = capsys.readouterr().out
        assert "differs [test] store (qf_test_kernel; sm_90a)" in out and "0 the same, 1 different" in out
    assert sass_diff.main(["--base", str(base), "--cache", cache, "--filter", "nothing like it"]) == 2
    assert "no cache entry with its source matching 'nothing like it'" in capsys.readouterr().err
    assert sass_diff.main(["--base", str(tmp_path), "--cache", cache]) == 2
    assert "expected a templates directory" in capsys.readouterr().err
    broken = _header_tree(tmp_path / "broken", "p[threadIdx.x] = N +;")
    assert sass_diff.main(["--base", str(base), "--templates", str(broken), "--cache", cache, "--cubin"]) == 2
    out = capsys.readouterr().out
    assert "error   [test] store (qf_test_kernel; sm_90a): compile against" in out and "1 failed to compile" in out


import jit_time  # noqa: E402


def test_jit_time_trace_parts_splits_nvvm_by_function():
    # NVRTC's -fdevice-time-trace events (microseconds): a kernel's own OptFunction events count as
    # "nvvm kernels"; a helper's and a lambda's inside the kernel (_ZZN...) as "nvvm helpers".
    ev = [
        {"ph": "X", "name": "CUDA C++ Front-End", "dur": 100},
        {"ph": "X", "name": "LibNVVM", "dur": 1000},
        {"ph": "X", "name": "OptFunction", "dur": 600, "args": {"detail": "_ZN2qf11cast_kernelIN6qf_gen3CfgEJNS1_2S0EEEvNS_12QuantizeArgsE"}},
        {"ph": "X", "name": "OptFunction", "dur": 200, "args": {"detail": "_ZN2qf11cast_kernelIN6qf_gen3CfgEJNS1_2S0EEEvNS_12QuantizeArgsE"}},
        {"ph": "X", "name": "OptFunction", "dur": 50, "args": {"detail": "_ZN2qf9amax_stepEff"}},
        {"ph": "X", "name": "OptFunction", "dur": 50, "args": {"detail": "_ZZN2qf11cast_kernelIN6qf_gen3CfgEJNS1_2S0EEEvNS_12QuantizeArgsEENKUlvE_clEv"}},
        {"ph": "X", "name": "Total PTXAS Time", "dur": 900},
        {"ph": "B", "name": "LibNVVM", "dur": 5000},
    ]
    shares = jit_time.trace_parts({"traceEvents": ev}, ["qf::cast_kernel<qf_gen::Cfg, qf_gen::S0>"])
    assert shares == pytest.approx({"front end": 0.05, "nvvm kernels": 0.4, "nvvm helpers": 0.05, "nvvm rest": 0.05, "ptxas": 0.45})


def test_jit_time_counts_sass_instructions_not_directives_or_labels():
    listing = sass_diff.normalize_sass("""
        .headerflags @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        .section .text._ZN2qf11cast_kernelE,"ax",@progbits
        .sectioninfo @"SHI_REGISTERS=80"
.text._ZN2qf11cast_kernelE:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0020*/              @!P0 BRA `(.L_x_1) ;
.L_x_1:
        /*0030*/                   EXIT ;
""")
    assert jit_time.sass_instructions(listing) == 4
    assert jit_time.sass_instructions("") == 0


# jit_time.py --hits: the cache hits of a qforge debug log (runtime/kernel_cache.cpp's lines) by key,
# then the latency table per kind of kernel, with "-" where a kind had no hit in the log.
def test_jit_time_hits_and_latency_table(tmp_path, capsys):
    import jit_time
    log = tmp_path / "hits.log"
    log.write_text(
        "qforge: debug: disk cache hit: quantize kernel (form all, input bf16, recipe mxfp8, role linear:input, "
        "usage training) [qf::cast_kernel<qf_gen::Cfg, qf_gen::S0>] for sm_90a in 0.512 ms (key 5169fa1eca8f2447)\n"
        "qforge: debug: shipped kernel (built by NVRTC 13.0) hit: quantize kernel (form all) [k] for sm_90a in 1.250 ms "
        "(key 0472451617b0d2e0)\n"
        "prewarm: 2 kernels for sm_90a: 0 compiled, 2 cache hits, 0 failed in 0.01 s\n")
    hits = jit_time.cache_hits(str(log))
    assert hits == {"5169fa1eca8f": 0.512, "0472451617b0": 1.25}
    es = [{"kind": "quantize", "key": "5169fa1eca8f"}, {"kind": "quantize", "key": "0472451617b0"},
          {"kind": "gemm", "key": "aaaaaaaaaaaa"}]
    per_kind = {"quantize": {"cubin": [0.4, 0.6]}, "gemm": {"cubin": [0.9]}, "all": {"cubin": [0.4, 0.6, 0.9]}}
    jit_time.latency_table(per_kind, hits, es)
    out = capsys.readouterr().out
    assert "| quantize | 2 | 500 / 600 | 0.88 / 1.25 |" in out
    assert "| gemm | 1 | 900 / 900 | - |" in out
    assert out.rstrip().endswith("| all | 3 | 600 / 900 | 0.88 / 1.25 |")


# jit_time.py --first-call: bench/first_call.py's rows go to the row of the program their call took
# (interior tiles or any), a median per API and cache state, shipped / warm / cold; kinds without
# first calls read "-".
def test_jit_time_first_call_column(tmp_path, capsys):
    import jit_time
    def row(api, tiles, shipped, cold):
        return {"recipe": "r", "api": api, "shape": [4000, 4000], "tiles": tiles, "shipped": {"first_ms": shipped}, "cold": {"first_ms": cold}}
    doc = {"states": ["cold", "shipped"], "rows": [row("C++", "interior", 3.0, 500.0), row("C++", "interior", 5.0, 700.0),
                                                   row("C++", "interior", 4.0, 600.0), row("C++", "any", 4.5, 900.0)]}
    doc["rows"][0]["shape"] = [4096, 4096]
    path = tmp_path / "first.json"
    path.write_text(json.dumps(doc))
    # A second file's torch row without tiles (its child cannot tell) takes the C++ row's of its shape.
    torch_row = row("torch", "", 6.0, 650.0)
    torch_row["shape"] = [4096, 4096]
    (tmp_path / "torch.json").write_text(json.dumps({"states": ["cold", "shipped"], "rows": [torch_row]}))
    first = jit_time.first_calls([str(path), str(tmp_path / "torch.json")])
    assert first["quantize/interior"]["C++"] == {"cold": 600.0, "shipped": 4.0}
    assert first["quantize"]["C++"] == {"cold": 900.0, "shipped": 4.5}
    per_kind = {"quantize/interior": {"cubin": [0.5]}, "quantize": {"cubin": [0.9]}, "gemm": {"cubin": [0.7]},
                "all": {"cubin": [0.5, 0.7, 0.9]}}
    jit_time.latency_table(per_kind, {}, [], first)
    out = capsys.readouterr().out
    assert "from a shipped root / with an empty cache" in out
    assert "| quantize/interior | 1 | 500 / 500 | - | C++ 4.0 / 600.0; torch 6.0 / 650.0 |" in out
    assert "| quantize | 1 | 900 / 900 | - | C++ 4.5 / 900.0 |" in out
    assert "| gemm | 1 | 700 / 700 | - | - |" in out
    jit_time.latency_table(per_kind, {}, [])  # no first calls: no column
    assert "first call" not in capsys.readouterr().out


# first_call.py's bad arguments: named, before anything runs (no GPU needed to see them).
@pytest.mark.parametrize("args,message", [
    (["--shapes", "4096"], "--shapes: expected MxK"),
    (["--shapes", "0x8"], "--shapes: expected MxK"),
    (["--states", "cold,hot"], "--states: expected cold, shipped or warm, got hot"),
    (["--no-torch"], "nothing to time"),
])
def test_first_call_names_bad_arguments(args, message):
    import first_call
    with pytest.raises(SystemExit) as e:
        first_call.main(args)
    assert message in str(e.value)


# jit_time.py --plans: entries of two caches paired by kind and plan (the label), not by key or
# source, so a plan whose program changed is compared with its older program.
def test_jit_time_pairs_programs_by_plan():
    def entry(kind, label, source):
        return {"kind": kind, "label": label, "source": source, "names": ["qf::cast_kernel<qf_gen::Cfg>"]}
    base = [entry("quantize", "bf16 nvfp4 linear:input training", "old"),
            entry("quantize/interior", "bf16 nvfp4 linear:input interior training", "old i"),
            entry("quantize", "bf16 mxfp8 linear:input training", "same")]
    new = [entry("quantize", "bf16 mxfp8 linear:input training", "same"),
           entry("quantize", "bf16 nvfp4 linear:input training", "new"),
           entry("quantize/separate", "bf16 nvfp4 linear:input training", "sep")]
    pairs, alone = jit_time.pair_by_plan(base, new)
    assert [(b["source"], e["source"]) for b, e in pairs] == [("same", "same"), ("old", "new")]
    assert alone == ["quantize/separate bf16 nvfp4 linear:input training"]

