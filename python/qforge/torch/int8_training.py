"""INT8 weight-only training with the weights stored as int8 (docs/training.md, "INT8 parameters").

    import qforge.torch as qt
    model = qt.convert_int8(model, qt.Recipes("recipes/int8_weight_sr.json"), skip=["lm_head"])
    opt = qt.Int8AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad()

`Int8Linear` keeps one copy of its weight: an int8 parameter `weight` [out, in] and an fp32
buffer `weight_scale` [out] (one scale per row, the dequantized value is q * scale), no bf16 master
copy. Forward runs the recipe's fprop GEMM (bf16 input x int8 weight, the weight converted on chip)
on the stored int8 data directly; backward computes dgrad on the weight dequantized to bf16 and
accumulates wgrad (the recipe's bf16 x bf16 GEMM, fp32 output) into `weight.main_grad`.

`Int8SGD` / `Int8AdamW` step int8 parameters with one fused kernel per parameter (dequantize ->
fp32 update -> requantize with stochastic rounding, per row; templates/qforge/optim_int8.cuh) and
every other parameter with torch's own update rule. The stochastic rounding of a step draws from
the module's weight seed (the seed qt.Linear's weight quantize uses) at the module's call counter,
saved in its state_dict with the optimizer state in the optimizer's: a resumed run is
bit-identical.

`clip_grad_norm_` is torch.nn.utils.clip_grad_norm_ over the gradients these optimizers read: an
int8 parameter's `main_grad` (which torch's own does not see), every other parameter's `.grad`.
"""
import math
import weakref
import zlib
from typing import Optional

import torch
from torch import nn

from . import QuantizedTensor, Recipes, UserError, _C, _check_input, _ptr, _raw_stream, gemm

__all__ = ["Int8Linear", "convert_int8", "Int8SGD", "Int8AdamW", "int8_sgd_step", "int8_adamw_step",
           "weight_memory_bytes", "clip_grad_norm_"]


def _user_error(message: str) -> UserError:
    return UserError(1, message)


_TENSORS = ("input", "weight", "grad_output")
_SCALE_DTYPE = "bf16"  # the scale's rounding: a bf16 model's, as its weight quantize rounds it

def int8_owner(p: torch.Tensor) -> Optional["Int8Linear"]:
    """The Int8Linear whose weight p is (it keeps the weight's scales, seed and SR counter), or None.
    The module marks its weight with a weak reference to itself (set again by each forward, so a
    deep copy's weight gets its own)."""
    ref = getattr(p, "_qf_int8_owner", None)
    return None if ref is None else ref()


# ------------------------------------------------------------------------------------- functional steps


def _check_param(param, scale, grad, states):
    """The fused step's tensors: an int8 [rows, cols] CUDA parameter, fp32 [rows] scales, an fp32 or
    bf16 gradient of the parameter's shape, fp32 states of its shape (name -> tensor)."""
    if not isinstance(param, torch.Tensor) or param.dtype != torch.int8:
        got = param.dtype if isinstance(param, torch.Tensor) else type(param).__name__
        raise _user_error(f"param: expected an int8 parameter (Int8Linear's weight), got {got}")
    _check_input(param, torch.int8, None, "param")
    if param.dim() != 2:
        raise _user_error(f"param: expected a 2-D [rows, cols] tensor, got shape {list(param.shape)}")
    rows, cols = param.shape
    dev = param.get_device()
    if cols > _C.INT8_OPTIM_MAX_COLS:
        raise _user_error(f"param: rows of at most {_C.INT8_OPTIM_MAX_COLS} elements, got {cols}")
    _check_input(scale, torch.float32, dev, "scale")
    if tuple(scale.shape) != (rows,):
        raise _user_error(f"scale: expected shape [{rows}] (one fp32 scale per row), got {list(scale.shape)}")
    if not isinstance(grad, torch.Tensor) or grad.dtype not in (torch.float32, torch.bfloat16):
        got = grad.dtype if isinstance(grad, torch.Tensor) else type(grad).__name__
        raise _user_error(f"grad: expected a float32 or bfloat16 gradient, got {got}")
    _check_input(grad, grad.dtype, dev, "grad")
    if tuple(grad.shape) != (rows, cols):
        raise _user_error(f"grad: expected shape [{rows}, {cols}], got {list(grad.shape)}")
    for name, t in states.items():
        _check_input(t, torch.float32, dev, name)
        if tuple(t.shape) != (rows, cols):
            raise _user_error(f"{name}: expected shape [{rows}, {cols}], got {list(t.shape)}")
    return rows, cols, dev


