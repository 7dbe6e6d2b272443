"""Trains a small decoder-only transformer with a top-2 MoE feed-forward, byte-level on the Python
standard library's own source files (no downloads), once in bf16 and once per shipped training
recipe (qforge.torch.convert), same seed and batches; writes the loss curves (PNG when matplotlib
is there), a markdown table (final eval loss against bf16, NaN/Inf steps, peak memory, step time)
and JSON.

The MoE experts are an nn.ModuleList of per-expert MLPs (the container `convert` handles): each
expert's tokens are gathered and padded with zero rows to a multiple of 128, so every recipe's
block and GEMM alignment holds whatever the router's split.

    python3 bench/train.py --out DIR [--steps 300] [--recipes all]
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import qforge.torch as qt  # noqa: E402

TRAINING_RECIPES = ["delayed_scaling", "current_scaling", "float8_block_scaling", "fp8_rowwise", "mxfp8_hopper",
                    "nvfp4", "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr"]
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


class Experts(nn.Module):
    """Top-2 MoE feed-forward: a router and per-expert MLPs (nn.Linear pairs: convert swaps them)."""

    def __init__(self, d: int, ffn: int, n: int):
        super().__init__()
        self.router = nn.Linear(d, n, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, ffn), nn.GELU(approximate="tanh"), nn.Linear(ffn, d))
                                     for _ in range(n))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x).float()
        weight, idx = logits.softmax(-1).topk(2, dim=-1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            n = tok.numel()
            if n == 0:
                continue
            rows = (n + PAD - 1) // PAD * PAD
            xe = torch.zeros(rows, x.shape[1], dtype=x.dtype, device=x.device)
            xe[:n] = x[tok]
            ye = expert(xe)[:n] * weight[tok, slot, None]
            out.index_add_(0, tok, ye)
        return out.reshape(shape)


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
    if name != "bf16":
        # The router (its logits pick the experts) and the output head stay in bf16.
        qt.convert(model, qt.Recipes(str(ROOT / "recipes" / f"{name}.json")),
                   skip=[lambda n, m: n.endswith("router") or n == "head"])
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
    return {"recipe": name, "seed": seed, "losses": losses, "eval_loss": statistics.mean(ev), "nonfinite_steps": bad,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30,
            "step_ms": 1e3 * statistics.median(times[5:] or times)}


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
        r = run(name, train, evalset, args, seed)
        results.append(r)
        print(f"{name} seed {seed}: eval {r['eval_loss']:.4f}, last train {r['losses'][-1]:.4f}, nonfinite "
              f"{r['nonfinite_steps']}, peak {r['peak_mem_gib']:.2f} GiB, {r['step_ms']:.1f} ms/step", flush=True)
    base = results[0]["eval_loss"]
    spread = abs(results[1]["eval_loss"] - base)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = (f"{time.strftime('%Y-%m-%d')}, {torch.cuda.get_device_name()}, torch {torch.__version__}, commit {commit}: "
            f"`python3 bench/train.py --steps {args.steps}`; 4 layers, d_model 512, 8 heads, top-2 MoE of 8 experts "
            f"(ffn 1024), {args.batch} x {args.seq} bytes per step, AdamW lr {args.lr}; bf16 seed-to-seed spread "
            f"{spread:.4f}")
    lines = [head, "", "| recipe | final eval loss | vs bf16 | NaN/Inf steps | peak memory GiB (vs bf16) | ms/step |",
             "|---|---|---|---|---|---|"]
    for r in results:
        rel = (r["eval_loss"] - base) / base * 100
        lines.append(f"| {r['recipe']}{' (seed 1)' if r['seed'] else ''} | {r['eval_loss']:.4f} | {rel:+.2f} % | "
                     f"{r['nonfinite_steps']} | {r['peak_mem_gib']:.2f} ({r['peak_mem_gib'] / results[0]['peak_mem_gib']:.2f}x) | "
                     f"{r['step_ms']:.1f} |")
    (out / "train.md").write_text("\n".join(lines) + "\n")
    (out / "train.json").write_text(json.dumps({"head": head, "results": results}))
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 5))
        for r in results:
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
