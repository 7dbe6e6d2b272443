"""Torch modules driven by a recipe: `Linear` and `convert(model, recipes)`.

    import qforge.torch as qt
    model = qt.convert(model, qt.Recipes("recipes/float8_block_scaling.json"))
    loss = model(x).sum(); loss.backward()

`convert` swaps every `nn.Linear` (its parameters kept) for a `qt.Linear` whose roles follow the
recipe language: `linear:input:<fqn>`, `linear:weight:<fqn>`, `linear:grad_output:<fqn>`, with
the module's fully qualified name as the role's name, so a recipe can give one layer its own rule.
A role no rule matches, or a layer size its formats cannot take, is a UserError at convert time
naming the module and role.

Forward: quantize the input and the weight, fprop GEMM (+ bias). Backward: quantize grad_output,
dgrad (grad_output rowwise x weight columnwise) and wgrad (grad_output columnwise x input
columnwise), each in the formats the recipe gives that direction. Under torch.no_grad() /
inference mode the inference usage's quantizers run (only the directions inference needs). The
weight's quantized copy is kept while the weight is unchanged (its version counter: an optimizer
step changes it), so micro-batches of one step quantize it once; forward's `is_first_microbatch`
decides it explicitly instead (True: quantize and keep; False: reuse; a CUDA float tensor: the
same decision on the device, for CUDA graphs). Delayed scaling keeps its amax history and scale
as module buffers (in state_dict), updated after each quantize, or (amax_update="batched") for the
whole model in one launch by update_amax_histories. Stochastic rounding takes a per-module seed
and a call counter saved with the module, so a resumed run draws the same bits.
"""
import zlib
from typing import Dict, Optional

import torch
from torch import nn

from . import (QuantizedTensor, Recipes, UserError, _check_small, _gemm, _linear_backward, _linear_forward, _out_code,
               _plan, gemm, grouped_gemm)
from . import checkpointing as _ckpt
from ._members import copy_moves, member_split

__all__ = ["Linear", "GroupedLinear", "convert"]


def _user_error(message: str) -> UserError:
    return UserError(1, message)


_TENSORS = ("input", "weight", "grad_output")
_AMAX_UPDATES = ("each_quantize", "batched")


def _check_flag(flag, name: str, device) -> None:
    """is_first_microbatch: None, a bool, or a CUDA float32 tensor of one element (1.0: first)."""
    if flag is None or isinstance(flag, bool):
        return
    if isinstance(flag, torch.Tensor):
        _check_small(flag, f"module {name or '<root>'}: is_first_microbatch", device)
        return
    raise _user_error(f"module {name or '<root>'}: is_first_microbatch: expected None, a bool or a CUDA float32 "
                      f"tensor of one element, got {type(flag).__name__}")


def _skip_flag(flag: torch.Tensor) -> torch.Tensor:
    """The quantize's noop for a device flag: 1.0 (skip) where the flag is 0.0."""
    return torch.rsub(flag, 1.0)


class _Roles:
    """The quantizers of one module: per tensor type and usage ("training" / "inference")."""

    def __init__(self, recipes: Recipes, recipe: Optional[str], module_type: str, name: str, dtype: torch.dtype):
        self.q: Dict[tuple, object] = {}
        for t in _TENSORS:
            role = f"{module_type}:{t}:{name}" if name else f"{module_type}:{t}"
            for usage in ("training", "inference"):
                if t == "grad_output" and usage == "inference":
                    continue
                try:
                    self.q[(t, usage)] = recipes.quantizer(role, recipe=recipe, dtype=dtype, usage=usage)
                except UserError as e:
                    raise _user_error(f"module {name or '<root>'}: role {role}: {e}") from None

    def __getitem__(self, key):
        return self.q[key]