def _check_noop(noop, dev):
    if noop is not None:
        _check_input(noop, torch.float32, dev, "noop")
        if noop.numel() != 1:
            raise _user_error(f"noop: expected 1 element, got {noop.numel()}")


def _grad_code(grad) -> str:
    return "bf16" if grad.dtype == torch.bfloat16 else "fp32"


def int8_sgd_step(param, scale, grad, momentum_buffer=None, *, lr: float, momentum: float = 0.0,
                  dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, step: int = 1,
                  seed: int = 0, offset: int = 0, noop: Optional[torch.Tensor] = None,
                  scale_dtype: str = _SCALE_DTYPE) -> None:
    """One fused SGD step of an int8 parameter in place (param, scale and momentum_buffer updated) on
    torch's current stream. step: 1 for the first (the momentum buffer starts as the gradient);
    (seed, offset): stochastic rounding; noop: a CUDA float32 [1], 1.0 skips the step."""
    states = {"momentum_buffer": momentum_buffer} if momentum != 0.0 else {}
    if momentum != 0.0 and momentum_buffer is None:
        raise _user_error("momentum_buffer: SGD with momentum needs an fp32 buffer of the parameter's shape")
    rows, cols, dev = _check_param(param, scale, grad, states)
    _check_noop(noop, dev)
    _C.int8_sgd_step(param.data_ptr(), scale.data_ptr(), grad.data_ptr(), _ptr(states.get("momentum_buffer")),
                     _ptr(noop), rows, cols, _grad_code(grad), scale_dtype, seed, offset, step, float(lr),
                     float(momentum), float(dampening), float(weight_decay), bool(nesterov), _raw_stream(dev), dev)


def int8_adamw_step(param, scale, grad, exp_avg, exp_avg_sq, *, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                    weight_decay: float = 1e-2, step: int = 1, seed: int = 0, offset: int = 0,
                    noop: Optional[torch.Tensor] = None, scale_dtype: str = _SCALE_DTYPE) -> None:
    """One fused AdamW step of an int8 parameter in place (param, scale, exp_avg, exp_avg_sq) on
    torch's current stream. step: 1 for the first (bias corrections); (seed, offset): stochastic
    rounding; noop: a CUDA float32 [1], 1.0 skips the step."""
    rows, cols, dev = _check_param(param, scale, grad, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq})
    _check_noop(noop, dev)
    beta1, beta2 = _betas(betas)
    _C.int8_adamw_step(param.data_ptr(), scale.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(),
                       _ptr(noop), rows, cols, _grad_code(grad), scale_dtype, seed, offset, step, float(lr), beta1,
                       beta2, float(eps), float(weight_decay), _raw_stream(dev), dev)


def _betas(betas):
    try:
        beta1, beta2 = betas
        return float(beta1), float(beta2)
    except (TypeError, ValueError):
        raise _user_error(f"betas: expected two floats, got {betas!r}") from None


# ------------------------------------------------------------------------------------------ the module


