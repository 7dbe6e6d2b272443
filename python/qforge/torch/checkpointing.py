"""Activation checkpointing over qforge modules: `qt.checkpoint(fn, *args)` is
torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False) whose recompute quantizes exactly as
the forward did.

    y = qt.checkpoint(block, x)      # block holds qt.Linear / qt.GroupedLinear modules

A module's forward quantizes with state that moves: the stochastic-rounding counter advances, a
delayed-scaling history rolls (and the scale with it), the weight's kept copy may be replaced. A
recompute that simply ran the forward again would draw new bits, quantize with the updated scale
and roll the history twice. So each checkpointed region keeps, per module call of its forward and in
call order, what that call started from (the SR counter, the delayed-scaling scales, the weight's
copy it used); the recompute replays the region's calls from those records, in the same order,
without side effects: the same quantized input (bit for bit), the same output. The modules save the
input's quantized copy for backward with ctx.save_for_backward, so the region drops it after the
forward and the recompute rebuilds it (the weight's copy stays: the module keeps it anyway).

`checkpoint_context` is the context_fn for callers of torch.utils.checkpoint.checkpoint itself
(use_reentrant=False). A recompute without it (a module's forward while the autograd engine runs a
backward) proceeds where the module's forward quantizes are reproducible (no delayed scaling, no
stochastic rounding of the input or weight, is_first_microbatch None) and is refused otherwise,
naming the module. Eager only: under torch.compile the regions are compiled by torch's own
checkpointing, which this does not hook. One region at a time: a region inside another is refused.
"""
import threading
from typing import Any, List, Optional

import torch
import torch.utils.checkpoint

from .. import UserError

__all__ = ["checkpoint", "checkpoint_context"]

_tls = threading.local()  # .stack: the regions whose forward or recompute is running, innermost last


class _Region:
    """One checkpointed call: its module calls' records, appended by the forward, taken back in order by
    each recompute (the cursor restarts with each one)."""

    def __init__(self):
        self.records: List[tuple] = []
        self.cursor = 0
        self.replaying = False

    def put(self, module, record) -> None:
        self.records.append((module, record))

    def take(self, module):
        if self.cursor >= len(self.records):
            raise UserError(1, f"module {getattr(module, 'name', '') or '<root>'}: the recompute of a checkpointed "
                               "region calls qforge modules the forward did not (the region must run the same "
                               "calls both times)")
        owner, record = self.records[self.cursor]
        if owner is not module:
            raise UserError(1, f"module {getattr(module, 'name', '') or '<root>'}: the recompute of a checkpointed "
                               f"region calls qforge modules in another order than its forward (expected module "
                               f"{getattr(owner, 'name', '') or '<root>'})")
        self.cursor += 1
        return record


def active() -> Optional[_Region]:
    """The innermost region whose forward (replaying False) or recompute (True) is running, or None."""
    stack = getattr(_tls, "stack", None)
    return stack[-1] if stack else None


class _Running:
    """The context a region's forward (replaying False) or recompute (True) runs in: the region on the
    thread's stack. Re-enterable: torch enters the recompute's context again for each recompute.
    A second backward through qforge modules (retain_graph) is refused by the modules' backward."""

    def __init__(self, region: _Region, replaying: bool):
        self.region, self.replaying = region, replaying

    def __enter__(self):
        stack = getattr(_tls, "stack", None)
        if stack is None:
            stack = _tls.stack = []
        if stack:
            raise UserError(1, "qt.checkpoint: checkpointed regions inside one another are not supported (the "
                               "inner region's modules would be recorded and replayed twice)")
        if self.replaying:
            self.region.cursor = 0
        self.region.replaying = self.replaying
        stack.append(self.region)
        return self

    def __exit__(self, *exc) -> bool:
        _tls.stack.pop()
        return False


def checkpoint_context():
    """context_fn for torch.utils.checkpoint.checkpoint(..., use_reentrant=False): the forward records
    the qforge modules' quantize state per call, the recompute replays it."""
    region = _Region()
    return _Running(region, False), _Running(region, True)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward on this thread (a forward now is a recompute)."""
    return torch._C._current_graph_task_id() != -1


def checkpoint(fn, *args: Any, use_reentrant: bool = False, **kwargs: Any):
    """torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, context_fn=checkpoint_context,
    **kwargs): fn's activations are recomputed in backward, its qforge modules' quantizes replayed
    bit for bit. use_reentrant=True is refused: that form runs the forward without grad (the modules'
    inference quantizers) and takes no context_fn."""
    if use_reentrant:
        raise UserError(1, "use_reentrant: qt.checkpoint replays the modules' quantizes through "
                           "torch.utils.checkpoint's context_fn, which only use_reentrant=False takes")
    if "context_fn" in kwargs:
        raise UserError(1, "context_fn: qt.checkpoint passes its own (checkpoint_context)")
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, context_fn=checkpoint_context, **kwargs)
