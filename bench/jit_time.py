#!/usr/bin/env python3
"""Where NVRTC spends the time of qforge's JIT compiles, without a GPU (docs/jit.md).

  jit_time.py [--cache DIR] [--templates DIR] [--filter S] [--phases] [--extra "OPTS"]... [--reps N]
              [--base-templates DIR] [--instructions] [--per-kernel] [--whole BASE_CACHE] [--trace]
              [--hits LOG] [--first-call JSON]...

Takes every CUBIN entry of a qforge kernel cache (DIR, default $QFORGE_CACHE_DIR; fill it first
with `qforge prewarm`), and compiles its source.cu again with NVRTC in this process, the device
headers given in memory as qforge gives them (TEMPLATES, default this checkout's templates/),
with the entry's own options. Times are CPU seconds of this process (getrusage: every NVRTC
thread counted), which other processes' load on the machine barely changes, plus wall seconds.

  --phases      also the front end alone (--fdevice-syntax-only) and front end + NVVM (to PTX),
                so the table splits a compile into front end / NVVM optimizer / ptxas
  --extra OPTS  also compile with these options added (space separated; repeatable; CPU/wall ms) and say
                whether the CUBIN's code sections are byte-identical to the entry's own image
                (as bench/sass_diff.py compares them; NVRTC's per-compile internal names
                normalized)
  --nvrtc-time  add NVRTC's own per-phase table (--time=FILE) of the first rep, as reported
  --trace       one more compile with -fdevice-time-trace=FILE, split into shares of its traced time:
                front end; NVVM on the kernels' own bodies, everything inlined into them (optimizer
                and code generation); NVVM on every other function (the device helpers and lambdas,
                each optimized on its own before it is inlined); the rest of NVVM (libdevice link,
                module-level passes); ptxas. The trace's times are wall times, so only the shares
                are printed (scaled to this compile's CPU ms in the summary)
  --base-templates DIR
                an A/B of a header change: each entry is also compiled against the device headers
                of DIR (e.g. `git archive REV templates | tar -x -C /tmp/base`, then
                /tmp/base/templates), alternating base and new compile by compile so that the
                machine's load falls on both alike; the "base" column and summary are those, and
                each row says whether the code sections are the same both ways ("=") or not ("!")
  --instructions
                also count each image's SASS instructions (nvdisasm: $NVDISASM, PATH, the toolkit or
                pip's nvidia-cuda-nvdisasm), with --base-templates the base image's too: the code a
                compile produced, which moves with its ptxas time, as a figure that does not depend on
                the machine's load (docs/jit.md, step 7)
  --per-kernel  also compile each of an entry's kernels (name expressions) as a program of its
                own: a column per kernel kind (cast_kernel, cast_fused_kernel, amax_kernel, fused_kernel, ...)
  --whole BASE_CACHE
                a quantize plan's forms against the one program an older build compiled for it:
                each quantize entry of BASE_CACHE (cast, amax and fused kernels in one program)
                compiled alternately with the entries of this cache that hold its kernels (the
                separate and one-launch forms; kernels matched as bench/sass_diff.py matches
                them: arch, options, name expression and the configs it names); per plan the
                CPU ms of each and each form's share of the whole program, then per form the
                median / max / sum and the shares' median and range
  --plans BASE_CACHE
                a build against an older one, plan by plan: each entry of this cache compiled
                alternately with the entry of BASE_CACHE (an older build's prewarm) for the same
                plan and program (kind and metadata: recipe, role, usage, input, tiles), that one
                against --base-templates (the older build's headers; else TEMPLATES), one core;
                per pair the CPU ms both ways and whether the sources differ, then median / max /
                sum of the pairs whose source changed, of the others, and of all (docs/jit.md,
                step 10)
  --hits LOG    a `QFORGE_LOG_LEVEL=debug` log of `qforge prewarm` over the same cache once it
                is full: each kernel's cache hit (lookup, metadata and image read, SHA-256 check),
                in ms, goes into the last table (scripts/jit_report.sh passes it)
  --first-call JSON
                bench/first_call.py's --json output (repeatable): the median first call per API and
                cache state (shipped root / warm cache / empty cache) goes into the last table, on
                the row of the program the calls took (scripts/jit_report.sh on a GPU host)

A quantize entry's kind is "quantize" for a plan's complete program and "quantize/separate" for
the separate form of a plan with the one-launch fused kernel (docs/jit.md, step 5).

Prints one row per kernel (CPU ms) and a summary: median, max and sum per kind of kernel (of
CPU ms, and of wall ms where it says "wall"); last, a markdown table per kind of kernel: the cold
compile's median and max, with --hits the warm start's cache hit, with --first-call the first calls.
"""
import argparse
import ctypes
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_diff  # noqa: E402  (load_nvrtc, code_sections, read_entries)

