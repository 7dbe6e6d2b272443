"""Trains a small decoder-only transformer with a top-2 MoE feed-forward, byte-level on the Python
standard library's own source files (no downloads), once in bf16 and once per shipped training
recipe (qforge.torch.convert), same seed and batches; writes the loss curves (PNG when matplotlib
is there), a markdown table (final eval loss against bf16, NaN/Inf steps, peak memory, step time)
and JSON.

The MoE feed-forward's experts are two grouped projections (ExpertLinear: one weight [experts, out,
in] each, no bias) over the tokens sorted by expert on the device (`route`: each expert's rows
padded with zero rows to a multiple of 128, so every recipe's block and GEMM alignment holds
whatever the router's split, in a buffer whose size is known on the host, no sync). A recipe's run
replaces them by qt.GroupedLinear (the weights kept), or, where GroupedLinear refuses the recipe
(delayed scaling, mxfp8.json's same-layout copies), by one qt.Linear per expert; the table says
which. bf16 runs ExpertLinear itself (a matmul per expert). The attention projections go through
qt.convert; the router and the output head stay in bf16.

    python3 bench/train.py --out DIR [--steps 300] [--recipes all]
"""
import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import qforge.torch as qt  # noqa: E402

TRAINING_RECIPES = ["delayed_scaling", "current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8_hopper",
                    "mxfp8", "nvfp4", "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr"]
PAD = 128


def corpus(limit_bytes: int = 24 << 20) -> torch.Tensor:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for p in sorted(stdlib.rglob("*.py")):
        if "site-packages" in p.parts:
            continue
        try:
            b = p.read_bytes()
        except OSError:
            continue
        chunks.append(b)
        total += len(b)
        if total >= limit_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()


def route(expert: torch.Tensor, n: int, pad: int = PAD):
    """Where each (token, slot) assignment goes among the tokens sorted by expert, without a host sync.
    expert: [A] int64, the expert of each assignment. Returns (pos [A], offsets [n + 1] int64, rows):
    expert e's assignments take rows pos of [offsets[e], offsets[e + 1]), in their order, its count
    padded to a multiple of `pad`; rows (host-known, a multiple of pad) bounds every split, and the
    last expert's member runs to it, so the offsets tile the buffer (the rows past the assignments
    stay zero)."""
    a = expert.numel()
    counts = torch.bincount(expert, minlength=n)
    padded = (counts + pad - 1) // pad * pad
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(expert, stable=True)
    first = torch.cumsum(counts, 0) - counts  # each expert's first place in `order`
    ranked = expert[order]
    pos = torch.empty_like(order)
    pos[order] = starts[ranked] + torch.arange(a, device=expert.device) - first[ranked]
    rows = (a + n * (pad - 1) + pad - 1) // pad * pad  # >= sum(padded) whatever the split
    return pos, torch.cat([starts, starts.new_tensor([rows])]), rows


class ExpertLinear(nn.Module):
    """One projection of every expert: y[rows of e] = x[rows of e] W[e]^T, W [experts, out, in] (each
    expert initialized as nn.Linear's weight), the rows split by offsets read on the host (bf16)."""

    def __init__(self, n: int, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, d_out, d_in))
        for w in self.weight.data:
            nn.init.kaiming_uniform_(w, a=5 ** 0.5)

    def forward(self, x, offsets):
        o = offsets.tolist()
        return torch.cat([x[o[e]:o[e + 1]] @ self.weight[e].t() for e in range(self.weight.shape[0])])


class PerExpertLinear(nn.Module):
    """ExpertLinear as one qt.Linear per expert (weights copied in): for recipes qt.GroupedLinear refuses."""

    def __init__(self, src: ExpertLinear, recipes, name: str):
        super().__init__()
        n, d_out, d_in = src.weight.shape
        w = src.weight
        self.experts = nn.ModuleList(qt.Linear(d_in, d_out, bias=False, recipes=recipes, name=f"{name}.{e}",
                                               device=w.device, dtype=w.dtype) for e in range(n))
        with torch.no_grad():
            for e, lin in enumerate(self.experts):
                lin.weight.copy_(w[e])

    def forward(self, x, offsets):
        o = offsets.tolist()  # (an expert without tokens gives no rows: qt.Linear is not called on none)
        return torch.cat([lin(x[o[e]:o[e + 1]]) for e, lin in enumerate(self.experts) if o[e + 1] > o[e]])