class _Int8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, anchor, bias, module):
        qx = module._quantize("input", x2d, "training")
        qw = module._qweight()
        y = gemm(qx, qw, out_dtype=torch.bfloat16)
        if bias is not None:
            y = y + bias
        ctx.module, ctx.qx, ctx.qw, ctx.has_bias = module, qx, qw, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        module, qx, qw = ctx.module, ctx.qx, ctx.qw
        dy = dy.to(torch.bfloat16).contiguous()
        dx = None
        if ctx.needs_input_grad[0]:
            # dgrad on the stored weight dequantized once to bf16 (q * scale, rounded to nearest even):
            # the recipe's dgrad reads a per-input-channel int8 copy, which int8 storage does not keep.
            dx = torch.matmul(dy, qw.dequantize(torch.bfloat16, "rowwise"))
        qg = module._quantize("grad_output", dy, "training")
        w = module.weight
        main = getattr(w, "main_grad", None)
        if main is None:
            w.main_grad = gemm(qg, qx, a_direction="columnwise", b_direction="columnwise", out_dtype=torch.float32)
        else:
            gemm(qg, qx, a_direction="columnwise", b_direction="columnwise", accumulate_into=main)
        db = dy.sum(0).to(module.bias.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        ctx.qx = ctx.qw = None
        return dx, None, db, None


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 + one fp32 scale per output row (see the module docstring).

    Parameters: `weight` (int8 [out_features, in_features], requires_grad False: its gradient goes to
    `weight.main_grad`, fp32, which Int8SGD / Int8AdamW read and zero_grad clears) and `bias` (bf16).
    Buffer: `weight_scale` (fp32 [out_features]). Roles: linear:<tensor>:<name> of the recipe, whose
    weight rowwise stream must be int8 per_channel with stochastic rounding (int8_weight_sr.json):
    its quantize makes the initial int8 weight, its scale and rounding rule are the optimizer
    step's. bf16 models only (the fprop GEMM reads bf16 activations)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipes: Recipes,
                 recipe: Optional[str] = None, name: str = "", device=None):
        super().__init__()
        w = torch.empty(out_features, in_features, device=device, dtype=torch.bfloat16)
        nn.init.kaiming_uniform_(w, a=5 ** 0.5)
        b = None
        if bias:
            bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
            b = nn.Parameter(torch.empty(out_features, device=device, dtype=torch.bfloat16).uniform_(-bound, bound))
        self._setup(w, b, recipes, recipe, name)

    @classmethod
    def from_linear(cls, lin: nn.Linear, *, recipes: Recipes, recipe: Optional[str] = None,
                    name: str = "") -> "Int8Linear":
        """The int8 form of an nn.Linear (bf16, on a CUDA device): its weight quantized once by the
        recipe's weight quantizer, its bias kept."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._setup(lin.weight.detach(), lin.bias, recipes, recipe, name)
        return self

    def _setup(self, w, bias, recipes, recipe, name):
        where = f"module {name or '<root>'}"
        if w.dtype != torch.bfloat16:
            raise _user_error(f"{where}: weight: Int8Linear trains bf16 models, got {w.dtype}")
        if not w.is_cuda:
            raise _user_error(f"{where}: weight: expected a CUDA tensor (the initial quantize runs on the GPU), "
                              f"got one on {w.device}")
        self.out_features, self.in_features = w.shape
        self.name = name
        if self.in_features > _C.INT8_OPTIM_MAX_COLS:
            raise _user_error(f"{where}: in_features: the fused optimizer step takes rows of at most "
                              f"{_C.INT8_OPTIM_MAX_COLS} elements, got {self.in_features}")
        self.recipe_names = recipes.names if recipe is None else [recipe]
        self.q = {}
        for t, usage in (("input", "training"), ("input", "inference"), ("grad_output", "training"),
                         ("weight", "inference")):
            role = f"linear:{t}:{name}" if name else f"linear:{t}"
            try:
                self.q[(t, usage)] = recipes.quantizer(role, recipe=recipe, dtype=torch.bfloat16, usage=usage)
            except UserError as e:
                raise _user_error(f"{where}: role {role}: {e}") from None
        wq = self.q[("weight", "inference")]
        s = wq.streams.get("rowwise")
        if s is None or s.format != "int8" or s.scaling != "per_channel" or not s.stochastic:
            got = "no rowwise stream" if s is None else f"{s.format}/{s.scaling}, stochastic={s.stochastic}"
            raise _user_error(f"{where}: role linear:weight: int8 storage needs an int8 per_channel rowwise stream "
                              f"with stochastic rounding (recipes/int8_weight_sr.json), got {got}")
        for (t, usage), qq in self.q.items():
            if qq.inputs:
                raise _user_error(f"{where}: role linear:{t}: delayed scaling is not supported by Int8Linear")
        self.sr_seed = zlib.crc32(name.encode())  # as qt.Linear's: tensor t draws from sr_seed + its index
        self.sr_calls = 0  # saved by get_extra_state
        self._layout = wq.layout(self.out_features, self.in_features)
        offs = {b[0]: b[6] for b in self._layout.buffers}
        self._data_offset, self._scale_offset = offs["rowwise_data"], offs["rowwise_scale_inv"]
        # The initial int8 weight and scales: the recipe's weight quantize (its first SR draw).
        qw = self._quantize("weight", w.contiguous(), "inference")
        self._store = qw.buffer
        self.weight = nn.Parameter(self._data_view(self._store), requires_grad=False)
        self.register_buffer("weight_scale", self._scale_view(self._store))
        self.bias = bias
        self._anchor = torch.empty(0, device=w.device, requires_grad=True)  # runs backward for inputs without grad
        self.weight._qf_int8_owner = weakref.ref(self)
        self._check_gemms()

    def _data_view(self, store):
        n = self.out_features * self.in_features
        return store[self._data_offset:self._data_offset + n].view(torch.int8).view(self.out_features, self.in_features)

    def _scale_view(self, store):
        return store[self._scale_offset:self._scale_offset + 4 * self.out_features].view(torch.float32)

    def _check_gemms(self):
        """The layer's fprop and wgrad GEMMs exist for the recipe's formats (a probe of 128 rows)."""
        from . import _out_code, _plan
        qx, qg, qw = self.q[("input", "training")], self.q[("grad_output", "training")], self.q[("weight", "inference")]
        try:
            _plan(qx.id, 128, self.in_features, qx._index["rowwise"], qw.id, self.out_features, self.in_features,
                  qw._index["rowwise"], _out_code(torch.bfloat16), False)
            _plan(qg.id, 128, self.out_features, qg._index["columnwise"], qx.id, 128, self.in_features,
                  qx._index["columnwise"], _out_code(torch.float32), False)
        except (UserError, KeyError) as e:
            raise _user_error(f"module {self.name or '<root>'}: the recipe's GEMMs for an int8 weight: {e}") from None

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"weight=int8 + fp32 row scales, recipe={','.join(self.recipe_names)}, name={self.name!r}")

    # State ----------------------------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        # weight (int8) and weight_scale (fp32) are views of one allocation, which torch.save refuses to
        # write as two dtypes: the scales go into the state_dict as their own copy (4 bytes a row).
        key = prefix + "weight_scale"
        if not keep_vars and key in destination:
            destination[key] = destination[key].clone()

    def get_extra_state(self):
        return {"sr_calls": self.sr_calls, "recipes": self.recipe_names, "weight_storage": "int8"}

    def set_extra_state(self, state):
        if state.get("recipes") != self.recipe_names or state.get("weight_storage") != "int8":
            raise _user_error(f"module {self.name or '<root>'}: checkpoint saved under recipe(s) "
                              f"{state.get('recipes')} with weight storage {state.get('weight_storage')!r}; "
                              f"the module runs {self.recipe_names} with int8 weights")
        self.sr_calls = int(state["sr_calls"])

    def weight_seed(self) -> int:
        """The stochastic-rounding seed of the weight's quantizes and optimizer steps."""
        return self.sr_seed + _TENSORS.index("weight")

    def next_sr_offset(self) -> int:
        """Takes the next stochastic-rounding counter value (saved in state_dict)."""
        off = self.sr_calls
        self.sr_calls += 1
        return off

    # Calls ----------------------------------------------------------------------------------------
    def _quantize(self, t: str, x: torch.Tensor, usage: str) -> QuantizedTensor:
        q = self.q[(t, usage)]
        kw = {}
        if any(s.stochastic for s in q.streams.values()):
            kw["seed"] = self.sr_seed + _TENSORS.index(t)
            kw["offset"] = self.next_sr_offset()
        return q(x, **kw)

    def _qweight(self) -> QuantizedTensor:
        """The stored weight as the GEMMs read it: one allocation holding the int8 data and the row
        scales in the weight quantizer's layout, whose views `weight` and `weight_scale` are. A
        module moved or loaded in a way that replaced those tensors gets a new allocation holding
        them (once), so the views hold again."""
        store, w, s = self._store, self.weight, self.weight_scale
        base = store.data_ptr()
        if (w.data_ptr() != base + self._data_offset or s.data_ptr() != base + self._scale_offset
                or w.device != store.device):
            _check_input(w, torch.int8, None, "weight")
            store = torch.empty(self._layout.nbytes, dtype=torch.uint8, device=w.device)
            data, scale = self._data_view(store), self._scale_view(store)
            data.copy_(w.detach())
            scale.copy_(s)
            self._store = store
            w.data = data
            self.weight_scale = scale
        if int8_owner(w) is not self:
            w._qf_int8_owner = weakref.ref(self)
        return QuantizedTensor(store, self.q[("weight", "inference")], self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise _user_error(f"module {self.name or '<root>'}: input's last dimension is {x.shape[-1]}, "
                              f"expected {self.in_features}")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features)
        if x2d.dtype != torch.bfloat16:
            x2d = x2d.to(torch.bfloat16)
        if not x2d.is_contiguous():
            x2d = x2d.contiguous()
        if torch.is_grad_enabled():
            y = _Int8LinearFn.apply(x2d, self._anchor, self.bias, self)
        else:
            y = gemm(self._quantize("input", x2d, "inference"), self._qweight(), out_dtype=torch.bfloat16)
            if self.bias is not None:
                y = y + self.bias
        return y.reshape(*lead, self.out_features)