REPO = Path(__file__).resolve().parent.parent


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def headers(templates):
    """[(name, text)] of every device header, named as qforge embeds them ("qforge/cast.cuh")."""
    out = []
    for p in sorted(Path(templates).rglob("*.cuh")):
        out.append((str(p.relative_to(templates)), p.read_text()))
    return out


def compile_once(nvrtc, source, options, names, hdrs, want="cubin"):
    """(cpu s, wall s, image bytes or b"")."""
    prog = ctypes.c_void_p()
    n = len(hdrs)
    texts = (ctypes.c_char_p * n)(*[t.encode() for _, t in hdrs])
    hnames = (ctypes.c_char_p * n)(*[h.encode() for h, _ in hdrs])
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"qforge_kernel.cu", n, texts, hnames) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        for e in names:
            nvrtc.nvrtcAddNameExpression(prog, e.encode())
        arr = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        c0, w0 = cpu_seconds(), time.perf_counter()
        r = nvrtc.nvrtcCompileProgram(prog, len(options), arr)
        cpu, wall = cpu_seconds() - c0, time.perf_counter() - w0
        if r != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"compile failed ({' '.join(options)}):\n{log.value.decode(errors='replace')[:2000]}")
        image = b""
        if want == "cubin":
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetCUBIN(prog, buf)
            image = buf.raw
        return cpu, wall, image
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def sass_instructions(listing):
    """Instructions in an nvdisasm listing (sass_diff.disassemble's normalized text): the lines
    that end a statement with ';', not directives ('.section ...') or labels."""
    return sum(1 for line in listing.splitlines() if line.rstrip().endswith(";") and not line.lstrip().startswith("."))


def best(nvrtc, reps, *args, **kw):
    runs = [compile_once(nvrtc, *args, **kw) for _ in range(reps)]
    return min(r[0] for r in runs), min(r[1] for r in runs), runs[0][2]


def entries(cache, text_filter=""):
    out = []
    for d, meta, source, image in sass_diff.read_entries(cache):
        if meta.get("kind") != "cubin":
            continue
        md = meta.get("metadata", {})
        kind = md.get("kind", "?")
        # A program that is part of a plan's (its first line names its form): "quantize/separate".
        # A plan's complete program (form "all", or the separate form of a plan without the fused
        # kernel, whose first line names none) stays "quantize", as every entry of older builds.
        form = md.get("form", "")
        if kind == "quantize" and form and f"its {form} form" in source.split("\n", 1)[0]:
            kind += "/" + form
        # A program for interior tiles only (codegen.h Tiles): "quantize/interior", ".../separate/interior".
        if kind.startswith("quantize") and md.get("tiles") == "interior":
            kind += "/interior"
        label = " ".join(str(v) for k, v in sorted(md.items()) if k not in ("kind", "form"))
        if text_filter and text_filter not in f"{kind} {label}":
            continue
        names = list(meta.get("lowered_names", {}).keys())
        # A name expression's kind: the template's name ("qf::cast_kernel<...>" -> cast_kernel).
        kinds = [x.split("<", 1)[0].split("::")[-1] for x in names]
        out.append(dict(kind=kind, label=label, source=source, image=image, options=meta.get("options", []),
                        names=names, kinds=kinds, key=meta.get("key", "")[:12],
                        target=meta.get("target", meta.get("arch", "?"))))
    return out


