"""Host time of qforge.torch's own Python per eager call, without torch or a GPU.

Runs the Python layer (Quantizer.__call__, qt.gemm, qt.linear_forward) against the stand-in torch of
tests/python/stub_torch.py, with the compiled core's launch calls replaced by no-ops: what is timed
is the layer's own bytecode plus the stand-in's calls (its torch.empty, tensor attributes and
stream query are small Python functions, not torch's; torch's real costs, the allocation above all,
come on top and are what bench/binding_bench.py measures on a GPU). Useful to compare two versions
of the layer on one CPU:

    python3 bench/python_layer_bench.py                  # this checkout's python/
    python3 bench/python_layer_bench.py --root OTHER     # another checkout's (OTHER/python)

Needs qforge._C built (QFORGE_EXTENSION, or a build*/ tree of this checkout).
"""
import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def per_call_us(fn, calls: int, rounds: int) -> float:
    for _ in range(200):
        fn()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return min(per)  # the least disturbed round: the machine may be shared


def count(fn) -> tuple:
    """What one call executes, deterministically (timings on a shared machine are noisy): (bytecodes
    run in qforge's own frames, Python calls into qforge functions, Python calls into the stand-in
    torch, calls of builtins and C methods anywhere)."""
    n = {"ops": 0, "qforge": 0, "stub": 0, "c": 0}

    def trace(frame, event, arg):
        if event == "opcode":
            n["ops"] += 1
        return trace

    def profile(frame, event, arg):
        if event == "call":
            f = frame.f_code.co_filename
            if "/qforge/" in f:
                n["qforge"] += 1
                frame.f_trace_opcodes = True
                frame.f_trace = trace
            elif f.endswith("stub_torch.py"):
                n["stub"] += 1
        elif event == "c_call":
            n["c"] += 1

    sys.settrace(lambda frame, event, arg: None)  # opcode events reach frames that opt in (f_trace)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    return n["ops"], n["qforge"], n["stub"], n["c"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(HERE), help="the checkout whose python/ is timed")
    ap.add_argument("--recipe", default="mxfp8_hopper")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE / "tests" / "python"))
    sys.path.insert(0, str(Path(args.root) / "python"))
    import stub_torch
    torch = stub_torch.install()
    import qforge.torch as qt

    class NoLaunch:
        def __init__(self, real):
            self._real = real

        def quantize(self, *a):
            pass

        def __getattr__(self, name):
            return getattr(self._real, name)

    class Plan:
        def __init__(self, a_c, a_layout, ai, b_c, b_layout, bi, out_name, accumulate):
            self.m, self.n = a_layout.m, b_layout.m

        def workspace_bytes(self):
            return 0

        def run(self, *a):
            pass

        def linear_forward(self, *a):
            pass

    class Core(NoLaunch):
        GemmPlan = Plan

    qt._C = Core(qt._C)
    r = qt.Recipes(str(HERE / "recipes" / f"{args.recipe}.json"))
    qx, qw = r.quantizer("linear:input"), r.quantizer("linear:weight")
    qx._c, qw._c = NoLaunch(qx._c), NoLaunch(qw._c)
    x = torch.empty((1024, 1024), dtype=torch.bfloat16, device="cuda:0")
    w = torch.empty((1024, 1024), dtype=torch.bfloat16, device="cuda:0")
    tx, tw = qx(x), qw(w)
    kw = {"scale": torch.empty(1, dtype=torch.float32, device="cuda:0")} if qx.inputs else {}
    rows = [("quantize", lambda: qx(x, **kw)), ("gemm", lambda: qt.gemm(tx, tw)),
            ("linear_forward", lambda: qt.linear_forward(x, w, qx, qw)),
            ("stand-in torch.empty alone", lambda: torch.empty(4096, dtype=torch.uint8, device=x.device))]
    print(f"{args.root}: {args.recipe}, python {sys.version.split()[0]}")
    for name, fn in rows:
        fn()  # the first call builds and keeps the plans: counted are the calls after it
        ops, own, stub, c = count(fn)
        print(f"  {name}: {per_call_us(fn, args.calls, args.rounds):.2f} us per call; {ops} bytecodes in qforge, "
              f"calls: {own} qforge, {stub} stand-in torch, {c} builtin / C")
    return 0


if __name__ == "__main__":
    sys.exit(main())