class _RecipeState:
    """What a module saves beside its tensors: the stochastic-rounding call counter (so a resumed run
    draws the same bits) and the recipes it runs (a checkpoint of another recipe is refused)."""

    def get_extra_state(self):
        return {"sr_calls": self.sr_calls, "recipes": self.recipe_names}

    def set_extra_state(self, state):
        if state.get("recipes") != self.recipe_names:
            raise _user_error(f"module {self.name or '<root>'}: checkpoint saved under recipe(s) "
                              f"{state.get('recipes')}, the module runs {self.recipe_names}")
        self.sr_calls = int(state["sr_calls"])


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, module, is_first_microbatch):
        y, qx, qw = module._fprop(x2d, weight, "training", is_first_microbatch)
        if y.dtype != weight.dtype:
            y = y.to(weight.dtype)
        if bias is not None:
            y = y.add_(bias)  # y is this call's own fresh result: the same add as y + bias, no allocation
        ctx.module, ctx.qx, ctx.qw, ctx.has_bias = module, _save_input_copy(ctx, qx), qw, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        module, qx, qw = ctx.module, _saved_input_copy(ctx), ctx.qw
        weight = module._parameters["weight"]
        if dy.dtype != weight.dtype:
            dy = dy.to(weight.dtype)
        if not dy.is_contiguous():
            dy = dy.contiguous()
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        main = getattr(weight, "main_grad", None) if need_dw and module.accumulate_main_grad else None
        if torch.compiler.is_compiling():  # the separate ops (custom ops under tracing)
            qg = module._quantize("grad_output", dy, "training")
            dx = gemm(qg, qw, b_direction="columnwise", out_dtype=module._gemm_dtype) if need_dx else None
            dw = None
            if need_dw:
                if main is not None:
                    gemm(qg, qx, a_direction="columnwise", b_direction="columnwise", accumulate_into=main)
                else:
                    dw = gemm(qg, qx, a_direction="columnwise", b_direction="columnwise", out_dtype=module._gemm_dtype)
        else:  # grad_output's quantize, dgrad and wgrad in one call into the compiled core
            qgq, ga = module._qargs("grad_output", "training")
            dx, dw, _ = _linear_backward(dy, qgq, ga, qw, qx, need_dx, need_dw, _out_code(module._gemm_dtype), main)
        if dx is not None and dx.dtype != weight.dtype:
            dx = dx.to(weight.dtype)
        if dw is not None and dw.dtype != weight.dtype:
            dw = dw.to(weight.dtype)
        db = dy.sum(0).to(module.bias.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        ctx.qx = ctx.qw = None
        return dx, dw, db, None, None


class Linear(_RecipeState, nn.Module):
    """y = x W^T + b with x, W and dy quantized by a recipe (see the module docstring). Inputs of any
    leading shape; in_features and out_features as the recipe's formats take them.

    accumulate_main_grad: wgrad adds into `weight.main_grad` (fp32, allocated here) instead of
    producing weight.grad (Megatron / TE style main-gradient accumulation).

    amax_update (delayed scaling): "each_quantize" rolls a tensor's amax history right after each
    of its quantizes (one small launch each); "batched" leaves the amax in an `<t>_amax` buffer and
    `qt.update_amax_histories(model)`, called once per step after backward, updates every such
    tensor of the model in one launch (the history's newest slot is then the step's last quantize's
    amax, as one micro-batch per step gives)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipes: Recipes,
                 recipe: Optional[str] = None, name: str = "", device=None, dtype=torch.bfloat16,
                 accumulate_main_grad: bool = False, amax_update: str = "each_quantize"):
        super().__init__()
        self.in_features, self.out_features, self.name = in_features, out_features, name
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)
        self._setup(recipes, recipe, name, dtype, accumulate_main_grad, amax_update)

    def _setup(self, recipes, recipe, name, dtype, accumulate_main_grad, amax_update):
        if amax_update not in _AMAX_UPDATES:
            raise _user_error(f"module {name or '<root>'}: amax_update: expected one of {list(_AMAX_UPDATES)}, "
                              f"got {amax_update!r}")
        self.amax_update = amax_update
        self.recipe_names = recipes.names if recipe is None else [recipe]
        self.roles = _Roles(recipes, recipe, "linear", name, dtype)
        self.accumulate_main_grad = accumulate_main_grad
        # The GEMMs write bf16 or fp32: bf16 weights take bf16 results, fp32 / fp16 ones fp32 (then cast).
        self._gemm_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        if accumulate_main_grad:
            self.weight.main_grad = torch.zeros_like(self.weight, dtype=torch.float32)
        self._check_sizes()
        # Stochastic rounding: a seed fixed by the module's name, a call counter kept in state_dict.
        self.sr_seed = zlib.crc32(name.encode())
        self.sr_calls = 0  # saved by get_extra_state
        # What each quantize of (tensor type, usage) passes, resolved once (_qargs): the quantizer,
        # whether it rounds stochastically, its SR seed, and the names of its scale, amax_out and
        # history buffers (None where it takes none).
        self._qspec = {}
        for (t, usage), q in self.roles.q.items():
            delayed = bool(q.inputs) and usage == "training"
            self._qspec[(t, usage)] = (q, any(s.stochastic for s in q.streams.values()), self.sr_seed + _TENSORS.index(t),
                                       f"{t}_scale" if q.inputs else None,
                                       f"{t}_amax" if delayed and amax_update == "batched" else None,
                                       f"{t}_amax_history" if delayed and amax_update == "each_quantize" else None)
        # Delayed scaling: per tensor type, the amax history and the scale (state_dict buffers).
        for t in _TENSORS:
            q = self.roles[(t, "training")]
            if q.inputs:
                n = q.history_length(0)
                self.register_buffer(f"{t}_amax_history", torch.zeros(n, device=self.weight.device))
                self.register_buffer(f"{t}_scale", torch.ones(1, device=self.weight.device))
                if amax_update == "batched":  # the step's amax, which update_amax_histories reads in
                    # the same step: not saved, so checkpoints load under either amax_update
                    self.register_buffer(f"{t}_amax", torch.zeros(1, device=self.weight.device), persistent=False)
        self._wcache = None  # ((weight version, usage, address), QuantizedTensor)
        self._wflag = None   # ((usage, address), QuantizedTensor): the copy a device flag rewrites in place
        self._replaying = None  # a checkpointed region's record of this call, while its recompute runs

    def _check_sizes(self):
        """The layer's sizes against every quantizer it will run (a probe of 128 rows)."""
        for (t, usage), q in self.roles.q.items():
            k = self.out_features if t == "grad_output" else self.in_features
            rows = self.out_features if t == "weight" else 128
            try:
                q.layout(rows, k)
            except UserError as e:
                raise _user_error(f"module {self.name or '<root>'}: role linear:{t} ({usage}) cannot take "
                                  f"[{rows}, {k}]: {e}") from None

    @classmethod
    def from_linear(cls, lin: nn.Linear, *, recipes: Recipes, recipe: Optional[str] = None, name: str = "",
                    accumulate_main_grad: bool = False, amax_update: str = "each_quantize") -> "Linear":
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.in_features, self.out_features, self.name = lin.in_features, lin.out_features, name
        self.weight = lin.weight
        self.bias = lin.bias
        self._setup(recipes, recipe, name, lin.weight.dtype, accumulate_main_grad, amax_update)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={','.join(self.recipe_names)}, name={self.name!r}")

    # Quantizing ---------------------------------------------------------------------------------
    def _quantize(self, t: str, x: torch.Tensor, usage: str, noop: Optional[torch.Tensor] = None,
                  out: Optional[torch.Tensor] = None) -> QuantizedTensor:
        q = self.roles[(t, usage)]
        kw = {}
        delayed = bool(q.inputs) and usage == "training"
        if q.inputs:
            kw["scale"] = getattr(self, f"{t}_scale")
            if delayed and self.amax_update == "batched":
                kw["amax_out"] = getattr(self, f"{t}_amax")
        if any(s.stochastic for s in q.streams.values()):
            kw["seed"] = self.sr_seed + _TENSORS.index(t)
            kw["offset"] = self.sr_calls
            self.sr_calls += 1
        if noop is not None:
            kw["noop"] = noop
        if out is not None:
            kw["out"] = out
        res = q(x, **kw)
        if delayed and self.amax_update == "each_quantize":
            q.update_amax_history(getattr(self, f"{t}_amax_history"), res[_amax_name(res)],
                                  getattr(self, f"{t}_scale"), noop=noop)
        return res

    def _qargs(self, t: str, usage: str, noop: Optional[torch.Tensor] = None):
        """(quantizer, (noop, seed, offset, scale, amax_out, history)): what _quantize passes for tensor
        type t (the history: the update it runs right after the quantize), advancing the SR counter
        where the quantizer rounds stochastically."""
        q, sr, seed, scale, amax_out, history = self._qspec[(t, usage)]
        offset = 0
        if sr:
            offset = self.sr_calls
            self.sr_calls += 1
        else:
            seed = 0
        b = self._buffers
        return q, (noop, seed, offset, b[scale] if scale else None, b[amax_out] if amax_out else None,
                   b[history] if history else None)

    def _fprop(self, x2d: torch.Tensor, weight: torch.Tensor, usage: str, flag):
        """The forward GEMM's result (the GEMM's dtype) and the input's and the weight's QuantizedTensors:
        what _quantize("input"), _quantized_weight(usage, flag) and gemm() give, the weight's copy kept
        or reused by the same rule, in one call into the compiled core (eager) or one custom op
        (torch.compile; a device flag or batched amax there takes the separate ops). Under a
        checkpointed region's recompute: the recorded call replayed (_replay_fprop)."""
        if self._replaying is not None:
            return self._replay_fprop(x2d, usage)
        compiling = torch.compiler.is_compiling()
        if compiling and (isinstance(flag, torch.Tensor) or self._qspec[("input", usage)][4] is not None
                          or self._qspec[("weight", usage)][4] is not None):
            qx = self._quantize("input", x2d, usage)
            qw = self._quantized_weight(usage, flag)
            return gemm(qx, qw, out_dtype=self._gemm_dtype), qx, qw
        q_in, xa = self._qargs("input", usage)
        q_w = self._qspec[("weight", usage)][0]
        n = self.out_features
        kept = into = None  # the weight's copy used as it is / quantized into
        wa = None
        key = None
        if isinstance(flag, torch.Tensor):
            have = self._wflag
            if have is not None and have[0] == (usage, weight.data_ptr()):
                into = have[1]
                wa = self._qargs("weight", usage, noop=_skip_flag(flag))[1]
            else:  # the kept allocation's first contents: unconditional
                wa = self._qargs("weight", usage)[1]
        else:
            key = (weight._version, usage, weight.data_ptr())
            cache = self._wcache
            if cache is not None and ((flag is None and cache[0] == key) or (flag is False and cache[0][1] == usage)):
                kept = cache[1]
            else:
                wa = self._qargs("weight", usage)[1]
        code = _OUT_CODE[self._gemm_dtype]
        if compiling:
            if kept is not None:
                d, xb = torch.ops.qforge.linear_forward_cached(x2d, q_in.id, xa[1], xa[2], xa[3], kept.buffer, q_w.id, n,
                                                               code)
                wb = kept.buffer
            else:
                d, xb, wb = torch.ops.qforge.linear_forward(x2d, q_in.id, xa[1], xa[2], xa[3], weight.detach(), q_w.id,
                                                            wa[1], wa[2], wa[3], code)
        else:
            d, xb, wb = _linear_forward(x2d, q_in, xa, None if kept is not None else weight, q_w,
                                        wa if wa is not None else _NO_QUANTIZE, n,
                                        kept.buffer if kept is not None else into.buffer if into is not None else None,
                                        code)
        qx = QuantizedTensor(xb, q_in, x2d.shape[0], x2d.shape[1])
        if kept is not None:
            qw = kept
        elif into is not None:
            qw = into
        else:
            qw = QuantizedTensor(wb, q_w, n, self.in_features)
            if key is None:
                self._wflag = ((usage, weight.data_ptr()), qw)
            else:
                self._wcache = (key, qw)
        if compiling:  # the delayed-scaling updates the eager call ran after each quantize
            for t, a, res in (("input", xa, qx), ("weight", wa, qw if kept is None else None)):
                if res is not None and a[5] is not None:
                    self.roles[(t, usage)].update_amax_history(a[5], res[_amax_name(res)], a[3])
        return d, qx, qw

    def invalidate_weight_cache(self) -> None:
        """Drops the weight's quantized copy: call after writing the weight in a way its version counter
        does not see (`weight.data.copy_(...)`, another process's update of shared memory)."""
        self._wcache = None
        self._wflag = None

    def _quantized_weight(self, usage: str, is_first_microbatch=None) -> QuantizedTensor:
        """The weight's quantized copy. is_first_microbatch None: kept while the weight's version
        counter and address stay; True: quantized now and kept; False: the kept copy (quantized now
        if there is none for this usage); a CUDA float32 tensor: quantized on the device where it
        holds 1.0, into one allocation kept across calls (a CUDA graph replays the decision)."""
        flag = is_first_microbatch
        w = self.weight.detach()
        if isinstance(flag, torch.Tensor):
            have = self._wflag
            if have is not None and have[0] == (usage, w.data_ptr()):
                qw = have[1]
                self._quantize("weight", w, usage, noop=_skip_flag(flag), out=qw.buffer)
                return qw
            qw = self._quantize("weight", w, usage)  # the kept allocation's first contents: unconditional
            self._wflag = ((usage, w.data_ptr()), qw)
            return qw
        key = (self.weight._version, usage, w.data_ptr())
        cache = self._wcache
        if cache is not None and ((flag is None and cache[0] == key) or (flag is False and cache[0][1] == usage)):
            return cache[1]
        qw = self._quantize("weight", w, usage)
        self._wcache = (key, qw)
        return qw

    def forward(self, x: torch.Tensor, is_first_microbatch=None) -> torch.Tensor:
        """y = x W^T + b. is_first_microbatch (Transformer Engine's meaning): None quantizes the weight
        when its version counter moved; True quantizes it and keeps the copy; False reuses the kept
        copy; a CUDA float32 tensor of one element decides on the device (1.0: quantize into the kept
        allocation, 0.0: the launch is a no-op), so one captured CUDA graph serves every micro-batch
        (make the first such call before capture). Inside qt.checkpoint: the forward records what its
        quantizes start from, the recompute replays it (checkpointing.py)."""
        return _checkpointed(self, self._forward, x, is_first_microbatch)

    def _snapshot(self, flag):
        """What a replay of this call needs, taken before it runs: the SR counter and the input's
        delayed-scaling scale (a copy: the history update after the quantize rewrites it)."""
        scale = self._buffers.get("input_scale")
        return self.sr_calls, None if scale is None else scale.clone()

    def _used_weight(self, flag):
        """The weight's copy the call just made or reused."""
        return self._wflag[1] if isinstance(flag, torch.Tensor) else self._wcache[1]

    def _replay_fprop(self, x2d: torch.Tensor, usage: str):
        """_fprop as the recorded call ran it: the input quantized with the SR offset and scale it took
        then, the weight's copy it used, through the separate quantize and GEMM (the same bits as the
        one-call path); no counter, history, amax or weight cache touched."""
        sr_calls, scale, qw = self._replaying
        q, sr, seed, scale_name, _, _ = self._qspec[("input", usage)]
        kw = {}
        if scale_name is not None:
            kw["scale"] = scale
        if sr:
            kw["seed"], kw["offset"] = seed, sr_calls
        qx = q(x2d, **kw)
        return gemm(qx, qw, out_dtype=self._gemm_dtype), qx, qw

    def _forward(self, x: torch.Tensor, is_first_microbatch=None) -> torch.Tensor:
        params = self._parameters
        weight = params["weight"]
        bias = params["bias"] if "bias" in params else self.bias  # bias=False: a plain None attribute
        if is_first_microbatch is not None and not isinstance(is_first_microbatch, bool):
            _check_flag(is_first_microbatch, self.name, weight.get_device() if weight.is_cuda else None)
        if x.shape[-1] != self.in_features:
            raise _user_error(f"module {self.name or '<root>'}: input's last dimension is {x.shape[-1]}, "
                              f"expected {self.in_features}")
        flat = x.dim() == 2
        x2d = x if flat else x.reshape(-1, self.in_features)
        if not x2d.is_contiguous():
            x2d = x2d.contiguous()
        if x2d.dtype != weight.dtype:
            x2d = x2d.to(weight.dtype)
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            y = _LinearFn.apply(x2d, weight, bias, self, is_first_microbatch)
        else:
            y = self._fprop(x2d, weight, "inference", is_first_microbatch)[0]
            if y.dtype != weight.dtype:
                y = y.to(weight.dtype)
            if bias is not None:
                y = y.add_(bias)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)