HIT_LINE = re.compile(r"(?:disk cache|memory cache|shipped kernel [^:]*) hit: .* in ([0-9.]+) ms \(key ([0-9a-f]+)\)")


def cache_hits(path):
    """--hits: {key (12 hex digits): ms} of each cache hit a qforge debug log reports (runtime/kernel_cache.cpp:
    the lookup, the entry's metadata and image read, the image's SHA-256 checked)."""
    hits = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = HIT_LINE.search(line)
            if m:
                hits[m.group(2)[:12]] = float(m.group(1))
    return hits


def first_calls(paths):
    """--first-call: {kind: {api: {state: median ms}}} of bench/first_call.py's JSON files, a row's kind the
    program its call took (quantize/interior for whole tiles, quantize for any)."""
    import first_call
    rows = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        rows += [dict(r, states=doc["states"]) for r in doc["rows"]]
    first_call.fill_tiles(rows)  # across the files: torch rows take the C++ rows' tiles
    ms = {}
    for r in rows:
        kind = "quantize/interior" if r["tiles"] == "interior" else "quantize"
        for st in r["states"]:
            ms.setdefault(kind, {}).setdefault(r["api"], {}).setdefault(st, []).append(r[st]["first_ms"])
    return {k: {a: {st: statistics.median(v) for st, v in sts.items()} for a, sts in apis.items()}
            for k, apis in ms.items()}


FIRST_STATES = ("shipped", "warm", "cold")


def latency_table(per_kind, hits, es, first=None):
    """The table the README's JIT figures come from: per kernel kind, the cold compile (CPU ms, one core) and,
    with --hits, a warm start's cache hit (ms); with --first-call, the first call's median per API and cache
    state (bench/first_call.py)."""
    hit_kind = {}
    for e in es:
        if e["key"] in hits:
            for kind in (e["kind"], "all"):
                hit_kind.setdefault(kind, []).append(hits[e["key"]])
    states = [st for st in FIRST_STATES if any(st in sts for apis in (first or {}).values() for sts in apis.values())]
    print("\nLatency per kernel kind, ms (cold compile: CPU ms on one core; warm: a disk cache hit, --hits" +
          ("; first call: the median of the shipped plans' first calls, fresh process, per API, " + " / ".join(
              {"shipped": "from a shipped root", "warm": "from a warm cache", "cold": "with an empty cache"}[st]
              for st in states) if first is not None else "") + ")")
    print("| kind | n | cold compile median / max | warm hit median / max |" + (" first call |" if first is not None else ""))
    print("|---|---|---|---|" + ("---|" if first is not None else ""))
    for kind, recs in sorted(per_kind.items(), key=lambda kv: kv[0] == "all"):
        v, h = recs["cubin"], hit_kind.get(kind, [])
        warm = f"{statistics.median(h):.2f} / {max(h):.2f}" if h else "-"
        row = f"| {kind} | {len(v)} | {statistics.median(v) * 1000:.0f} / {max(v) * 1000:.0f} | {warm} |"
        if first is not None:
            apis = first.get(kind, {})
            row += " " + ("; ".join(f"{api} " + " / ".join(f"{sts[st]:.1f}" if st in sts else "-" for st in states)
                                    for api, sts in sorted(apis.items())) or "-") + " |"
        print(row)


def nvrtc_phase_table(nvrtc, e, hdrs):
    with tempfile.NamedTemporaryFile("r", suffix=".csv") as f:
        compile_once(nvrtc, e["source"], e["options"] + [f"--time={f.name}"], e["names"], hdrs)
        rows = [line.split(",") for line in f.read().splitlines()[1:]]
    return "; ".join(f"{r[1].strip()} {r[2].strip()} ms" for r in rows if len(r) >= 4)


TRACE_PARTS = ("front end", "nvvm kernels", "nvvm helpers", "nvvm rest", "ptxas")


