#!/usr/bin/env python3
"""Merge the qforge benchmark and the torch baselines into report.md and bandwidth.png.

Usage:
  python3 bench/report.py --in DIR --out DIR [--qforge-json FILE] [--torch-json FILE] [--no-plot]

Reads DIR/qforge_bench.json (bench/qforge_bench.cpp) and DIR/torch_baselines.json
(bench/torch_baselines.py); either may be missing. Writes OUT/report.md and OUT/bandwidth.png
(needs matplotlib; without it the plot is skipped with a warning and the report says so).

qforge_bench.json: {"device": str, "copy_gbps": float, "results": [{"recipe": str, "role": str,
  "usage": str, "directions": str, "shape": [M, K] | "groups": [...], "grouped": bool,
  "time_us": float, "bytes": int, "gbps": float, "ratio": float, "kernels": int, ...}]}
Extra fields are ignored; missing ones are shown as "-". "% of copy" is 100 * ratio when the
entry has a ratio, else 100 * gbps / copy_gbps.
"""
import argparse
import json
import math
import re
import sys
from collections import OrderedDict, defaultdict
from pathlib import Path

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "f16": 2, "fp32": 4, "f32": 4, "float32": 4, "bfloat16": 2, "float16": 2}


def warn(msg):
    print(f"report.py: warning: {msg}", file=sys.stderr)


def load_json(path):
    if path is None or not Path(path).exists():
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        warn(f"cannot read {path}: {e}")
        return None


def num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def recipe_key(r):
    """'recipes/mxfp8.json' and 'mxfp8' both -> 'mxfp8'."""
    if not r:
        return "?"
    r = str(r)
    name = r.replace("\\", "/").rsplit("/", 1)[-1]
    return name[:-5] if name.endswith(".json") else name


def dir_set(directions, usage=None):
    """A directions string ('rowwise', 'rowwise+columnwise', 'both', 'row,col', ...) or, failing
    that, a usage -> frozenset of {'rowwise', 'columnwise'}; None when unknown."""
    if directions:
        d = str(directions).lower()
        if d in ("both", "all", "training"):
            return frozenset({"rowwise", "columnwise"})
        out = set()
        if "row" in d:
            out.add("rowwise")
        if "col" in d:
            out.add("columnwise")
        if out:
            return frozenset(out)
    if usage == "inference":
        return frozenset({"rowwise"})
    if usage == "training":
        return frozenset({"rowwise", "columnwise"})
    return None


def itemsize(entry):
    return DTYPE_BYTES.get(str(entry.get("dtype", "bf16")).lower(), 2)


def entry_mk(e):
    """(M, K) of a plain entry, or (sum of member rows, K) of a grouped one; None if unknown."""
    shape = e.get("shape")
    if isinstance(shape, (list, tuple)) and len(shape) == 2 and all(isinstance(v, (int, float)) for v in shape):
        if not e.get("groups"):
            return int(shape[0]), int(shape[1])
    groups = e.get("groups")
    if isinstance(groups, (list, tuple)) and groups:
        k = None
        if isinstance(shape, (list, tuple)) and len(shape) == 2:
            k = shape[1]
        k = e.get("k", k)
        m_total = 0
        for g in groups:
            if isinstance(g, (list, tuple)) and len(g) >= 2:
                m_total += int(g[0])
                k = k if k is not None else int(g[1])
            elif isinstance(g, dict):
                m_total += int(g.get("m", g.get("rows", 0)))
                k = k if k is not None else g.get("k")
            elif isinstance(g, (int, float)):
                m_total += int(g)
        if k is not None:
            return m_total, int(k)
        return m_total, None
    if isinstance(shape, (list, tuple)) and len(shape) == 2:
        return int(shape[0]), int(shape[1])
    return None


def shape_str(e):
    mk = entry_mk(e)
    groups = e.get("groups")
    if groups:
        n = len(groups)
        if mk and mk[1] is not None:
            return f"{n} groups, {mk[0]}x{mk[1]}"
        return f"{n} groups"
    if mk:
        return f"{mk[0]}x{mk[1]}"
    return "?"