class _GroupedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offsets, weight, module, is_first_microbatch):
        qx = module._quantize_grouped("input", x, offsets)
        qw = module._quantized_weight(is_first_microbatch)
        ctx.module, ctx.qx, ctx.qw, ctx.offsets = module, _save_input_copy(ctx, qx), qw, offsets
        return grouped_gemm(qx, qw, offsets, out_dtype=module._gemm_dtype).to(weight.dtype)

    @staticmethod
    def backward(ctx, dy):
        module, qx, qw, offsets = ctx.module, _saved_input_copy(ctx), ctx.qw, ctx.offsets
        qg = module._quantize_grouped("grad_output", dy.to(module.weight.dtype).contiguous(), offsets)
        dx = None
        if ctx.needs_input_grad[0]:
            if module._dense is None:
                dx = grouped_gemm(qg, qw, offsets, b_direction="columnwise", out_dtype=module._gemm_dtype)
            else:  # two formats no grouped GEMM reads together (the hybrid): per expert, the exact mixed route
                dx = module._dgrad_per_expert(qg, qw, offsets)
            dx = dx.to(module.weight.dtype)
        dw = None
        if ctx.needs_input_grad[2]:
            dw = grouped_gemm(qg, qx, offsets, a_direction="columnwise", b_direction="columnwise", wgrad=True,
                              out_dtype=module._gemm_dtype).to(module.weight.dtype)
        ctx.qx = ctx.qw = None
        return dx, None, dw, None, None