def trace_shares(nvrtc, e, hdrs):
    """--trace: {part: share of the traced time} of one compile (TRACE_PARTS)."""
    with tempfile.TemporaryDirectory() as d:
        base = os.path.join(d, "trace")
        compile_once(nvrtc, e["source"], e["options"] + [f"-fdevice-time-trace={base}"], e["names"], hdrs)
        path = base if os.path.exists(base) else base + ".json"  # NVRTC appends ".json"
        with open(path) as f:
            return trace_parts(json.load(f), e["names"])


def trace_parts(trace, names):
    """Shares of TRACE_PARTS in NVRTC's Chrome trace (-fdevice-time-trace) of a program whose
    kernels are the name expressions NAMES ("qf::cast_kernel<...>"). NVVM's "OptFunction" events
    (optimizer and code generation) name the function worked on, mangled; a kernel's own events
    are its body with its callees inlined, every other function's (a lambda in a kernel is
    _ZZN<kernel>...) a helper's before it is inlined."""
    ev = [x for x in (trace["traceEvents"] if isinstance(trace, dict) else trace) if x.get("ph") == "X"]
    # qf::cast_kernel<...> is mangled _ZN2qf11cast_kernelI...: the name's length, the name, "I".
    marks = {f"{len(k)}{k}I" for k in (n.split("<", 1)[0].split("::")[-1] for n in names)}

    def total(name, pred=lambda x: True):
        return sum(x["dur"] for x in ev if x["name"] == name and pred(x))

    def is_kernel(x):
        detail = x.get("args", {}).get("detail", "")
        return detail.startswith("_ZN") and any(m in detail[:48] for m in marks)

    opt = total("OptFunction")
    kern = total("OptFunction", is_kernel)
    parts = {"front end": total("CUDA C++ Front-End"), "nvvm kernels": kern, "nvvm helpers": opt - kern,
             "nvvm rest": total("LibNVVM") - opt, "ptxas": total("Total PTXAS Time")}
    whole = sum(parts.values()) or 1
    return {k: v / whole for k, v in parts.items()}


def identities(e):
    """The kernels of an entry, as bench/sass_diff.py identifies them."""
    structs = sass_diff.gen_structs(e["source"])
    return {sass_diff.kernel_identity(e["target"], e["options"], n, structs) for n in e["names"]}


def whole_vs_forms(nvrtc, hdrs, base_es, es, reps):
    """--whole: each base program against the forms that hold its kernels, alternately."""
    forms = [(e, identities(e)) for e in es if e["kind"].startswith("quantize")]
    per_form, shares, wholes = {}, {}, []
    unmatched = 0
    print(f"{'key':<12} {'whole':>7}  forms (CPU ms, share of the whole)  label")
    for n, b in enumerate(b for b in base_es if b["kind"] == "quantize"):
        bid = identities(b)
        parts = sorted((e for e, ids in forms if ids and ids <= bid), key=lambda e: e["kind"])
        if not parts or set().union(*(identities(e) for e in parts)) != bid:
            unmatched += 1
            print(f"{b['key']:<12} (no forms in this cache hold exactly its kernels)  {b['label']}")
            continue
        times = {}
        order = [None] + parts if n % 2 == 0 else parts + [None]  # alternate who goes first
        for e in order:
            if e is None:
                whole = best(nvrtc, reps, b["source"], b["options"], b["names"], hdrs)[0]
            else:
                times[e["kind"]] = best(nvrtc, reps, e["source"], e["options"], e["names"], hdrs)[0]
        wholes.append(whole)
        cells = []
        for kind, t in sorted(times.items()):
            per_form.setdefault(kind, []).append(t)
            shares.setdefault(kind, []).append(t / whole)
            cells.append(f"{kind.split('/')[-1]} {t * 1000:.0f} ({t / whole:.2f})")
        if len(times) > 1:
            both = sum(times.values())
            per_form.setdefault("both forms", []).append(both)
            shares.setdefault("both forms", []).append(both / whole)
        print(f"{b['key']:<12} {whole * 1000:7.0f}  {'; '.join(cells)}  {b['label']}", flush=True)
    print("\nCPU ms per compile: median / max / sum; share of the whole program: median (min-max)")
    print(f"  {'whole program':<26} n={len(wholes):<4} {statistics.median(wholes) * 1000:.0f} / "
          f"{max(wholes) * 1000:.0f} / {sum(wholes) * 1000:.0f}" if wholes else "  no plan matched")
    for kind, v in sorted(per_form.items()):
        sh = shares[kind]
        print(f"  {kind:<26} n={len(v):<4} {statistics.median(v) * 1000:.0f} / {max(v) * 1000:.0f} / "
              f"{sum(v) * 1000:.0f}; share {statistics.median(sh):.2f} ({min(sh):.2f}-{max(sh):.2f})")
    if unmatched:
        print(f"{unmatched} program(s) of the base cache without their forms here")
    return 1 if unmatched or not wholes else 0