def convert_int8(model: nn.Module, recipes: Recipes, *, recipe: Optional[str] = None, skip=()) -> nn.Module:
    """Replaces every nn.Linear of `model` (bf16, on a CUDA device; in place) by an Int8Linear whose
    weight is the nn.Linear's quantized once by the recipe's weight quantizer (the bf16 weight is
    then dropped) and whose roles are linear:<tensor>:<fully qualified name>. skip: names (or
    predicates on (name, module)) left alone. Returns the model."""
    todo = []
    for name, mod in model.named_modules():
        if type(mod) is nn.Linear and not any(s(name, mod) if callable(s) else s == name for s in skip):
            todo.append((name, mod))
    for name, mod in todo:
        if not name:
            raise _user_error("convert_int8: the model itself is an nn.Linear; wrap it in a module")
        new = Int8Linear.from_linear(mod, recipes=recipes, recipe=recipe, name=name)
        parent = model
        *path, leaf = name.split(".")
        for p in path:
            parent = getattr(parent, p)
        setattr(parent, leaf, new)
    return model


def weight_memory_bytes(rows: int, cols: int, optimizer: str = "adamw") -> dict:
    """Bytes of one weight [rows, cols] with its optimizer state: bf16 parameter + fp32 states
    against int8 data + fp32 row scales + fp32 states (docs/training.md's table)."""
    states = {"adamw": 2, "sgd_momentum": 1, "sgd": 0}.get(optimizer)
    if states is None:
        raise _user_error(f"optimizer: expected 'adamw', 'sgd_momentum' or 'sgd', got {optimizer!r}")
    n = rows * cols
    bf16 = 2 * n + states * 4 * n
    int8 = n + 4 * rows + states * 4 * n
    return {"bf16": bf16, "int8": int8, "ratio": int8 / bf16}