class GroupedLinear(_RecipeState, nn.Module):
    """MoE experts: y[rows of expert g] = x[rows of g] W[g]^T, the experts' token counts on the device.

    forward(x [M, in_features], offsets): offsets is a CUDA int64 tensor [num_experts + 1] of row
    offsets (tokens sorted by expert); no host sync. Roles: grouped_linear:<tensor>:<name>. The
    weights are one parameter [num_experts, out_features, in_features], quantized as one grouped
    tensor of num_experts members. Each expert's token count must meet the recipe's wgrad alignment
    (16 tokens for fp8, 32 for NVFP4; padding experts' tokens to 128 always does): the counts live on
    the device, so a count off that alignment gives NaN in that expert's weight gradient, as the
    grouped GEMM documents. A dgrad of two formats no grouped GEMM reads together (the hybrid's: dy's
    MXFP8 rowwise copy x W's NVFP4 columnwise copy) runs per expert on the dense GEMM's exact mixed
    route (_dgrad_per_expert): it reads the split on the host (one sync per backward) and needs
    offsets that start at 0, never fall and end at x's rows. Any other GEMM no grouped kernel reads
    is refused at construction."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, *, recipes: Recipes,
                 recipe: Optional[str] = None, name: str = "", device=None, dtype=torch.bfloat16):
        super().__init__()
        self.num_experts, self.in_features, self.out_features, self.name = num_experts, in_features, out_features, name
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features, device=device, dtype=dtype))
        for w in self.weight.data:
            nn.init.kaiming_uniform_(w, a=5 ** 0.5)
        self.q = {}
        for t in _TENSORS:
            role = f"grouped_linear:{t}:{name}" if name else f"grouped_linear:{t}"
            try:
                self.q[t] = recipes.quantizer(role, recipe=recipe, dtype=dtype, usage="training", grouped=True)
            except UserError as e:
                raise _user_error(f"module {name or '<root>'}: role {role}: {e}") from None
        self.recipe_names = recipes.names if recipe is None else [recipe]
        for t in _TENSORS:
            if self.q[t].inputs:
                raise _user_error(f"module {name or '<root>'}: grouped_linear:{t}: delayed scaling of grouped tensors "
                                  "is not supported by GroupedLinear yet (one scale per member)")
        self.register_buffer("weight_offsets", torch.arange(0, (num_experts + 1) * out_features, out_features,
                                                            dtype=torch.int64, device=device), persistent=False)
        self.sr_seed = zlib.crc32(name.encode()) ^ 0x5A5A
        self.sr_calls = 0
        self._wcache = None
        self._wflag = None
        self._replaying = None  # a checkpointed region's record of this call, while its recompute runs
        self._gemm_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        # Every GEMM the layer runs, built once here so a recipe no grouped GEMM reads fails now. A dgrad
        # of two formats no grouped GEMM reads together runs per expert on the dense mixed route
        # (self._dense: the dense quantizers it copies the members into; None: the grouped dgrad).
        from . import _grouped_plan
        probe = 128 * num_experts
        qx, qw, qg = self.q["input"], self.q["weight"], self.q["grad_output"]
        ix, iw, ig = qx._index, qw._index, qg._index
        self._dense = None
        self._wdense = None  # (the weight's grouped copy, its members' dense copies): _dense_weight
        gemms = (
            ("fprop", lambda: _grouped_plan(qx.id, probe, in_features, num_experts, ix["rowwise"], qw.id,
                                            num_experts * out_features, in_features, num_experts, iw["rowwise"], False,
                                            1, False)),
            ("dgrad", lambda: _grouped_plan(qg.id, probe, out_features, num_experts, ig["rowwise"], qw.id,
                                            num_experts * out_features, in_features, num_experts, iw["columnwise"],
                                            False, 1, False)),
            ("wgrad", lambda: _grouped_plan(qg.id, probe, out_features, num_experts, ig["columnwise"], qx.id, probe,
                                            in_features, num_experts, ix["columnwise"], True, 1, False)))
        for what, build in gemms:
            try:
                build()
            except (UserError, KeyError) as e:
                if what == "dgrad" and isinstance(e, UserError):
                    try:
                        self._dense = self._per_expert_dgrad(recipes, recipe, dtype)
                    except UserError as e2:
                        raise _user_error(f"module {name or '<root>'}: the recipe's grouped GEMMs: {e}; per expert: "
                                          f"{e2}") from None
                    if self._dense is not None:
                        continue
                raise _user_error(f"module {name or '<root>'}: the recipe's grouped GEMMs: {e}") from None

    def _per_expert_dgrad(self, recipes, recipe, dtype):
        """{"grad_output", "weight"}: the roles' dense quantizers (grouped=False, the same rules) where the
        dense GEMM of dy's rowwise copy by W's columnwise copy takes the exact mixed route
        (dequant_mixed: two formats, both copies in the layouts the GEMMs read); else None."""
        q = {}
        for t in ("grad_output", "weight"):
            role = f"grouped_linear:{t}:{self.name}" if self.name else f"grouped_linear:{t}"
            q[t] = recipes.quantizer(role, recipe=recipe, dtype=dtype, usage="training")
        g, w = q["grad_output"], q["weight"]
        if "rowwise" not in g._index or "columnwise" not in w._index:
            return None
        p = _plan(g.id, 128, self.out_features, g._index["rowwise"], w.id, self.out_features, self.in_features,
                  w._index["columnwise"], _OUT_CODE[self._gemm_dtype], False)
        return q if p.route == "dequant_mixed" else None

    def _dgrad_per_expert(self, qg: QuantizedTensor, qw: QuantizedTensor, offsets: torch.Tensor) -> torch.Tensor:
        """dx [M, in_features] (the GEMM's dtype): per expert with tokens, dy's member (rowwise) by W's
        member (columnwise) through the dense GEMM's exact mixed route (each operand dequantized exactly
        into bf16, NVFP4's S_dec as the GEMM's alpha), each member first copied out of its grouped
        allocation into a dense one (the bytes as they are). The split is read on the host: one sync."""
        name = self.name or "<root>"
        if torch.cuda.is_current_stream_capturing():
            raise _user_error(f"module {name}: the per-expert dgrad of a mixed-format recipe reads the experts' "
                              "token counts on the host, which a CUDA-graph capture cannot (capture the forward "
                              "only, or use a recipe whose dgrad is one grouped GEMM)")
        try:
            split = member_split(offsets.tolist(), qg.m, self.num_experts)
        except ValueError as e:
            raise _user_error(f"module {name}: offsets: {e} (the per-expert dgrad of a mixed-format recipe splits "
                              f"the tokens on the host)") from None
        try:
            members = QuantizedTensor(qg.buffer, qg.quantizer, qg.m, qg.k, qg.members, tuple(split)).member_views()
        except UserError as e:
            raise _user_error(f"module {name}: the experts' token counts {split}: {e}") from None
        w = self._dense_weight(qw)
        gq, wq = self._dense["grad_output"], self._dense["weight"]
        gi, wi, code = gq._index["rowwise"], wq._index["columnwise"], _OUT_CODE[self._gemm_dtype]
        dx = torch.zeros(qg.m, self.in_features, dtype=self._gemm_dtype, device=qg.buffer.device)
        start = 0
        for e, rows in enumerate(split):
            if rows:
                a = _dense_copy(members[e], gq, "rowwise")
                _gemm(a.buffer, gq.id, rows, a.k, gi, w[e].buffer, wq.id, w[e].m, w[e].k, wi, code, False,
                      dx[start:start + rows])
            start += rows
        return dx

    def _dense_weight(self, qw: QuantizedTensor):
        """Each expert's weight copy (a member of qw) in a dense allocation: copied once per grouped copy
        and kept with it, but for the copy a device flag rewrites in place (copied every call)."""
        have = self._wdense
        if have is not None and have[0] is qw:
            return have[1]
        views = QuantizedTensor(qw.buffer, qw.quantizer, qw.m, qw.k, qw.members,
                                (self.out_features,) * self.num_experts).member_views()
        copies = [_dense_copy(v, self._dense["weight"], "columnwise") for v in views]
        self._wdense = None if self._wflag is not None and self._wflag[1] is qw else (qw, copies)
        return copies

    def _quantize_grouped(self, t, x, offsets, noop=None, out=None):
        q = self.q[t]
        kw = {}
        if any(s.stochastic for s in q.streams.values()):
            kw["seed"], kw["offset"] = self.sr_seed + _TENSORS.index(t), self.sr_calls
            self.sr_calls += 1
        if noop is not None:
            kw["noop"] = noop
        if out is not None:
            kw["out"] = out
        return q(x, member_rows=offsets, **kw)

    def _quantized_weight(self, is_first_microbatch=None):
        """As Linear._quantized_weight, for the stacked experts' weights (a recompute's replay: the copy
        the recorded call used)."""
        if self._replaying is not None:
            return self._replaying[2]
        flag = is_first_microbatch
        w = self.weight.detach().reshape(self.num_experts * self.out_features, self.in_features)
        if isinstance(flag, torch.Tensor):
            have = self._wflag
            if have is not None and have[0] == w.data_ptr():
                self._quantize_grouped("weight", w, self.weight_offsets, noop=_skip_flag(flag), out=have[1].buffer)
                return have[1]
            qw = self._quantize_grouped("weight", w, self.weight_offsets)
            self._wflag = (w.data_ptr(), qw)
            return qw
        key = (self.weight._version, w.data_ptr())
        if self._wcache is not None and (flag is False or (flag is None and self._wcache[0] == key)):
            return self._wcache[1]
        self._wcache = (key, self._quantize_grouped("weight", w, self.weight_offsets))
        return self._wcache[1]

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, is_first_microbatch=None) -> torch.Tensor:
        """is_first_microbatch: as Linear.forward's (and qt.checkpoint's record and replay)."""
        return _checkpointed(self, self._forward, x, offsets, is_first_microbatch)

    def _snapshot(self, flag):
        """What a replay of this call needs, taken before it runs: the SR counter (no delayed scaling)."""
        return self.sr_calls, None

    def _used_weight(self, flag):
        """The weight's copy the call just made or reused."""
        return self._wflag[1] if isinstance(flag, torch.Tensor) else self._wcache[1]

    def _forward(self, x: torch.Tensor, offsets: torch.Tensor, is_first_microbatch=None) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise _user_error(f"module {self.name or '<root>'}: expected x [M, {self.in_features}], got {list(x.shape)}")
        if offsets.numel() != self.num_experts + 1:
            raise _user_error(f"module {self.name or '<root>'}: offsets: expected {self.num_experts + 1} row offsets, "
                              f"got {offsets.numel()}")
        _check_flag(is_first_microbatch, self.name, self.weight.get_device() if self.weight.is_cuda else None)
        return _GroupedFn.apply(x.to(self.weight.dtype).contiguous(), offsets, self.weight, self, is_first_microbatch)

    def invalidate_weight_cache(self) -> None:
        """As Linear.invalidate_weight_cache."""
        self._wcache = None
        self._wflag = None
        self._wdense = None

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, in_features={self.in_features}, out_features={self.out_features}, "
                f"recipe={','.join(self.recipe_names)}, name={self.name!r}")


