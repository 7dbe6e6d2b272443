"""The torch custom ops behind qforge.torch (what torch.compile traces), with fake implementations
that give output shapes and dtypes from the compiled core's layouts, host only.

Quantizers and GEMM plans cross the op boundary as integers (a quantizer's id, the shapes and
stream indices), which dynamo treats as constants; the eager path of qforge.torch calls the same
implementations without the dispatcher."""
from typing import Optional, Tuple

import torch

from . import (_CODES, _dequantize, _fprop_plan, _gemm, _linear_forward, _plan, _quantize, _quantize_grouped,
               _quantizers, _stored_shape, _update_amax_history)

Tensor = torch.Tensor


@torch.library.custom_op("qforge::quantize", mutates_args=(), device_types="cuda")
def quantize(x: Tensor, qid: int, noop: Optional[Tensor], seed: int, offset: int, scale: Optional[Tensor],
             scale1: Optional[Tensor]) -> Tensor:
    return _quantize(x, qid, noop, seed, offset, scale, scale1)


@quantize.register_fake
def _(x, qid, noop, seed, offset, scale, scale1):
    m, k = x.shape
    L = _quantizers[qid].layout(int(m), int(k))
    return x.new_empty((L.nbytes,), dtype=torch.uint8)


# The same with the tensor amax also sent to amax_out: an op of its own with a required mutated
# argument, because Inductor cannot lower an optional mutated argument passed None (torch 2.11:
# "getitem is not an OpOverload").
@torch.library.custom_op("qforge::quantize_amax_out", mutates_args=("amax_out",), device_types="cuda")
def quantize_amax_out(x: Tensor, qid: int, noop: Optional[Tensor], seed: int, offset: int, scale: Optional[Tensor],
                      scale1: Optional[Tensor], amax_out: Tensor) -> Tensor:
    return _quantize(x, qid, noop, seed, offset, scale, scale1, amax_out)


@quantize_amax_out.register_fake
def _(x, qid, noop, seed, offset, scale, scale1, amax_out):
    m, k = x.shape
    L = _quantizers[qid].layout(int(m), int(k))
    return x.new_empty((L.nbytes,), dtype=torch.uint8)


@torch.library.custom_op("qforge::quantize_grouped", mutates_args=(), device_types="cuda")
def quantize_grouped(x: Tensor, member_rows: Tensor, qid: int, noop: Optional[Tensor], seed: int, offset: int,
                     scale: Optional[Tensor], scale1: Optional[Tensor]) -> Tensor:
    return _quantize_grouped(x, member_rows, qid, noop, seed, offset, scale, scale1)


@quantize_grouped.register_fake
def _(x, member_rows, qid, noop, seed, offset, scale, scale1):
    m, k = x.shape
    L = _quantizers[qid].layout(int(m), int(k), int(member_rows.shape[0]) - 1)
    return x.new_empty((L.nbytes,), dtype=torch.uint8)


@torch.library.custom_op("qforge::dequantize", mutates_args=(), device_types="cuda")
def dequantize(buffer: Tensor, qid: int, m: int, k: int, stream_index: int, dtype_code: int) -> Tensor:
    return _dequantize(buffer, qid, m, k, stream_index, dtype_code)


@dequantize.register_fake
def _(buffer, qid, m, k, stream_index, dtype_code):
    return buffer.new_empty(_stored_shape(_quantizers[qid], m, k, stream_index), dtype=_CODES[dtype_code])


@torch.library.custom_op("qforge::gemm", mutates_args=(), device_types="cuda")
def gemm(a: Tensor, qa: int, am: int, ak: int, ai: int, b: Tensor, qb: int, bm: int, bk: int, bi: int,
         out_code: int) -> Tensor:
    return _gemm(a, qa, am, ak, ai, b, qb, bm, bk, bi, out_code, False, None)


@gemm.register_fake
def _(a, qa, am, ak, ai, b, qb, bm, bk, bi, out_code):
    p = _plan(qa, am, ak, ai, qb, bm, bk, bi, out_code, False)
    return a.new_empty((p.m, p.n), dtype=_CODES[out_code])


@torch.library.custom_op("qforge::gemm_accumulate", mutates_args=("d",), device_types="cuda")
def gemm_accumulate(d: Tensor, a: Tensor, qa: int, am: int, ak: int, ai: int, b: Tensor, qb: int, bm: int, bk: int,
                    bi: int, out_code: int) -> None:
    _gemm(a, qa, am, ak, ai, b, qb, bm, bk, bi, out_code, True, d)


@gemm_accumulate.register_fake
def _(d, a, qa, am, ak, ai, b, qb, bm, bk, bi, out_code):
    return None


@torch.library.custom_op("qforge::update_amax_history", mutates_args=("history", "scale", "scale_inv"),
                         device_types="cuda")
def update_amax_history(history: Tensor, amax: Tensor, scale: Tensor, scale_inv: Optional[Tensor],
                        noop: Optional[Tensor], qid: int, input_index: int) -> None:
    _update_amax_history(history, amax, scale, scale_inv, noop, qid, input_index)


@update_amax_history.register_fake
def _(history, amax, scale, scale_inv, noop, qid, input_index):
    return None


# A linear layer's forward in one op: the input's quantize, the weight's, then fprop (qt.linear_forward,
# qt.Linear): returns (D, the input's buffer, the weight's buffer).
@torch.library.custom_op("qforge::linear_forward", mutates_args=(), device_types="cuda")
def linear_forward(x: Tensor, qx: int, x_seed: int, x_offset: int, x_scale: Optional[Tensor], w: Tensor, qw: int,
                   w_seed: int, w_offset: int, w_scale: Optional[Tensor], out_code: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _linear_forward(x, _quantizers[qx], (None, x_seed, x_offset, x_scale, None, None), w, _quantizers[qw],
                           (None, w_seed, w_offset, w_scale, None, None), int(w.shape[0]), None, out_code)


@linear_forward.register_fake
def _(x, qx, x_seed, x_offset, x_scale, w, qw, w_seed, w_offset, w_scale, out_code):
    m, k = x.shape
    _, x_nbytes, w_nbytes, _, shape, dtype = _fprop_plan(_quantizers[qx], int(m), int(k), _quantizers[qw],
                                                         int(w.shape[0]), out_code)
    return (x.new_empty(shape, dtype=dtype), x.new_empty((x_nbytes,), dtype=torch.uint8),
            x.new_empty((w_nbytes,), dtype=torch.uint8))


# The same with the weight's kept copy (w_buffer, [n, K] in qw's layout) instead of its quantize:
# returns (D, the input's buffer).
@torch.library.custom_op("qforge::linear_forward_cached", mutates_args=(), device_types="cuda")
def linear_forward_cached(x: Tensor, qx: int, x_seed: int, x_offset: int, x_scale: Optional[Tensor], w_buffer: Tensor,
                          qw: int, n: int, out_code: int) -> Tuple[Tensor, Tensor]:
    d, xb, _ = _linear_forward(x, _quantizers[qx], (None, x_seed, x_offset, x_scale, None, None), None,
                               _quantizers[qw], (None, 0, 0, None, None, None), n, w_buffer, out_code)
    return d, xb


@linear_forward_cached.register_fake
def _(x, qx, x_seed, x_offset, x_scale, w_buffer, qw, n, out_code):
    m, k = x.shape
    _, x_nbytes, _, _, shape, dtype = _fprop_plan(_quantizers[qx], int(m), int(k), _quantizers[qw], int(n), out_code)
    return x.new_empty(shape, dtype=dtype), x.new_empty((x_nbytes,), dtype=torch.uint8)