# ----------------------------------------------------------------------------------------- optimizers

_UNSUPPORTED = ("amsgrad", "maximize", "foreach", "fused", "capturable", "differentiable")


def _refuse_flags(cls_name: str, flags: dict) -> None:
    for k, v in flags.items():
        if k not in _UNSUPPORTED:
            raise _user_error(f"{k}: {cls_name} has no option {k!r}")
        if v not in (None, False):
            raise _user_error(f"{k}: {cls_name} does not support {k}={v!r} (the fused int8 step implements the "
                              "plain single-tensor rule)")


class _Int8Optimizer(torch.optim.Optimizer):
    """Int8 parameters (Int8Linear weights) by the fused kernel, the others by torch's rule."""

    def _check_params(self):
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.dtype == torch.int8 and int8_owner(p) is None:
                    raise _user_error(f"params: param_groups[{gi}]['params'][{pi}] is an int8 tensor that is no "
                                      "Int8Linear's weight (its scales and rounding seed are unknown)")
                if p.dtype != torch.int8 and not p.is_floating_point():
                    raise _user_error(f"params: param_groups[{gi}]['params'][{pi}] has dtype {p.dtype}; expected an "
                                      "Int8Linear weight (int8) or a floating-point parameter")

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype == torch.int8 and getattr(p, "main_grad", None) is not None:
                    if set_to_none:
                        p.main_grad = None
                    else:
                        p.main_grad.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype == torch.int8:
                    g = getattr(p, "main_grad", None)
                    if g is None:
                        continue
                    owner = int8_owner(p)
                    if owner is None:
                        raise _user_error("params: an int8 parameter that is no Int8Linear's weight")
                    owner._qweight()  # the views of the GEMMs' allocation hold before the step writes through them
                    self._int8_step(p, owner.weight_scale, g, self.state[p], group, owner)
                elif p.grad is not None:
                    self._float_step(p, p.grad, self.state[p], group)
        return loss