_OUT_CODE = {torch.bfloat16: 1, torch.float32: 0}


# Activation checkpointing (checkpointing.py) ----------------------------------------------------------

def _checkpointed(module, forward, *args):
    """module's forward (args end with is_first_microbatch) as a checkpointed region needs it: outside
    one, as it is (a recompute without qt.checkpoint, i.e. a forward during backward, only where it
    quantizes reproducibly); in a region's forward, with a record of what its quantizes start from;
    in its recompute, replayed from that record with the SR counter put back where the call found
    it, and restored after."""
    if torch.compiler.is_compiling():  # traced: torch's own checkpointing, not hooked (checkpointing.py)
        return forward(*args)
    flag = args[-1]
    region = _ckpt.active()
    if region is None:
        if _ckpt.in_backward():
            _check_recompute(module, flag)
        return forward(*args)
    if region.replaying:
        record = region.take(module)
        calls = module.sr_calls
        module._replaying, module.sr_calls = record, record[0]
        try:
            return forward(*args)
        finally:
            module._replaying, module.sr_calls = None, calls
    start = module._snapshot(flag)
    y = forward(*args)
    region.put(module, start + (module._used_weight(flag),))
    return y


def _check_recompute(module, flag) -> None:
    """A recompute outside qt.checkpoint (plain torch.utils.checkpoint) runs the forward again: refused
    where that would not quantize as the forward did."""
    why = []
    for t in ("input", "weight"):
        q = module.roles[(t, "training")] if isinstance(module, Linear) else module.q[t]
        if q.inputs:
            why.append(f"{t}: delayed scaling (the updated scale, the history rolled again)")
        if any(s.stochastic for s in q.streams.values()):
            why.append(f"{t}: stochastic rounding (a new draw)")
    if flag is not None:
        why.append("is_first_microbatch (the weight's copy decided again)")
    if why:
        raise _user_error(f"module {module.name or '<root>'}: a forward during backward (torch.utils.checkpoint's "
                          f"recompute) would not quantize as the forward did ({'; '.join(why)}): checkpoint the "
                          "region with qt.checkpoint (or context_fn=qt.checkpoint_context), which replays it")