def pair_by_plan(base_es, es):
    """--plans: [(base entry, entry)] of the entries of both caches with the same kind and label
    (the plan and program), in the order of ES; and the labels of ES without a partner."""
    base = {(b["kind"], b["label"]): b for b in base_es}
    pairs, alone = [], []
    for e in es:
        b = base.get((e["kind"], e["label"]))
        if b is None:
            alone.append(f"{e['kind']} {e['label']}")
        else:
            pairs.append((b, e))
    return pairs, alone


def plans_vs(nvrtc, hdrs, base_hdrs, pairs, alone, reps):
    """--plans: each pair compiled alternately, base first on every other pair."""
    groups = {}
    print(f"{'kind':<18} {'base':>7} {'new':>7}  source  label")
    for n, (b, e) in enumerate(pairs):
        t = {}
        for side in (("base", "new") if n % 2 == 0 else ("new", "base")):
            x, h = (b, base_hdrs) if side == "base" else (e, hdrs)
            t[side] = best(nvrtc, reps, x["source"], x["options"], x["names"], h)[0]
        changed = b["source"] != e["source"] or b["names"] != e["names"]
        for g in ("all", "source changed" if changed else "source the same"):
            groups.setdefault(g, []).append((t["base"], t["new"]))
        print(f"{e['kind']:<18} {t['base'] * 1000:7.0f} {t['new'] * 1000:7.0f}  {'changed' if changed else 'same   '}"
              f"  {e['label']}", flush=True)
    print("\nCPU ms per compile, base -> new: median / max / sum")
    for g in ("source changed", "source the same", "all"):
        if g not in groups:
            continue
        bs, ns = [x[0] * 1000 for x in groups[g]], [x[1] * 1000 for x in groups[g]]
        print(f"  {g:<16} n={len(bs):<4} {statistics.median(bs):.0f} / {max(bs):.0f} / {sum(bs):.0f} -> "
              f"{statistics.median(ns):.0f} / {max(ns):.0f} / {sum(ns):.0f} ({100 * (sum(ns) / sum(bs) - 1):+.1f} % of the sum)")
    for a in alone:
        print(f"  no partner in the base cache: {a}")
    return 0 if pairs else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=os.environ.get("QFORGE_CACHE_DIR"))
    ap.add_argument("--templates", default=str(REPO / "templates"))
    ap.add_argument("--filter", default="")
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--nvrtc-time", action="store_true")
    ap.add_argument("--reps", type=int, default=1, help="compiles per measurement; the fastest counts")
    ap.add_argument("--limit", type=int, default=0, help="only the first N entries")
    ap.add_argument("--base-templates", default="")
    ap.add_argument("--per-kernel", action="store_true")
    ap.add_argument("--instructions", action="store_true", help="SASS instructions of each image (nvdisasm)")
    ap.add_argument("--whole", default="", help="a cache of an older build's one-program quantize entries")
    ap.add_argument("--trace", action="store_true", help="shares of front end, NVVM (kernels / helpers / rest), ptxas")
    ap.add_argument("--hits", default="", help="a QFORGE_LOG_LEVEL=debug log of `qforge prewarm` over the same, full cache")
    ap.add_argument("--first-call", action="append", default=[],
                    help="bench/first_call.py --json files: their medians as the latency table's first-call column")
    ap.add_argument("--plans", default="", help="an older build's cache: each plan's program against its own there")
    args = ap.parse_args(argv)
    if not args.cache:
        print("jit_time: no cache: --cache DIR or QFORGE_CACHE_DIR", file=sys.stderr)
        return 2
    es = entries(args.cache, args.filter)
    if args.limit:
        es = es[: args.limit]
    if not es:
        print(f"jit_time: {args.cache}: no CUBIN entry with its source", file=sys.stderr)
        return 2
    nvrtc = sass_diff.load_nvrtc()
    nvdisasm = None
    if args.instructions:
        nvdisasm = sass_diff.find_nvdisasm()
        if not nvdisasm:
            print("jit_time: --instructions needs nvdisasm ($NVDISASM, PATH, the CUDA toolkit or pip's nvidia-cuda-nvdisasm)",
                  file=sys.stderr)
            return 2
    hdrs = headers(args.templates)
    base_hdrs = headers(args.base_templates) if args.base_templates else None
    if base_hdrs is not None and not base_hdrs:
        print(f"jit_time: {args.base_templates}: no device headers (*.cuh)", file=sys.stderr)
        return 2
    if args.whole:
        base_es = entries(args.whole, args.filter)
        if args.limit:
            base_es = base_es[: args.limit]
        return whole_vs_forms(nvrtc, hdrs, base_es, es, args.reps)
    if args.plans:
        pairs, alone = pair_by_plan(entries(args.plans, args.filter), es)
        return plans_vs(nvrtc, hdrs, base_hdrs or hdrs, pairs, alone, args.reps)
    cols = ["cubin"] + (["base"] if base_hdrs else []) + (["front end", "to PTX"] if args.phases else [])
    cols += [f"+{x}" for x in args.extra]
    if args.instructions:
        cols += ["instr"] + (["base instr"] if base_hdrs else [])
    if args.trace:
        cols.append("fe/kern/help/rest/ptxas")
    print(f"{'kind':<12} {'key':<12} " + " ".join(f"{c:>14}" for c in cols) + "  wall  label")
    per_kind = {}
    instr_kind = {}
    differs = 0
    ab_differ = []
    for n, e in enumerate(es):
        if base_hdrs:
            # Alternate which side goes first, so a drift in the machine's load favours neither.
            first_base = n % 2 == 1
            if first_base:
                bcpu, bwall, bimage = best(nvrtc, args.reps, e["source"], e["options"], e["names"], base_hdrs)
            cpu, wall, image = best(nvrtc, args.reps, e["source"], e["options"], e["names"], hdrs)
            if not first_base:
                bcpu, bwall, bimage = best(nvrtc, args.reps, e["source"], e["options"], e["names"], base_hdrs)
            same_ab = sass_diff.code_sections(bimage) == sass_diff.code_sections(image)
            if not same_ab:
                ab_differ.append(e)
            row = [f"{cpu * 1000:14.0f}", f"{bcpu * 1000:12.0f} {'=' if same_ab else '!'}"]
            rec = {"cubin": cpu, "cubin wall": wall, "base": bcpu, "base wall": bwall}
        else:
            cpu, wall, image = best(nvrtc, args.reps, e["source"], e["options"], e["names"], hdrs)
            row = [f"{cpu * 1000:14.0f}"]
            rec = {"cubin": cpu, "cubin wall": wall}
        if args.phases:
            fe = best(nvrtc, args.reps, e["source"], e["options"] + ["--fdevice-syntax-only"], e["names"], hdrs, want="")[0]
            ptx_opts = [o.replace("--gpu-architecture=sm_", "--gpu-architecture=compute_") for o in e["options"]]
            ptx = best(nvrtc, args.reps, e["source"], ptx_opts, e["names"], hdrs, want="")[0]
            row += [f"{fe * 1000:14.0f}", f"{ptx * 1000:14.0f}"]
            rec.update({"front end": fe, "to PTX": ptx})
        base_code = sass_diff.code_sections(e["image"])
        for x in args.extra:
            xc, xw, ximage = best(nvrtc, args.reps, e["source"], e["options"] + x.split(), e["names"], hdrs)
            same = sass_diff.code_sections(ximage) == base_code
            differs += not same
            row.append(f"{xc * 1000:7.0f}/{xw * 1000:6.0f} {'=' if same else '!'}")
            rec[f"+{x}"] = xc
            rec[f"+{x} wall"] = xw
        if args.per_kernel:
            for kname, kexpr in zip(e["kinds"], e["names"]):
                kc = best(nvrtc, args.reps, e["source"], e["options"], [kexpr], hdrs)[0]
                row.append(f"{kname}={kc * 1000:.0f}")
                rec[kname] = kc
        if nvdisasm:
            counts = {"instr": sass_instructions(sass_diff.disassemble(nvdisasm, image))}
            if base_hdrs:
                counts["base instr"] = sass_instructions(sass_diff.disassemble(nvdisasm, bimage))
            row += [f"{v:14d}" for v in counts.values()]
            for k, v in counts.items():
                for kind in (e["kind"], "all"):
                    instr_kind.setdefault(kind, {}).setdefault(k, []).append(v)
        if args.trace:
            sh = trace_shares(nvrtc, e, hdrs)
            row.append(" ".join(f"{int(round(100 * sh[k])):>2}" for k in TRACE_PARTS) + " %")
            for k in TRACE_PARTS:
                rec[f"{k} (of cubin)"] = sh[k] * cpu
        own_same = sass_diff.code_sections(image) == base_code
        own_note = "" if own_same or base_hdrs else "  (code differs from the entry's image)"
        line = f"{e['kind']:<12} {e['key']:<12} " + " ".join(row) + f" {wall:5.1f}  {e['label']}" + own_note
        if args.nvrtc_time:
            line += "\n    nvrtc --time: " + nvrtc_phase_table(nvrtc, e, hdrs)
        print(line, flush=True)
        for k, v in rec.items():
            per_kind.setdefault(e["kind"], {}).setdefault(k, []).append(v)
            per_kind.setdefault("all", {}).setdefault(k, []).append(v)
    print("\nCPU ms per compile: median / max / sum")
    for kind, recs in sorted(per_kind.items(), key=lambda kv: kv[0] == "all"):
        parts = [f"{c}: {statistics.median(v) * 1000:.0f} / {max(v) * 1000:.0f} / {sum(v) * 1000:.0f}" for c, v in recs.items()]
        print(f"  {kind:<12} n={len(next(iter(recs.values()))):<4} " + "; ".join(parts))
        if args.trace:
            whole = sum(recs["cubin"]) or 1
            print(f"  {'':<12} {'':<6} traced shares of the CPU ms sum: " +
                  ", ".join(f"{k} {100 * sum(recs[f'{k} (of cubin)']) / whole:.1f} %" for k in TRACE_PARTS))
    if instr_kind:
        print("\nSASS instructions per image: median / max / sum")
        for kind, recs in sorted(instr_kind.items(), key=lambda kv: kv[0] == "all"):
            parts = [f"{c}: {statistics.median(v):.0f} / {max(v)} / {sum(v)}" for c, v in recs.items()]
            print(f"  {kind:<12} n={len(next(iter(recs.values()))):<4} " + "; ".join(parts))
    latency_table(per_kind, cache_hits(args.hits) if args.hits else {}, es,
                  first_calls(args.first_call) if args.first_call else None)
    if args.extra:
        print(f"code sections: {differs} compile(s) with extra options differ from the entries' images")
    if base_hdrs:
        print(f"code sections: {len(ab_differ)} of {len(es)} kernel(s) differ between the base and the new headers")
        for e in ab_differ:
            print(f"  ! {e['kind']} {e['key']} {e['label']}")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