class Int8SGD(_Int8Optimizer):
    """torch.optim.SGD's rule (lr, momentum, dampening, weight_decay, nesterov); int8 parameters by
    the fused step (fp32 momentum buffer), the others as torch.optim.SGD does."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, **flags):
        _refuse_flags("Int8SGD", flags)
        for k, v in (("lr", lr), ("momentum", momentum), ("dampening", dampening), ("weight_decay", weight_decay)):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise _user_error(f"{k}: expected a finite value >= 0, got {v!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise _user_error("nesterov: Nesterov momentum needs momentum > 0 and dampening 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))
        self._check_params()

    def _int8_step(self, p, scale, g, state, group, owner):
        momentum = group["momentum"]
        buf = None
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        state["step"] = state.get("step", 0) + 1
        int8_sgd_step(p, scale, g, buf, lr=group["lr"], momentum=momentum, dampening=group["dampening"],
                      weight_decay=group["weight_decay"], nesterov=group["nesterov"], step=state["step"],
                      seed=owner.weight_seed(), offset=owner.next_sr_offset())

    def _float_step(self, p, g, state, group):
        d = g
        if group["weight_decay"] != 0:
            d = d.add(p, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = torch.clone(d).detach()
            else:
                buf.mul_(momentum).add_(d, alpha=1 - group["dampening"])
            d = d.add(buf, alpha=momentum) if group["nesterov"] else buf
        p.add_(d, alpha=-group["lr"])


class Int8AdamW(_Int8Optimizer):
    """torch.optim.AdamW's rule (lr, betas, eps, weight_decay; amsgrad, maximize and the foreach /
    fused / capturable / differentiable forms refused); int8 parameters by the fused step (fp32
    exp_avg and exp_avg_sq), the others as torch.optim.AdamW's single-tensor form does."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 **flags):
        _refuse_flags("Int8AdamW", flags)
        beta1, beta2 = _betas(betas)
        for k, v, lo, hi in (("lr", lr, 0.0, math.inf), ("betas[0]", beta1, 0.0, 1.0), ("betas[1]", beta2, 0.0, 1.0),
                             ("weight_decay", weight_decay, 0.0, math.inf)):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v < hi:
                raise _user_error(f"{k}: expected a finite value in [{lo}, {hi}), got {v!r}")
        if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
            raise _user_error(f"eps: expected a finite value > 0, got {eps!r}")
        super().__init__(params, dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay))
        self._check_params()

    def _int8_step(self, p, scale, g, state, group, owner):
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        state["step"] = state.get("step", 0) + 1
        int8_adamw_step(p, scale, g, state["exp_avg"], state["exp_avg_sq"], lr=group["lr"], betas=group["betas"],
                        eps=group["eps"], weight_decay=group["weight_decay"], step=state["step"],
                        seed=owner.weight_seed(), offset=owner.next_sr_offset())

    def _float_step(self, p, g, state, group):
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] = state.get("step", 0) + 1
        lr, (beta1, beta2), eps, wd, t = group["lr"], group["betas"], group["eps"], group["weight_decay"], state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        bias_correction1 = 1 - beta1 ** t
        bias_correction2 = 1 - beta2 ** t
        denom = (v.sqrt() / math.sqrt(bias_correction2)).add_(eps)
        p.addcdiv_(m, denom, value=-(lr / bias_correction1))


