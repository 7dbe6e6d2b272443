"""python/qforge/torch/_members.py, the host-side rules of GroupedLinear's per-expert dgrad, without
torch or a GPU: the split read from the offsets and its errors, the byte moves of a member out of its
grouped allocation, and (where the compiled core loads) that every member of the mixed-format
recipe's grouped quantizes has the dense layout of its shape, which the moves rely on.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The file alone: qforge/torch/__init__.py imports torch.
_spec = importlib.util.spec_from_file_location("qforge_torch_members", ROOT / "python/qforge/torch/_members.py")
members = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(members)


def test_member_split_reads_rising_offsets_that_tile_x():
    assert members.member_split([0, 128, 128, 384, 512], 512, 4) == [128, 0, 256, 128]
    assert members.member_split((0, 0), 0, 1) == [0]


@pytest.mark.parametrize("offsets, rows, message", [
    ([0, 128, 256], 256, "expected 4 row offsets, got 3"),
    ([32, 128, 256, 256], 256, "the first row offset is 32, expected 0"),
    ([0, 128, 64, 256], 256, "the row offsets fall from 128 to 64 at member 1"),
    ([0, 128, 256, 480], 512, "the last row offset is 480, expected x's 512 rows"),
])
def test_member_split_names_what_is_wrong(offsets, rows, message):
    with pytest.raises(ValueError, match=message):
        members.member_split(offsets, rows, 3)


def row(name, offset, nbytes, kind="data", stream=0, shape=(16, 32)):
    # A Layout.buffers row: (name, kind, stream, dtype, element_size, shape, offset, bytes, scale_layout).
    return (name, kind, stream, "e4m3", 1, list(shape), offset, nbytes, "")


def test_copy_moves_match_buffers_by_name():
    member = [row("rowwise_data", 4096, 512), row("rowwise_scale_inv", 9000, 16, "scale_inv"),
              row("columnwise_amax", 12000, 4, "amax", 1, (1,)), row("columnwise_data", 20000, 0, stream=1)]
    dense = [row("columnwise_amax", 768, 4, "amax", 1, (1,)), row("rowwise_data", 0, 512),
             row("rowwise_scale_inv", 512, 16, "scale_inv"), row("columnwise_data", 1024, 0, stream=1)]
    # Empty buffers (a member of no rows) move nothing.
    assert members.copy_moves(member, dense) == [(4096, 0, 512), (9000, 512, 16), (12000, 768, 4)]
    # One stream's buffers and the amax outputs (no stream's: -1 in the layouts), what a GEMM on it reads.
    member[2], dense[0] = row("columnwise_amax", 12000, 4, "amax", -1, (1,)), row("columnwise_amax", 768, 4, "amax",
                                                                                   -1, (1,))
    member.append(row("columnwise_scale_inv", 30000, 8, "scale_inv", 1))
    dense.append(row("columnwise_scale_inv", 2048, 8, "scale_inv", 1))
    assert members.copy_moves(member, dense, 0) == [(4096, 0, 512), (9000, 512, 16), (12000, 768, 4)]
    assert members.copy_moves(member, dense, 1) == [(12000, 768, 4), (30000, 2048, 8)]


def test_copy_moves_refuse_layouts_that_differ():
    with pytest.raises(ValueError, match=r"the member's buffers \['a', 'b'\] are not the dense layout's \['a'\]"):
        members.copy_moves([row("a", 0, 4), row("b", 4, 4)], [row("a", 0, 4)])
    with pytest.raises(ValueError, match="buffer a: the member holds"):
        members.copy_moves([row("a", 0, 4, shape=(2, 2))], [row("a", 0, 4, shape=(4, 1))])


def _core():
    sys.path.insert(0, str(ROOT / "python"))
    try:
        from qforge import _ext
        return _ext.load()
    except (ImportError, OSError) as e:
        pytest.skip(f"the compiled core does not load here: {e}")


@pytest.mark.parametrize("tensor, rows, k, split", [
    ("grad_output", 512, 384, [128, 0, 256, 128]),   # tokens split by the router
    ("weight", 4 * 384, 256, [384] * 4),             # the stacked experts' weights
])
def test_members_of_the_hybrid_have_the_dense_layout(tensor, rows, k, split):
    # GroupedLinear's per-expert dgrad copies each member into the dense layout of its shape: the
    # grouped quantizer's member layouts and the dense quantizer's (the same role, grouped=False)
    # must describe the same buffers.
    C = _core()
    ctx = C.Context([str(ROOT / "recipes/hybrid_mxfp8_fwd_nvfp4_bwd.json")])
    role = f"grouped_linear:{tensor}:experts"
    grouped = ctx.quantizer(role, None, "bf16", "training", True)
    dense = ctx.quantizer(role, None, "bf16", "training", False)
    layouts = grouped.member_layouts(grouped.layout(rows, k, len(split)), split)
    seen = set()
    for L, n in zip(layouts, split):
        moves = members.copy_moves(L.buffers, dense.layout(n, k).buffers) if n else []
        if n:  # the GEMM's stream: its data and scales, and NVFP4's amax (columnwise) where it has one
            kinds = {(b[1], b[2]) for b in dense.layout(n, k).buffers
                     for m in members.copy_moves(L.buffers, dense.layout(n, k).buffers, 1)
                     if b[6] == m[1]}
            assert kinds == {("data", 1), ("scale_inv", 1), ("amax", -1)}
        assert bool(moves) == bool(n)
        for src, _, nbytes in moves:
            assert not any(s <= src < s + b for s, b in seen)  # members do not overlap
            seen.add((src, nbytes))


def _grouped_route_rows():
    """(recipe, gemm, route, kernel) of qt.GroupedLinear's three GEMMs for every shipped recipe with a
    training usage, as its constructor decides them (8 experts, 1024 -> 1024, 128 tokens each):
    the grouped GEMM where one reads the pair; for dgrad, else the dense GEMM per expert where that
    takes the exact mixed route (dequant_mixed); else refused. docs/training.md lists them."""
    C = _core()
    G, K, N, M = 8, 1024, 1024, 128 * 8
    gemms = (("fprop", "input", 0, (M, K), "weight", 0, (G * N, K), False),
             ("dgrad", "grad_output", 0, (M, N), "weight", 1, (G * N, K), False),
             ("wgrad", "grad_output", 1, (M, N), "input", 1, (M, K), True))
    for path in sorted(p for p in (ROOT / "recipes").glob("*.json") if p.name != "recipe.schema.json"):
        ctx = C.Context([str(path)])
        role = lambda t: f"grouped_linear:{t}:experts"  # noqa: E731
        try:
            q = {t: ctx.quantizer(role(t), None, "bf16", "training", True) for t in ("input", "weight", "grad_output")}
        except Exception:  # no training usage (an inference recipe)
            continue
        if any(qq.inputs for qq in q.values()):
            for gemm in ("fprop", "dgrad", "wgrad"):
                yield path.stem, gemm, "refused", "delayed scaling of grouped tensors"
            continue
        for gemm, ta, da, sa, tb, db, sb, wgrad in gemms:
            qa, qb = q[ta], q[tb]
            try:
                plan = C.GroupedGemmPlan(qa, qa.layout(*sa, G), da, qb, qb.layout(*sb, G), db, wgrad, "bf16", False)
                yield path.stem, gemm, "grouped", plan.describe()
                continue
            except Exception as e:
                grouped_error = str(e)
            if gemm == "dgrad":
                da_, db_ = (ctx.quantizer(role(t), None, "bf16", "training", False) for t in (ta, tb))
                dense = C.GemmPlan(da_, da_.layout(128, N), da, db_, db_.layout(N, K), db, "bf16", False)
                if dense.route == "dequant_mixed":
                    yield path.stem, gemm, "per expert, dequant_mixed", dense.describe()
                    continue
            yield path.stem, gemm, "refused", grouped_error.split(";")[0]


def test_grouped_linear_routes_are_as_the_docs_list_them():
    rows = list(_grouped_route_rows())
    hybrid = {g: r for rec, g, r, _ in rows if rec == "hybrid_mxfp8_fwd_nvfp4_bwd"}
    assert hybrid == {"fprop": "grouped", "dgrad": "per expert, dequant_mixed", "wgrad": "grouped"}
    text = (ROOT / "docs" / "training.md").read_text()
    table = text[text.index("| recipe | GEMM | GroupedLinear's route | kernel |"):].split("\n\n")[0].splitlines()[2:]
    documented = [tuple(c.strip() for c in line.strip("|").split("|")) for line in table]
    assert documented == rows, "docs/training.md's GroupedLinear route table differs from the plans:\n" + "\n".join(
        "| " + " | ".join(r) + " |" for r in rows)