def quantize_experts(model: nn.Module, recipes) -> str:
    """Every ExpertLinear -> qt.GroupedLinear (its weight parameter kept), or PerExpertLinear where
    GroupedLinear refuses the recipe; returns what the experts run on."""
    kinds = set()
    for name, mod in [(n, m) for n, m in model.named_modules() if isinstance(m, ExpertLinear)]:
        n, d_out, d_in = mod.weight.shape
        try:
            new = qt.GroupedLinear(n, d_in, d_out, recipes=recipes, name=name, device=mod.weight.device,
                                   dtype=mod.weight.dtype)
            new.weight = mod.weight
            kinds.add("GroupedLinear")
        except qt.UserError as e:
            new = PerExpertLinear(mod, recipes, name)
            why = re.sub(r"^module \S+: ", "", str(e).splitlines()[0])  # the same reason for every layer
            kinds.add(f"qt.Linear per expert (GroupedLinear: {why[:120]})")
        *path, leaf = name.split(".")
        parent = model
        for p in path:
            parent = getattr(parent, p)
        setattr(parent, leaf, new)
    return "; ".join(sorted(kinds))


class Experts(nn.Module):
    """Top-2 MoE feed-forward: a router and the experts' MLP (fc1, GELU, fc2) over the routed tokens."""

    def __init__(self, d: int, ffn: int, n: int):
        super().__init__()
        self.n = n
        self.router = nn.Linear(d, n, bias=False)
        self.fc1, self.fc2 = ExpertLinear(n, d, ffn), ExpertLinear(n, ffn, d)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x).float()
        weight, idx = logits.softmax(-1).topk(2, dim=-1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        pos, offsets, rows = route(idx.reshape(-1), self.n)  # assignment i * 2 + slot: token i
        xs = x.new_zeros(rows, x.shape[1]).index_put((pos,), x.repeat_interleave(2, dim=0))
        h = self.fc2(F.gelu(self.fc1(xs, offsets), approximate="tanh"), offsets)
        return (h[pos] * weight.reshape(-1, 1)).view(-1, 2, shape[-1]).sum(1).reshape(shape)


class Block(nn.Module):
    def __init__(self, d, heads, ffn, experts):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.moe = Experts(d, ffn, experts)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.moe(self.ln2(x))


class Model(nn.Module):
    def __init__(self, d=512, layers=4, heads=8, ffn=1024, experts=8, seq=256):
        super().__init__()
        self.emb = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, ffn, experts) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def batches(data, n, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - seq - 1, (n, batch), generator=g)
    for s in starts:
        idx = torch.stack([data[i:i + seq + 1] for i in s.tolist()])
        yield idx[:, :-1], idx[:, 1:]


def run(name, data_train, data_eval, args, seed):
    torch.manual_seed(seed)
    model = Model(seq=args.seq).cuda().to(torch.bfloat16)
    experts = "ExpertLinear (bf16)"
    if name != "bf16":
        recipes = qt.Recipes(str(ROOT / "recipes" / f"{name}.json"))
        experts = quantize_experts(model, recipes)
        # The router (its logits pick the experts) and the output head stay in bf16.
        qt.convert(model, recipes, skip=[lambda n, m: n.endswith("router") or n == "head"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-6)
    torch.cuda.reset_peak_memory_stats()
    losses, bad, times = [], 0, []
    for step, (x, y) in enumerate(batches(data_train, args.steps, args.batch, args.seq, 1234)):
        x, y = x.cuda(), y.cuda()
        lr = args.lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).float().view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        v = loss.item()
        bad += not math.isfinite(v)
        losses.append(v)
    model.eval()
    with torch.no_grad():
        ev = [F.cross_entropy(model(x.cuda()).float().view(-1, 256), y.cuda().view(-1)).item()
              for x, y in batches(data_eval, args.eval_batches, args.batch, args.seq, 99)]
    return {"recipe": name, "seed": seed, "experts": experts, "losses": losses, "eval_loss": statistics.mean(ev),
            "nonfinite_steps": bad, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30,
            "step_ms": 1e3 * statistics.median(times[5:] or times)}


