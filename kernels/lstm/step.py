"""One LSTM step from a carried (h, c), for inference one frame at a time: the gates as two cuBLAS
GEMMs (the second accumulating into the first: gates = x W_ih^T + b + h W_hh^T), then one launch
for the cell. A one-step sequence does not need the persistent launch of lstm(): nothing is
carried on chip from one step to the next. Forward only."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._host.cells import precise
from .._jit.recurrent import sigmoid_f32, tanh_f32


@triton.jit
def _cell(G, C, HN, CN, H, sg, BH: tl.constexpr, PRECISE: tl.constexpr):
    b = tl.program_id(0)
    u = tl.program_id(1) * BH + tl.arange(0, BH)
    m = u < H
    row = G + b * sg + u
    i = sigmoid_f32(tl.load(row, mask=m, other=0.0).to(tl.float32), PRECISE)
    f = sigmoid_f32(tl.load(row + H, mask=m, other=0.0).to(tl.float32), PRECISE)
    g = tanh_f32(tl.load(row + 2 * H, mask=m, other=0.0).to(tl.float32), PRECISE)
    o = sigmoid_f32(tl.load(row + 3 * H, mask=m, other=0.0).to(tl.float32), PRECISE)
    c = f * tl.load(C + b * H + u, mask=m, other=0.0).to(tl.float32) + i * g
    tl.store(CN + b * H + u, c.to(CN.dtype.element_ty), mask=m)
    tl.store(HN + b * H + u, (o * tanh_f32(c, PRECISE)).to(HN.dtype.element_ty), mask=m)


def lstm_step(x, h, c, w_ih, w_hh, b):
    """(h', c') [Bt, H] like h and c. x [Bt, I], h and c [Bt, H], w_ih [4H, I], w_hh [4H, H], b [4H]
    (PyTorch's gate order i, f, g, o; its two biases summed)."""
    Bt, H = h.shape
    if c.shape != (Bt, H) or w_hh.shape != (4 * H, H) or b.shape != (4 * H,) or x.shape[0] != Bt \
            or w_ih.shape != (4 * H, x.shape[1]):
        raise ValueError(f"lstm_step: x [{Bt}, I], c [{Bt}, {H}], w_ih [{4 * H}, I], w_hh [{4 * H}, {H}] and "
                         f"b [{4 * H}]; got {list(x.shape)}, {list(c.shape)}, {list(w_ih.shape)}, "
                         f"{list(w_hh.shape)} and {list(b.shape)}")
    gates = torch.addmm(F.linear(x, w_ih, b), h, w_hh.t())
    c = c.contiguous()
    hn, cn = torch.empty_like(h, memory_format=torch.contiguous_format), torch.empty_like(c)
    BH = max(16, min(triton.next_power_of_2(H), 1024))
    _cell[(Bt, triton.cdiv(H, BH))](gates, c, hn, cn, H, gates.stride(0), BH=BH, PRECISE=precise(gates.dtype))
    return hn, cn
