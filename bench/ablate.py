#!/usr/bin/env python3
"""Timing-only variants of the cast kernel with one stage taken out (for "what limits it").

  ablate.py list
  ablate.py check DIR [NAME...]     every ablation (or those named) still applies to the headers in DIR
                                    (templates/qforge; exit 1 naming the one that does not)
  ablate.py apply NAME DIR OUT      writes the headers of DIR that stage NAME edits, with it taken
                                    out, to directory OUT
  ablate.py report DIR [METRIC]     the markdown table of DIR's qforge_bench results, named
                                    VARIANT__ROUND__N.json (VARIANT: shipped, an ablation, or
                                    rev:REV, the whole tracked tree at git revision REV, or
                                    tree:DIR, the source tree in directory DIR)

The variants compute wrong outputs on purpose: they exist to be timed beside the shipped kernel
(scripts/ablate.sh builds one tree per variant and runs qforge_bench on each). Each ablation is a
list of (header, anchor, replacement) edits of the cast kernel's headers (templates/qforge/cast*.cuh,
the header named by its file name); an anchor must occur exactly once in its header, so an edit
of the headers that moves one makes `check` fail (bench/test_bench_scripts.py) instead of
silently timing the shipped kernel twice.
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

_STORE_ENTRY = "__device__ __forceinline__ void store_entry(void* base, i64 off, u32 entry) {\n"
_COPY_ENTRIES = "__device__ __forceinline__ void copy_entries(u8* dst, i64 pitch, const u8* src, int rows, int per_row) {\n"
_CAST_STREAM = "        cast_stream<Cfg, S>(a, mem, col0, full, tile, rtile, regions[s], scale_base[s], report);"
_PREPASS = ("    float part[sizeof...(A)] = {(A::kScope == kScopeTensor ? "
            "detail::staged_tensor_amax<Cfg, A::kRht>(tile) : 0.0f)...};\n")
_GRID_ARRIVE = "__device__ __forceinline__ u32 grid_arrive() {\n  __syncthreads();\n  u32 old = 0;\n"
_GRID_WAIT = "__device__ __forceinline__ void grid_wait(u32 ticket) {\n"
_CHANNEL_SCALE = "    if constexpr (F::kIsInt) {  // torchao's int8 rule\n"


# The headers that hold the anchors.
_SCALE, _TILE, _REDUCE, _SCHEDULE = "cast_scale.cuh", "cast_tile.cuh", "cast_reduce.cuh", "cast_schedule.cuh"


def _skip_entries(condition):
    return [(_SCALE, _STORE_ENTRY, _STORE_ENTRY + "  if (%s) return;\n" % condition),
            (_SCALE, _COPY_ENTRIES, _COPY_ENTRIES + "  if (%s) return;\n" % condition)]


# name -> (what it takes out, edits)
ABLATIONS = {
    "no-entries": ("the scale-entry stores and the staged entries' copy-out, compiled out",
                   _skip_entries("true")),
    "entries-quarter": ("the same, skipped at run time in 3 of every 4 CTAs (the code unchanged)",
                        _skip_entries("((blockIdx.x + blockIdx.y) & 3) != 0")),
    "no-partials": ("the column-partials pass of transposed blocks longer than 16 rows",
                    [(_TILE, "        column_partials<Cfg>(src, part);\n        __syncthreads();\n", "")]),
    "no-rowwise": ("every rowwise stream",
                   [(_TILE, _CAST_STREAM, "        if constexpr (S::kDir != 0) " + _CAST_STREAM.lstrip())]),
    "no-columnwise": ("every columnwise stream",
                      [(_TILE, _CAST_STREAM, "        if constexpr (S::kDir == 0) " + _CAST_STREAM.lstrip())]),
    "no-prepass": ("the one-launch form's pre-pass: each CTA's part of the tensor amaxes from its staged tile "
                   "(with the RHT for an RHT'd amax), replaced by zero",
                   [(_REDUCE, _PREPASS, "    float part[sizeof...(A)] = {};\n")]),
    "no-grid-barriers": ("the one-launch form's grid barriers: the arrivals' atomics and the polling (each "
                         "becomes a CTA barrier)",
                         [(_SCHEDULE, _GRID_ARRIVE, _GRID_ARRIVE + "  if (true) return old;\n"),
                          (_SCHEDULE, _GRID_WAIT, _GRID_WAIT + "  if (true) {\n    __syncthreads();\n    return;\n  }\n")]),
    "no-channel-scale": ("per-channel scales: the channel's amax load and its scale (a division and a reciprocal) "
                         "per piece / run, replaced by a constant",
                         [(_SCALE, _CHANNEL_SCALE, "    if constexpr (true) {\n      mul = 1.0f, entry = 0u;\n    } else " + _CHANNEL_SCALE.lstrip())]),
}


class AblationError(Exception):
    pass


def is_revision(variant):
    """A variant "rev:REV" is the tracked tree at git revision REV (an A/B of two commits)."""
    return variant.startswith("rev:") and len(variant) > 4


def is_tree(variant):
    """A variant "tree:DIR" is the source tree in directory DIR of the repository root, one path
    component (an A/B against a tree that was copied there, e.g. from a commit the device
    machine's repository does not have)."""
    name = variant[5:]
    return variant.startswith("tree:") and name not in ("", ".", "..") and "/" not in name


def is_whole_tree(variant):
    """rev:REV or tree:DIR: a whole source tree rather than an edit of the shipped header."""
    return is_revision(variant) or is_tree(variant)


def edited_headers():
    """The file names of the headers some ablation edits."""
    return sorted({header for _, edits in ABLATIONS.values() for header, _, _ in edits})


def read_headers(directory):
    """{file name: text} of the headers the ablations edit, read from `directory` (templates/qforge)."""
    return {h: (Path(directory) / h).read_text() for h in edited_headers()}


def apply(name, headers):
    """Returns `headers` ({file name: text}, read_headers) with ablation `name` applied: the same
    dict, the headers it edits replaced."""
    if name not in ABLATIONS:
        raise AblationError("unknown ablation %r; expected one of %s" % (name, ", ".join(ABLATIONS)))
    out = dict(headers)
    for header, anchor, replacement in ABLATIONS[name][1]:
        text = out.get(header, "")
        n = text.count(anchor)
        if n != 1:
            first = anchor.strip().splitlines()[0]
            raise AblationError("ablation %r: its anchor %r occurs %d times in %s, expected once"
                                % (name, first, n, header))
        out[header] = text.replace(anchor, replacement)
    return out


def report(directory, metric="time_us"):
    """Markdown table: one row per (recipe, role, usage, shape), one column per variant (shipped
    first), each cell the range of `metric` over the rounds: time_us (back to back, launch
    included) or graph_us (GPU time per call replayed from a CUDA graph; small cases only)."""
    times = defaultdict(lambda: defaultdict(list))  # case -> variant -> [us]
    variants = []
    for f in sorted(Path(directory).glob("*__*__*.json")):
        variant = f.name.split("__")[0]
        if variant != "shipped" and variant not in ABLATIONS and not is_whole_tree(variant):
            raise AblationError("%s: %r is neither 'shipped', an ablation, rev:REV nor tree:DIR" % (f, variant))
        if variant not in variants:
            variants.append(variant)
        for r in json.loads(f.read_text()).get("results", []):
            if metric not in r:
                continue
            m, k = r["shape"]
            case = "%s %s %s%s %dx%d" % (r["recipe"], r["role"], r["usage"], " grouped" if r.get("grouped") else "", m, k)
            times[case][variant].append(float(r[metric]))
    if not times:
        raise AblationError("%s: no qforge_bench results with %s (VARIANT__ROUND__N.json)" % (directory, metric))
    variants.sort(key=lambda v: (v != "shipped", is_whole_tree(v), list(ABLATIONS).index(v) if v in ABLATIONS else v))

    def cell(ts):
        if not ts:
            return "-"
        lo, hi = min(ts), max(ts)
        return "%.1f" % lo if hi - lo < 0.05 else "%.1f-%.1f" % (lo, hi)

    lines = ["| case (us per call) | " + " | ".join(variants) + " |",
             "|---|" + "---|" * len(variants)]
    for case in sorted(times):
        lines.append("| %s | %s |" % (case, " | ".join(cell(times[case][v]) for v in variants)))
    return "\n".join(lines) + "\n"


def main(argv):
    if argv == ["list"]:
        for name, (what, _) in ABLATIONS.items():
            print("%-16s %s" % (name, what))
        return 0
    try:
        if len(argv) >= 2 and argv[0] == "check":
            headers = read_headers(argv[1])
            names = argv[2:] or list(ABLATIONS)
            for name in names:
                apply(name, headers)
            print("ablate: %d ablations apply to %s" % (len(names), argv[1]))
            return 0
        if len(argv) in (2, 3) and argv[0] == "report":
            sys.stdout.write(report(*argv[1:]))
            return 0
        if len(argv) == 4 and argv[0] == "apply":
            headers = read_headers(argv[2])
            for header, text in apply(argv[1], headers).items():
                if text != headers[header]:
                    (Path(argv[3]) / header).write_text(text)
            return 0
    except (AblationError, OSError, ValueError, KeyError) as e:
        print("ablate: error: %s" % e, file=sys.stderr)
        return 1
    print("usage: ablate.py list | check DIR [NAME...] | apply NAME DIR OUT | report DIR [METRIC]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