def _save_input_copy(ctx, qx: QuantizedTensor):
    """What a module's autograd node keeps of the input's quantized copy: inside a checkpointed region
    its buffer goes through ctx.save_for_backward (dropped with the region's activations, rebuilt by
    the recompute's replay) and the node keeps (quantizer, m, k, members); elsewhere the copy itself."""
    if torch.compiler.is_compiling() or _ckpt.active() is None:
        return qx
    ctx.save_for_backward(qx.buffer)
    return (qx.quantizer, qx.m, qx.k, qx.members)


def _saved_input_copy(ctx) -> QuantizedTensor:
    qx = ctx.qx
    if qx is None:  # the first backward released it
        raise _user_error("a second backward through a qforge module (retain_graph) is not supported: the first "
                          "one releases the quantized copies the layer saved")
    if isinstance(qx, QuantizedTensor):
        return qx
    return QuantizedTensor(ctx.saved_tensors[0], *qx)


def _dense_copy(member: QuantizedTensor, q, direction: str) -> QuantizedTensor:
    """One member of a grouped quantize (a member view: the dense layout of its shape, placed inside the
    grouped allocation) copied byte for byte into a dense allocation of q (the same role, grouped=False),
    which the dense GEMMs read: the buffers of `direction` and the per-tensor amax outputs, what a GEMM
    on that direction reads. Zeroed first: the rest and the padding a layout reserves hold zeros."""
    L = q.layout(member.m, member.k)
    try:
        moves = copy_moves(member.layout.buffers, L.buffers, q._index[direction])
    except ValueError as e:
        raise RuntimeError(f"qforge internal error: a grouped quantize's member and its dense layout differ: "
                           f"{e}") from None
    buf = torch.zeros(L.nbytes, dtype=torch.uint8, device=member.buffer.device)
    for src, dst, n in moves:
        buf[dst:dst + n].copy_(member.buffer[src:src + n])
    return QuantizedTensor(buf, q, member.m, member.k)
