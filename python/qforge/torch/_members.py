"""Host-side rules of GroupedLinear's per-expert dgrad (modules.py), without torch: the members'
row counts read from the offsets, and the byte moves that take one member of a grouped quantize
out of its grouped allocation into a dense one. tests/python/test_torch_members.py loads this file
alone, so it imports nothing from the package; errors are ValueErrors the caller words as
UserErrors naming the module.
"""
from typing import List, Optional, Sequence, Tuple


def member_split(offsets: Sequence[int], rows: int, members: int) -> List[int]:
    """Each member's row count from the host copy of GroupedLinear's row offsets [members + 1]: they
    must start at 0, never fall and end at `rows` (x's rows), so that the members tile x."""
    offsets = [int(o) for o in offsets]
    if len(offsets) != members + 1:
        raise ValueError(f"expected {members + 1} row offsets, got {len(offsets)}")
    if offsets[0] != 0:
        raise ValueError(f"the first row offset is {offsets[0]}, expected 0")
    for i in range(members):
        if offsets[i + 1] < offsets[i]:
            raise ValueError(f"the row offsets fall from {offsets[i]} to {offsets[i + 1]} at member {i}")
    if offsets[-1] != rows:
        raise ValueError(f"the last row offset is {offsets[-1]}, expected x's {rows} rows")
    return [offsets[i + 1] - offsets[i] for i in range(members)]


# Layout.buffers rows (python/src/ext.cpp): (name, kind, stream, dtype, element_size, shape, offset,
# bytes, scale_layout).
_NAME, _KIND, _STREAM, _OFFSET, _BYTES = 0, 1, 2, 6, 7


def _what(b: tuple) -> tuple:
    """Everything of a buffer row but its name and offset: (kind, stream, dtype, element_size, shape,
    bytes, scale_layout)."""
    return tuple(b[1:_OFFSET]) + tuple(b[_BYTES:])


def copy_moves(member_buffers: Sequence[tuple], dense_buffers: Sequence[tuple],
               stream: Optional[int] = None) -> List[Tuple[int, int, int]]:
    """(source offset, destination offset, bytes) of every non-empty buffer of one member of a grouped
    quantize (its layout from member_layouts: the dense layout of its shape, placed inside the grouped
    allocation) into the dense layout of the same shape; with `stream`, only that stream's buffers and
    the per-tensor amax outputs (which belong to no stream: NVFP4's global decode scale), what a GEMM
    reading that stream reads. The two layouts must describe the same buffers: names, kinds, streams,
    dtypes, shapes and bytes."""
    dense = {b[_NAME]: b for b in dense_buffers}
    if sorted(dense) != sorted(b[_NAME] for b in member_buffers):
        raise ValueError(f"the member's buffers {sorted(b[_NAME] for b in member_buffers)} are not the dense "
                         f"layout's {sorted(dense)}")
    moves = []
    for b in member_buffers:
        d = dense[b[_NAME]]
        if _what(b) != _what(d):
            raise ValueError(f"buffer {b[_NAME]}: the member holds {_what(b)}, the dense layout {_what(d)}")
        if b[_BYTES] and (stream is None or b[_STREAM] == stream or b[_KIND] == "amax"):
            moves.append((b[_OFFSET], d[_OFFSET], b[_BYTES]))
    return moves