def table(head: str, results: list) -> list:
    """The markdown table of a run (train.md): one row per recipe and seed, bf16's first run the base."""
    base = results[0]["eval_loss"]
    lines = [head, "", "| recipe | experts on | final eval loss | vs bf16 | NaN/Inf steps | peak memory GiB (vs bf16) | "
             "ms/step |", "|---|---|---|---|---|---|---|"]
    for r in results:
        label = f"{r['recipe']}{' (seed 1)' if r['seed'] else ''}"
        if "error" in r:
            lines.append(f"| {label} | failed: {r['error']} | | | | | |")
            continue
        rel = (r["eval_loss"] - base) / base * 100
        lines.append(f"| {label} | {r['experts']} | {r['eval_loss']:.4f} | {rel:+.2f} % | {r['nonfinite_steps']} | "
                     f"{r['peak_mem_gib']:.2f} ({r['peak_mem_gib'] / results[0]['peak_mem_gib']:.2f}x) | "
                     f"{r['step_ms']:.1f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="train-results")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--recipes", default="all")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = corpus()
    cut = int(data.numel() * 0.95)
    train, evalset = data[:cut], data[cut:]
    recipes = TRAINING_RECIPES if args.recipes == "all" else args.recipes.split(",")
    results = []
    for name, seed in [("bf16", 0), ("bf16", 1)] + [(r, 0) for r in recipes]:
        try:
            r = run(name, train, evalset, args, seed)
        except Exception as e:  # one recipe's failure is a row of the table, not the end of the run
            traceback.print_exc()
            results.append({"recipe": name, "seed": seed, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
            continue
        results.append(r)
        print(f"{name} seed {seed}: eval {r['eval_loss']:.4f}, last train {r['losses'][-1]:.4f}, nonfinite "
              f"{r['nonfinite_steps']}, peak {r['peak_mem_gib']:.2f} GiB, {r['step_ms']:.1f} ms/step, experts on "
              f"{r['experts']}", flush=True)
    base = results[0]["eval_loss"]
    spread = abs(results[1]["eval_loss"] - base)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = (f"{time.strftime('%Y-%m-%d')}, {torch.cuda.get_device_name()}, torch {torch.__version__}, commit {commit}: "
            f"`python3 bench/train.py --steps {args.steps}`; 4 layers, d_model 512, 8 heads, top-2 MoE of 8 experts "
            f"(ffn 1024), {args.batch} x {args.seq} bytes per step, AdamW lr {args.lr}; bf16 seed-to-seed spread "
            f"{spread:.4f}")
    lines = table(head, results)
    (out / "train.md").write_text("\n".join(lines) + "\n")
    (out / "train.json").write_text(json.dumps({"head": head, "results": results}))
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 5))
        for r in results:
            if "error" in r:
                continue
            k = 10
            sm = [statistics.mean(r["losses"][max(0, i - k):i + 1]) for i in range(len(r["losses"]))]
            ax.plot(sm, label=f"{r['recipe']}{' s1' if r['seed'] else ''}", lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss (10-step mean)")
        ax.set_ylim(top=min(6.0, ax.get_ylim()[1]))
        ax.legend(fontsize=8)
        ax.set_title("byte-level MoE transformer, Python stdlib corpus")
        fig.savefig(out / "train_loss.png", dpi=110, bbox_inches="tight")
    except ImportError:
        print("matplotlib not installed: no PNG (the JSON has every step's loss)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