_NO_QUANTIZE = (None, 0, 0, None, None, None)  # the weight's arguments when its kept copy is used as it is


def _amax_name(t: QuantizedTensor) -> str:
    names = [b[0] for b in t.layout.buffers if b[1] == "amax"]
    if len(names) != 1:
        raise _user_error(f"delayed scaling: expected one amax output, the quantizer writes {names}")
    return names[0]


def _batched_history_items(model: nn.Module):
    """(quantizer, history, amax, scale) of every delayed-scaling tensor of the model's qt.Linear
    modules built with amax_update="batched", in module order."""
    items = []
    for mod in model.modules():
        if isinstance(mod, Linear) and mod.amax_update == "batched":
            for t in _TENSORS:
                q = mod.roles[(t, "training")]
                if q.inputs:
                    items.append((q, getattr(mod, f"{t}_amax_history"), getattr(mod, f"{t}_amax"),
                                  getattr(mod, f"{t}_scale")))
    return items


def convert(model: nn.Module, recipes: Recipes, *, recipe: Optional[str] = None,
            accumulate_main_grad: bool = False, amax_update: str = "each_quantize", skip=()) -> nn.Module:
    """Replaces every nn.Linear of `model` (in place; parameters kept) by a qt.Linear whose roles are
    linear:<tensor>:<fully qualified name>. `skip`: names (or predicates on (name, module)) left alone;
    amax_update: as Linear's ("batched": qt.update_amax_histories(model) once per step).
    Returns the model."""
    todo = []
    for name, mod in model.named_modules():
        if type(mod) is nn.Linear and not any(s(name, mod) if callable(s) else s == name for s in skip):
            todo.append((name, mod))
    for name, mod in todo:
        new = Linear.from_linear(mod, recipes=recipes, recipe=recipe, name=name,
                                 accumulate_main_grad=accumulate_main_grad, amax_update=amax_update)
        parent = model
        *path, leaf = name.split(".") if name else [""]
        if not name:
            raise _user_error("convert: the model itself is an nn.Linear; wrap it in a module")
        for p in path:
            parent = getattr(parent, p)
        setattr(parent, leaf, new)
    return model
