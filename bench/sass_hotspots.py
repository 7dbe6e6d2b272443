#!/usr/bin/env python3
"""Where a kernel's instructions and stalls go, per SASS instruction (for "what limits it").

  sass_hotspots.py CSV [--blocks N]

CSV is Nsight Compute's source page of one profiled launch, exported with
`ncu --section SourceCounters --page source --print-source sass --csv ...` (scripts/profile.sh
with SOURCE=1 writes it). For each kernel in it, prints the warp instructions executed and the
warp-stall samples, their reasons (ncu's stall_* columns, where exported), the opcode mix (share
of instructions and of samples), and the N hottest straight-line runs: consecutive instructions
with one execution count, i.e. a basic block (its first address, executions, length, shares, its
commonest opcodes and its top stall reasons). A run executed once per
warp per tile is the tile's cost of that stage; its opcodes say whether it is arithmetic,
addressing or memory.
"""
import csv
import re
import sys
from collections import Counter

_OPCODE = re.compile(r"^\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)")


class HotspotError(Exception):
    pass


def _int(cell):
    return int(cell.replace(",", "")) if cell.strip() not in ("", "-") else 0


def parse(lines):
    """[(kernel name, [(address, sass, executed, samples, {stall reason: samples})])] from the
    CSV's lines."""
    kernels = []
    header = None
    for row in csv.reader(lines):
        if not row or row[0].startswith("==PROF=="):
            continue
        if row[0] == "Kernel Name":
            kernels.append((row[1] if len(row) > 1 else "?", []))
            header = None
        elif row[0] == "Address":
            header = {name: i for i, name in enumerate(row)}
            for need in ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)"):
                if need not in header:
                    raise HotspotError("the CSV has no %r column (export it with --section SourceCounters "
                                       "--page source --print-source sass --csv)" % need)
            if not kernels:
                kernels.append(("?", []))
        elif header is not None and len(row) >= len(header):
            stalls = {k[len("stall_"):]: _int(row[i]) for k, i in header.items() if k.startswith("stall_") and "(" not in k}
            kernels[-1][1].append((row[0], row[header["Source"]].strip(), _int(row[header["Instructions Executed"]]),
                                   _int(row[header["Warp Stall Sampling (All Samples)"]]), stalls))
    if not any(rows for _, rows in kernels):
        raise HotspotError("no SASS rows (expected an ncu source-page CSV)")
    return kernels


def opcode(sass):
    m = _OPCODE.match(sass)
    return m.group(1) if m else "?"


def runs(rows):
    """Straight-line runs: maximal sequences of consecutive rows with one execution count."""
    out = []
    for addr, sass, n, s, stalls in rows:
        if out and out[-1]["executed"] == n:
            r = out[-1]
        else:
            r = {"start": addr, "executed": n, "length": 0, "instructions": 0, "samples": 0, "ops": Counter(),
                 "stalls": Counter()}
            out.append(r)
        r["length"] += 1
        r["instructions"] += n
        r["samples"] += s
        r["ops"][opcode(sass)] += 1
        r["stalls"].update(stalls)
    return out


def _shares(counter, k):
    total = sum(counter.values())
    return " ".join("%s %.0f%%" % (name, 100.0 * v / total) for name, v in counter.most_common(k) if v) if total else ""


def report(kernels, blocks=20):
    lines = []
    for name, rows in kernels:
        if not rows:
            continue
        total = sum(row[2] for row in rows) or 1
        samples = sum(row[3] for row in rows) or 1
        lines.append("kernel %s" % name)
        lines.append("  %.1f M warp instructions executed, %d warp-stall samples" % (total / 1e6, samples))
        ops, op_samples, stalls = Counter(), Counter(), Counter()
        for _, sass, n, s, st in rows:
            ops[opcode(sass)] += n
            op_samples[opcode(sass)] += s
            stalls.update(st)
        if sum(stalls.values()):
            lines.append("  stall reasons: %s" % _shares(stalls, 8))
        lines.append("  opcode     instr  %instr  %samples")
        for op, n in ops.most_common(15):
            lines.append("  %-8s %7.1fM %6.1f %8.1f" % (op, n / 1e6, 100.0 * n / total, 100.0 * op_samples[op] / samples))
        lines.append("  hottest runs: start, executions, length, %instr, %samples, opcodes [top stalls]")
        for r in sorted(runs(rows), key=lambda r: -r["instructions"])[:blocks]:
            top = _shares(r["stalls"], 3)
            lines.append("  %s x%-9d %4d %6.1f %6.1f  %s%s" % (
                r["start"], r["executed"], r["length"], 100.0 * r["instructions"] / total, 100.0 * r["samples"] / samples,
                " ".join("%s:%d" % kv for kv in r["ops"].most_common(6)), "  [%s]" % top if top else ""))
    return "\n".join(lines) + "\n"


def main(argv):
    blocks = 20
    if len(argv) == 3 and argv[1] == "--blocks" and argv[2].isdigit():
        blocks = int(argv[2])
    elif len(argv) != 1:
        print("usage: sass_hotspots.py CSV [--blocks N]", file=sys.stderr)
        return 2
    try:
        with open(argv[0], newline="") as f:
            sys.stdout.write(report(parse(f), blocks))
    except (HotspotError, OSError, ValueError) as e:
        print("sass_hotspots: error: %s: %s" % (argv[0], e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