def input_bytes(e):
    mk = entry_mk(e)
    if not mk or mk[1] is None:
        return None
    return mk[0] * mk[1] * itemsize(e)


def q_time_us(e):
    t = num(e.get("time_us"))
    if t is None and num(e.get("time_ms")) is not None:
        t = num(e.get("time_ms")) * 1e3
    return t


def q_gbps(e):
    g = num(e.get("gbps"))
    if g is None:
        t, b = q_time_us(e), num(e.get("bytes"))
        if t and b:
            g = b / (t * 1e-6) / 1e9
    return g


def q_ratio(e, copy_gbps):
    r = num(e.get("ratio"))
    if r is None:
        g = q_gbps(e)
        if g is not None and copy_gbps:
            r = g / copy_gbps
    return r


def fmt(v, spec="{:.1f}", none="-"):
    return none if v is None else spec.format(v)


def fmt_bytes(b):
    if b is None:
        return "-"
    return f"{b / 2**20:.1f}"


def md_table(headers, rows, align=None):
    align = align or ["l"] + ["r"] * (len(headers) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# torch <-> qforge matching
# ---------------------------------------------------------------------------------------------
def find_qforge(q_results, t):
    """The qforge entry measuring the same thing as torch result t (recipe, role, usage /
    directions, shape, not grouped), or None."""
    want_recipe = recipe_key(t.get("recipe_file") or t.get("recipe"))
    alt_recipe = recipe_key(t.get("recipe"))
    shape = t.get("shape")
    if not shape:
        return None
    want_dirs = dir_set(t.get("directions"), t.get("usage"))
    best, best_score = None, -1
    for e in q_results:
        if e.get("grouped") or e.get("groups"):
            continue
        if recipe_key(e.get("recipe")) not in (want_recipe, alt_recipe):
            continue
        mk = entry_mk(e)
        if not mk or [mk[0], mk[1]] != list(shape):
            continue
        if e.get("role") and t.get("role") and e["role"] != t["role"]:
            continue
        if e.get("dtype") and str(e["dtype"]).lower() not in ("bf16", "bfloat16"):
            continue
        score = 0
        if e.get("usage") and t.get("usage"):
            if e["usage"] != t["usage"]:
                continue
            score += 2
        ed = dir_set(e.get("directions"), e.get("usage"))
        if ed is not None and want_dirs is not None:
            if ed != want_dirs:
                continue
            score += 1
        if q_time_us(e) is None:
            continue
        if score > best_score:
            best, best_score = e, score
    return best


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def build_report(q, t, plot_note):
    lines = ["# qforge quantize bandwidth report", ""]
    q_results = [e for e in (q or {}).get("results", []) if isinstance(e, dict)]
    copy_gbps = num((q or {}).get("copy_gbps"))
    t_results = [r for r in (t or {}).get("results", []) if isinstance(r, dict)]

    meta = []
    if q:
        meta.append(f"- qforge benchmark: device **{q.get('device', '?')}**, device-to-device copy "
                    f"bandwidth **{fmt(copy_gbps, '{:.0f}')} GB/s**, {len(q_results)} results.")
        if q.get("note"):
            meta.append(f"- qforge benchmark note: {q['note']}.")
    else:
        meta.append("- qforge benchmark: `qforge_bench.json` not found.")
    if t:
        meta.append(f"- torch baselines: device **{t.get('device', '?')}**, torch {t.get('torch', '?')}, "
                    f"triton {t.get('triton', '?')}, {len(t_results)} results"
                    f"{' (run of ' + t['created'] + ')' if t.get('created') else ''}; torch.compile "
                    f"{json.dumps(t.get('compile', {}))}.")
        tm = t.get("timing", {})
        meta.append(f"- torch timing: {tm.get('method', '?')}, {tm.get('stat', 'median')} of {tm.get('iters', '?')} "
                    f"calls after {tm.get('warmup', '?')} warm-up calls; inputs below "
                    f"{fmt_bytes(tm.get('rotate_inputs_below_bytes'))} MiB rotate through "
                    f"{fmt_bytes(tm.get('rotated_inputs_total_bytes'))} MiB of buffers; scale divisions in "
                    f"{t.get('division', '?')}.")
        if q and t.get("device") and q.get("device") and t.get("device") != q.get("device"):
            meta.append(f"- **warning**: the two files come from different devices ({q.get('device')} vs {t.get('device')}).")
    else:
        meta.append("- torch baselines: `torch_baselines.json` not found.")
    meta.append(plot_note)
    lines += meta + [""]

    # ---- per recipe ----
    lines += ["## qforge, per recipe", ""]
    if q_results:
        lines.append("`% of copy` = achieved GB/s over the device-to-device copy bandwidth (the entry's "
                     "`ratio`); `bytes` is the benchmark's minimal traffic (input once per pass, "
                     "every output once); `time` is device time per call (calls back to back, so at "
                     "small sizes the slower of the host's launch work and the GPU's); small sizes, "
                     "where measured: `host` is the host wall time of the call alone, `graph` the "
                     "device time per call replayed from a CUDA graph (no host launch work), "
                     "`call+sync` the host wall time of one call plus a stream sync.")
        floor = q.get("launch_floor") or {}
        parts = []
        for kind in ("plain", "cooperative"):
            f = floor.get(kind) or {}
            if f:
                parts.append(f"{kind} launch: host {fmt(num(f.get('host_us')))} us, back to back "
                             f"{fmt(num(f.get('b2b_us')))} us, in a graph {fmt(num(f.get('graph_us')))} us, "
                             f"launch + sync {fmt(num(f.get('e2e_us')))} us")
        if parts:
            lines.append("")
            lines.append("Floors (an empty kernel with the quantize kernels' parameters, same run): " + "; ".join(parts) + ".")
        lines.append("")
        by_recipe = OrderedDict()
        for e in q_results:
            by_recipe.setdefault(recipe_key(e.get("recipe")), []).append(e)
        for rec, es in by_recipe.items():
            es = sorted(es, key=lambda e: (str(e.get("role")), str(e.get("usage")), str(e.get("directions")),
                                           bool(e.get("grouped") or e.get("groups")), input_bytes(e) or 0))
            rows = []
            has_e2e = any(num(e.get("e2e_us")) is not None for e in es)
            has_graph = any(num(e.get("graph_us")) is not None for e in es)
            has_form = any(e.get("form") for e in es)
            for e in es:
                r = q_ratio(e, copy_gbps)
                row = [e.get("role", "-"), e.get("usage", "-"), e.get("directions", "-"), shape_str(e),
                       fmt_bytes(input_bytes(e)), e.get("kernels", "-"), fmt(q_time_us(e)),
                       fmt_bytes(num(e.get("bytes"))), fmt(q_gbps(e), "{:.0f}"),
                       fmt(None if r is None else 100 * r, "{:.1f}")]
                if has_e2e:
                    row += [fmt(num(e.get("host_us"))), fmt(num(e.get("e2e_us")))]
                if has_graph:
                    row.append(fmt(num(e.get("graph_us"))))
                if has_form:  # what a direct call runs: the one-pass row kernel, the one-launch fused
                    # kernel or separate launches; ", interior" where a program for interior tiles only served it
                    form = {"row_pass": "one pass", "one_launch": "one launch", "separate": "separate"}.get(e.get("form"), "-")
                    row.append(form + (", interior" if e.get("tiles") == "interior" else ""))
                rows.append(row)
            headers = (["role", "usage", "directions", "shape", "input MiB", "kernels", "time (us)",
                        "bytes MiB", "GB/s", "% of copy"] + (["host (us)", "call+sync (us)"] if has_e2e else []) +
                       (["graph (us)"] if has_graph else []) + (["form"] if has_form else []))
            lines += [f"### {rec}", "",
                      md_table(headers, rows, ["l", "l", "l", "l"] + ["r"] * (len(headers) - 4)), ""]
    else:
        lines += ["No qforge results.", ""]

    # ---- torch comparison ----
    lines += ["## qforge vs torch.compile vs torch eager", ""]
    if t_results:
        lines.append("Microseconds per call. qforge: device time per call (`time_us`). torch `GPU`: the "
                     "calls replayed from a CUDA graph, i.e. GPU time without launch overhead (where that "
                     "timing is missing, the per-call time, marked `*`); torch `call`: each call timed "
                     "with CUDA events, Python/launch overhead included (torch.compile's guards + wrapper "
                     "cost tens of microseconds, so small sizes are CPU-bound there). Ratios = torch GPU "
                     "time / qforge time (> 1: qforge faster). GB/s use each side's own `bytes`. `agree`: "
                     "torch's outputs were bit-identical to `qforge quantize` on the check shape "
                     "(compile/eager; `-` = not checked).")
        lines.append("")
        groups = OrderedDict()
        for r in t_results:
            key = (r.get("case"), tuple(r.get("shape") or ()))
            groups.setdefault(key, {})[r.get("impl")] = r
        rows = []
        for (case, shape), impls in groups.items():
            any_r = next(iter(impls.values()))
            e, c = impls.get("torch_eager"), impls.get("torch_compile")
            qe = find_qforge(q_results, any_r)
            qt = q_time_us(qe) if qe else None

            def call_us(r):
                v = num(r.get("time_ms")) if r else None
                return None if v is None else v * 1e3

            def gpu_us(r):
                v = num(r.get("graph_time_ms")) if r else None
                return (v * 1e3, False) if v is not None else (call_us(r), True)

            def cell(r, v, star=False):
                if v is not None:
                    return fmt(v) + ("*" if star else "")
                return "error" if (r is not None and r.get("error")) else "-"

            def ratio(v):
                return fmt(v / qt if (v is not None and qt) else None, "{:.2f}x")

            def gbps(r, v):
                b = num(r.get("bytes")) if r else None
                return fmt(b / (v * 1e-6) / 1e9 if (b and v) else None, "{:.0f}")

            def agree(r):
                if r is None:
                    return "-"
                a = r.get("agreement_ok")
                s_ = "-" if a is None else ("yes" if a else "**NO**")
                if r.get("equal_to_eager") is False:
                    s_ += " (!= eager)"
                return s_

            cg, cstar = gpu_us(c)
            eg, estar = gpu_us(e)
            shp = "x".join(str(v) for v in shape)
            rows.append([case, any_r.get("usage", "-"), shp, fmt(qt), cell(c, cg, cstar), cell(e, eg, estar),
                         ratio(cg), ratio(eg), cell(c, call_us(c)), cell(e, call_us(e)),
                         fmt(q_gbps(qe) if qe else None, "{:.0f}"), gbps(c, cg), gbps(e, eg),
                         f"{agree(c)}/{agree(e)}"])
        lines += [md_table(["case", "usage", "shape", "qforge us", "compile GPU us", "eager GPU us",
                            "compile/qforge", "eager/qforge", "compile call us", "eager call us",
                            "qforge GB/s", "compile GB/s", "eager GB/s", "agree"], rows,
                           ["l", "l", "l"] + ["r"] * 10 + ["l"]), ""]
        cases = (t or {}).get("cases") or {}
        if cases:
            lines.append("Cases (role `linear:input`, bf16 input):")
            for name, cdesc in cases.items():
                lines.append(f"- `{name}`: `{cdesc.get('recipe_file', cdesc.get('recipe'))}`, usage "
                             f"{cdesc.get('usage')}, {cdesc.get('directions')}"
                             + (f" (columnwise layout {cdesc['columnwise_layout']})" if cdesc.get("columnwise_layout") else "")
                             + f"; outputs {', '.join(cdesc.get('outputs', []))}; {cdesc.get('input_passes')} input pass(es).")
            lines.append("")
        if t and t.get("bytes_formula"):
            lines += [f"torch `bytes`: {t['bytes_formula']}", ""]
        unmatched = sum(1 for row in rows if row[3] == "-")
        if q_results and unmatched:
            lines += [f"{unmatched} torch rows have no qforge entry with the same recipe, role, usage/directions "
                      f"and shape (bf16, not grouped).", ""]
    else:
        lines += ["No torch results.", ""]

    # ---- agreement ----
    agr = (t or {}).get("agreement", [])
    if agr:
        lines += ["## Agreement check (torch vs `qforge quantize`, byte for byte)", ""]
        rows = []
        for a in agr:
            bufs = a.get("buffers", {})
            mism = ", ".join(f"{k}: {v.get('mismatches')}/{v.get('elements')}" for k, v in bufs.items())
            extra = []
            if a.get("missing_in_torch"):
                extra.append("not produced by torch: " + ", ".join(a["missing_in_torch"]))
            if a.get("missing_in_qforge"):
                extra.append("not written by qforge: " + ", ".join(a["missing_in_qforge"]))
            if a.get("error"):
                extra.append("error: " + str(a["error"]).splitlines()[0][:200])
            ok = a.get("ok")
            rows.append([a.get("case", "-"), "x".join(str(v) for v in a.get("shape", [])), a.get("dataset", "-"),
                         a.get("impl", "-"), a.get("qforge_device", "-"),
                         "-" if ok is None else ("yes" if ok else "**NO**"), mism or "-", "; ".join(extra) or ""])
        lines += [md_table(["case", "shape", "input", "impl", "qforge device", "equal", "mismatches / elements",
                            "notes"], rows, ["l", "l", "l", "l", "l", "l", "l", "l"]), ""]
        lines += ["Inputs: `normal` = bf16(randn), `wide` = bf16(randn * 2^U{-20..20}); all finite "
                  "(torch's casts differ from docs/numerics.md only for NaN: NaN keeps its sign, 0xFF, "
                  "where qforge writes 0x7F).", ""]

    st = (t or {}).get("op_selftest")
    if isinstance(st, dict):
        lines += ["## Numerics self-test of the torch helpers (edge values vs tests/numerics/quantize_ref.py)", ""]
        if st.get("error"):
            lines += [f"Not run: {str(st['error']).splitlines()[0][:300]}", ""]
        rows = []
        for impl in ("torch_eager", "torch_compile"):
            res = st.get(impl)
            if not isinstance(res, dict):
                continue
            if "error" in res:
                rows.append([impl, "error: " + str(res["error"]).splitlines()[0][:200]])
                continue
            bad = {k: v.get("mismatches") for k, v in res.items() if isinstance(v, dict) and v.get("mismatches")}
            total = sum(v.get("elements", 0) for v in res.values() if isinstance(v, dict))
            rows.append([impl, "all equal (%d values)" % total if not bad else
                         "**mismatches**: " + ", ".join(f"{k}: {n}" for k, n in bad.items())])
        if rows:
            lines += [md_table(["impl", "result"], rows, ["l", "l"]), ""]

    # ---- problems ----
    probs = []
    for r in t_results:
        if r.get("error"):
            probs.append(f"- torch {r.get('case')} {r.get('shape')} {r.get('impl')}: "
                         f"{str(r['error']).splitlines()[0][:300]}")
        if r.get("graph_error"):
            probs.append(f"- torch {r.get('case')} {r.get('shape')} {r.get('impl')} (CUDA graph timing): "
                         f"{str(r['graph_error']).splitlines()[0][:300]}")
    for s in (t or {}).get("skipped", []):
        probs.append(f"- skipped: torch {s.get('case')} {s.get('shape')} {s.get('impl')}: {s.get('reason')}")
    for s in (t or {}).get("errors", []):
        probs.append(f"- torch {s.get('case', '')} {s.get('stage', '')}: {str(s.get('error')).splitlines()[0][:300]}")
    for e in q_results:
        if e.get("error"):
            probs.append(f"- qforge {e.get('recipe')} {e.get('role')} {shape_str(e)}: {e['error']}")
    if probs:
        lines += ["## Errors and skipped measurements", ""] + probs + [""]
    return "\n".join(lines)


def make_plot(q, t, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"- `bandwidth.png` not written: matplotlib is not available ({e})."

    q_results = [e for e in (q or {}).get("results", []) if isinstance(e, dict)]
    copy_gbps = num((q or {}).get("copy_gbps"))
    t_results = [r for r in (t or {}).get("results", []) if isinstance(r, dict) and num(r.get("time_ms")) is not None]
    have_torch = bool(t_results)
    ncols = 2 if (have_torch and q_results) else 1
    if not q_results and not have_torch:
        return "- `bandwidth.png` not written: no results."
    fig, axes = plt.subplots(1, ncols, figsize=(8 * ncols, 6), squeeze=False)

    def yval(gbps, ratio=None):
        if ratio is not None:
            return 100 * ratio
        if copy_gbps and gbps is not None:
            return 100 * gbps / copy_gbps
        return gbps

    ylabel = "% of device copy bandwidth" if copy_gbps else "GB/s"

    ax = axes[0][0]
    if q_results:
        series = defaultdict(list)
        gseries = defaultdict(list)
        for e in q_results:
            x = input_bytes(e)
            y = yval(q_gbps(e), q_ratio(e, copy_gbps) if copy_gbps or num(e.get("ratio")) is not None else None)
            if x is None or y is None:
                continue
            label = f"{recipe_key(e.get('recipe'))} {e.get('role', '')} {e.get('usage') or e.get('directions') or ''}".strip()
            (gseries if (e.get("grouped") or e.get("groups")) else series)[label].append((x / 2**20, y))
        cmap = plt.get_cmap("tab20")
        labels = sorted(set(series) | set(gseries))
        for i, label in enumerate(labels):
            col = cmap(i % 20)
            pts = sorted(series.get(label, []))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=col, label=label, ms=4, lw=1.2)
            gp = sorted(gseries.get(label, []))
            if gp:
                ax.plot([p[0] for p in gp], [p[1] for p in gp], "x", color=col, ms=8, mew=2,
                        label=None if pts else label + " (grouped)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("input size (MiB)")
        ax.set_ylabel(ylabel)
        if copy_gbps:
            ax.axhline(100, color="gray", lw=0.8, ls="--")
        ax.set_title(f"qforge: achieved bandwidth ({(q or {}).get('device', '?')}; x = grouped)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
        ax = axes[0][1] if ncols == 2 else None

    if have_torch and ax is not None:
        by_case = defaultdict(lambda: defaultdict(list))
        for r in t_results:
            x = r.get("input_bytes") or (r["shape"][0] * r["shape"][1] * 2)
            g = num(r.get("graph_gbps"))
            by_case[r.get("case")][r.get("impl")].append((x / 2**20, yval(g if g is not None else num(r.get("gbps")))))
            if r.get("impl") == "torch_eager":
                qe = find_qforge(q_results, r)
                if qe is not None:
                    y = yval(q_gbps(qe), q_ratio(qe, copy_gbps) if copy_gbps or num(qe.get("ratio")) is not None else None)
                    if y is not None:
                        by_case[r.get("case")]["qforge"].append((x / 2**20, y))
        cmap = plt.get_cmap("tab10")
        styles = {"qforge": "o-", "torch_compile": "s--", "torch_eager": "^:"}
        for i, (case, impls) in enumerate(sorted(by_case.items(), key=lambda kv: str(kv[0]))):
            for impl in ("qforge", "torch_compile", "torch_eager"):
                pts = sorted(p for p in impls.get(impl, []) if p[1] is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[impl], color=cmap(i % 10),
                            label=f"{case} {impl.replace('torch_', '')}", ms=4, lw=1.2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("input size (MiB)")
        ax.set_ylabel(ylabel + (" (each with its own bytes)" if copy_gbps else ""))
        if copy_gbps:
            ax.axhline(100, color="gray", lw=0.8, ls="--")
        ax.set_title("qforge (solid) vs torch.compile (dashed) vs eager (dotted); torch: GPU time")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)

    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return f"- plot: `{Path(path).name}` (log-x input size; y = {ylabel})."


def load_jsonl(path):
    """JSON lines (gemm.jsonl); None when the file is missing, bad lines skipped with a warning."""
    path = Path(path)
    if not path.exists():
        return None
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            warn(f"{path.name}:{i + 1}: not JSON ({e}); skipped")
    return out


def gemm_section(records):
    """Markdown for the grouped-GEMM records of scripts/bench.sh (qforge gemm --json, torch
    baselines): TFLOP/s per shape, and each qforge kernel as a ratio to torch's grouped fp8 GEMM
    (default accumulation), to cuBLAS dense fp8 (tensorwise) at the same FLOPs, to qforge's own
    blockwise kernel on the same shape (the MXFP8 and NVFP4 GEMM goals are stated that way), and each
    wgrad (K-grouped) to the fprop of the same scaling, route and accumulation at the same FLOPs
    (the wgrad goal; whatever the two scale layouts and outputs: the shipped recipes pair
    mn_major wgrad grids with compact fprop ones). A file of several rounds pairs each record with
    its own round's baselines: the torch run that follows it (the scripts run torch after qforge), the qforge
    blockwise / fprop record that precedes it (each falling back to the nearest one the other way)."""
    recs = [(i, r) for i, r in enumerate(records) if isinstance(r, dict)]
    q = [(i, r) for i, r in recs if "gemm" in r and isinstance(r.get("bench"), dict)]
    t = [(i, r) for i, r in recs if "kernel" in r and "tflops" in r]
    if not q and not t:
        return []
    lines = ["## Grouped GEMM (TFLOP/s, median of CUDA-event timings)", ""]

    def shape_key(g, rows, n, k):
        return (int(g), int(rows), int(n), int(k))

    def nearest(cands, i, after):
        """The value of the first candidate (index, value) after i (after=True) or the last one at
        or before i (a record is its own round's), else the nearest one on the other side; None
        without candidates."""
        later = [v for j, v in cands if j > i and v]
        earlier = [v for j, v in cands if j <= i and v]
        first, other = (later[:1], earlier[-1:]) if after else (earlier[-1:], later[:1])
        pick = first or other
        return pick[0] if pick else None

    torch_runs = {}  # (shape, kernel) -> [(index, TFLOP/s)]
    for i, r in t:
        key = shape_key(r["groups"], r["groups"] * r["m"], r["n"], r["k"])
        torch_runs.setdefault((key, r["kernel"]), []).append((i, num(r["tflops"])))

    def scaling_of(r):  # records before the "scaling" field: the word after the formats
        if r.get("scaling"):
            return r["scaling"]
        words = re.sub(r"\([^)]*\)", "", r["gemm"].split(" N=")[0].split(" k-grouped")[0]).split()
        return words[-1] if words else ""

    def flops(r):  # M-grouped: rows x N x K; K-grouped: tokens x M x N
        groups = r.get("groups", [])
        other = r.get("m", 0) if str(r.get("layout", "")).startswith("k_grouped") else r.get("k", 0)
        return 2 * sum(groups) * r.get("n", 0) * other

    def kind(r):
        return (scaling_of(r), r.get("route", "fused"), bool(r.get("fast_accum", False)), flops(r))

    fprops = {}  # kind -> [(index, TFLOP/s)] of the M-grouped contiguous records
    blockwise = {}  # shape -> [(index, TFLOP/s)]
    for i, r in q:
        groups = r.get("groups", [])
        if r.get("layout") == "contiguous":
            fprops.setdefault(kind(r), []).append((i, num(r["bench"].get("tflops"))))
        if not str(r.get("layout", "")).startswith("k_grouped") and scaling_of(r) == "blockwise":
            key = shape_key(len(groups), sum(groups), r.get("n", 0), r.get("k", 0))
            blockwise.setdefault(key, []).append((i, num(r["bench"].get("tflops"))))
    rows = []
    for i, r in q:
        b = r["bench"]
        groups = r.get("groups", [])
        if str(r.get("layout", "")).startswith("k_grouped"):  # k_grouped, k_grouped_members
            members = " (per-member copies)" if r.get("layout") == "k_grouped_members" else ""
            shape = f"wgrad{members} {len(groups)} x {sum(groups)} tokens, M {r.get('m')} N {r.get('n')}"
            key = None
            fprop = nearest(fprops.get(kind(r), []), i, after=False)
        else:
            total = sum(groups)
            shape = f"{len(groups)} x {total // max(len(groups), 1)} x N {r.get('n')} x K {r.get('k')}"
            key = shape_key(len(groups), total, r.get("n", 0), r.get("k", 0))
            fprop = None
        tg = nearest(torch_runs.get((key, "_scaled_grouped_mm fp8 rowwise"), []), i, after=True)
        td = nearest(torch_runs.get((key, "_scaled_mm fp8 tensorwise (dense)"), []), i, after=True)
        tf = num(b.get("tflops"))
        tb = nearest(blockwise.get(key, []), i, after=False) if key else None
        rows.append([shape, r["gemm"].split(" N=")[0].split(" k-grouped")[0], fmt(tf, "{:.0f}"),
                     fmt(tf / tg if tf and tg else None, "{:.2f}x"), fmt(tf / td if tf and td else None, "{:.0%}"),
                     fmt(tf / tb if tf and tb else None, "{:.0%}"),
                     fmt(tf / fprop if tf and fprop else None, "{:.0%}")])
    if rows:
        lines.append(md_table(["shape (groups x rows x N x K)", "qforge kernel", "TFLOP/s",
                               "vs torch _scaled_grouped_mm", "of cuBLAS dense fp8", "of qforge blockwise",
                               "wgrad: of its fprop"], rows, align=["l", "l", "r", "r", "r", "r", "r"]))
        lines.append("")
    trows = []  # every run of each torch kernel, in file order (the rounds of a multi-round file)
    for (key, name), runs in sorted(torch_runs.items(), key=lambda kv: (kv[0][0], kv[1][0][0])):
        g, total, n, k = key
        trows.append([f"{g} x {total // g} x N {n} x K {k}", f"torch {name}",
                      " / ".join(fmt(tf, "{:.0f}") for _, tf in runs)])
    if trows:
        lines.append(md_table(["shape", "torch kernel", "TFLOP/s (each run)"], trows, align=["l", "l", "r"]))
        lines.append("")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in", dest="indir", required=True, help="directory with qforge_bench.json and/or torch_baselines.json")
    ap.add_argument("--out", required=True, help="output directory (report.md, bandwidth.png)")
    ap.add_argument("--qforge-json", default=None, help="default: IN/qforge_bench.json")
    ap.add_argument("--torch-json", default=None, help="default: IN/torch_baselines.json")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)

    indir = Path(args.indir)
    q = load_json(args.qforge_json or indir / "qforge_bench.json")
    t = load_json(args.torch_json or indir / "torch_baselines.json")
    gemm = load_jsonl(indir / "gemm.jsonl")
    if q is None and t is None and not gemm:
        print(f"report.py: none of qforge_bench.json, torch_baselines.json, gemm.jsonl found in {indir}", file=sys.stderr)
        return 2
    if q is not None and not isinstance(q.get("results", []), list):
        warn("qforge_bench.json: 'results' is not a list; ignored")
        q = dict(q, results=[])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.no_plot:
        note = "- plot: not requested (--no-plot)."
    else:
        try:
            note = make_plot(q, t, out / "bandwidth.png")
        except Exception as e:  # noqa: BLE001
            note = f"- `bandwidth.png` not written: plotting failed ({type(e).__name__}: {e})."
            warn(note)
    text = build_report(q, t, note)
    if gemm:
        text += "\n\n" + "\n".join(gemm_section(gemm))
    (out / "report.md").write_text(text + "\n")
    print(f"wrote {out / 'report.md'}" + ("" if "not written" in note or args.no_plot else f" and {out / 'bandwidth.png'}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