# ------------------------------------------------------------------------------------ gradient clipping


def _clip_grads(parameters) -> list:
    """The gradient of each parameter that has one, as the optimizers read it: `main_grad` where the
    parameter has one (an Int8Linear's weight; a qt.Linear weight with accumulate_main_grad), else
    `.grad`. parameters: a module (its parameters), one tensor or an iterable of tensors."""
    if isinstance(parameters, nn.Module):
        parameters = parameters.parameters()
    elif isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = []
    for p in parameters:
        g = getattr(p, "main_grad", None)
        if g is None:
            g = p.grad
        if g is not None:
            grads.append(g)
    return grads


def _by_device_and_dtype(grads: list) -> dict:
    """(device, dtype) -> gradients, grouped (and so summed) in the order torch's clip_grad_norm_
    groups them, so that the totals are the same bits."""
    from torch.utils import _foreach_utils as fu
    return {k: tensors for k, ([tensors], _) in fu._group_tensors_by_device_and_dtype([grads]).items()}


def _foreach_ok(foreach: Optional[bool], grads: list, device) -> bool:
    """torch.nn.utils.clip_grad_norm_'s choice: foreach=None takes the foreach kernels where the
    tensors support them, True demands them (a RuntimeError where the device has none), False never."""
    from torch.utils import _foreach_utils as fu
    if foreach is None:
        return fu._has_foreach_support(grads, device)
    if foreach and not fu._device_has_foreach_support(device):
        raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on {device.type} tensors")
    return bool(foreach)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over int8 training's gradients (`_clip_grads`: `main_grad` where
    a parameter has one, else `.grad`): the norm of order `norm_type` of all of them together (each
    gradient's norm, on its own device and in its own dtype, then the norm of those on the first
    gradient's device), every gradient scaled in place by min(1, max_norm / (total + 1e-6)). Returns
    the total norm (a tensor; tensor(0.) with no gradient). error_if_nonfinite: a RuntimeError, and
    no gradient changed, when the total is NaN or infinite. foreach: as torch's (None: the foreach
    kernels where supported)."""
    grads = _clip_grads(parameters)
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not grads:
        return torch.tensor(0.0)
    first_device = grads[0].device
    groups = _by_device_and_dtype(grads)
    norms = []
    for (device, _), gs in groups.items():
        if _foreach_ok(foreach, gs, device):
            norms.extend(torch._foreach_norm(gs, norm_type))
        else:
            norms.extend(torch.linalg.vector_norm(g, norm_type) for g in gs)
    total = torch.linalg.vector_norm(torch.stack([n.to(first_device) for n in norms]), norm_type)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
                           "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
                           "anyway, set `error_if_nonfinite=False`")
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for (device, _), gs in groups.items():
        c = coef.to(device)
        if _foreach_ok(foreach, gs, device):
            torch._foreach_mul_(gs, c)
        else:
            for g in gs:
                g.mul_(c)
    return total
