"""Float64 replays of attention's backward with chosen roundings, to say which step an error comes
from (issue 40): the backward's maths (P, dP, delta, dS, dq/dk/dv) in float64 on the case's own
inputs and upstream gradient (rounded to the dtype, as the kernels get it), rounding only where
asked:

    rounded_o   delta = rowsum(do * o) from o rounded to the dtype (else from o as summed)
    gpu_fwd     o as the GPU's forward sums it: p = exp(s - rowmax) rounded to the dtype before
                p @ v, over the unrounded sum of p (one key block: the awkward cases' shapes)
    round_p_ds  P rounded before dv = P^T do, dS before dq and dk (the GPU's tensor-core operands)
    shift       dq = sum_j dS_j (k_j - c), c the row's last visible key (BwdConfig.dq_shift)

and the dq, dk, dv errors against the float64 reference for each, beside ours and eager's:

    python -m lab.attention_replay lab/results/awkward_cpu_seed1129_528b9e4.txt [more files]

(the attention cases each file lists under its worst cases; the CPU interpreter runs ours).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VARIANTS = {  # name: (delta from, round_p_ds, shift)
    "o rounded": ("rounded_o", False, False),
    "o exact": ("exact", False, False),
    "o rounded, GPU operands": ("rounded_o", True, False),
    "GPU fwd o, GPU operands": ("gpu_fwd", True, False),
    "GPU fwd o, GPU operands, shift": ("gpu_fwd", True, True),
}


def _heads_first(x, packed: bool):
    return (x[None] if packed else x).transpose(1, 2)  # [B, H, S, D]


def _mask(inputs):
    from kcollect.kernels.attention import providers
    from kcollect.kernels.attention.naive import visible

    q, k = inputs["q"], inputs["k"]
    if inputs.get("cu_seqlens_q") is not None:
        cq, ck = inputs["cu_seqlens_q"].contiguous(), inputs["cu_seqlens_k"].contiguous()
        return providers.packed_mask(cq, ck, q.shape[0], k.shape[0], inputs["causal"], inputs["window"])
    return visible(q.shape[1], k.shape[1], inputs["causal"], inputs["window"])


def replay(inputs, dy, dtype, delta_from: str, round_p_ds: bool, shift: bool):
    """(dq, dk, dv) of the backward in float64 with the roundings named (module docstring), each
    rounded to the dtype at the end as the kernels store them."""
    import torch

    packed = inputs.get("cu_seqlens_q") is not None
    q, k, v = (_heads_first(inputs[n].detach().double(), packed) for n in "qkv")
    do = _heads_first(dy.to(dtype).double(), packed)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    keep = _mask(inputs)
    scale = q.shape[-1] ** -0.5
    s = ((q @ k.transpose(-1, -2)) * scale).masked_fill(~keep, float("-inf"))
    rowmax = s.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
    e = torch.exp(s - rowmax)
    l = e.sum(-1, keepdim=True)
    p = torch.where(l > 0, e / l.clamp_min(1e-300), torch.zeros_like(e))
    rnd = lambda x, on=True: x.to(dtype).double() if on else x  # noqa: E731
    o = p @ v
    if delta_from == "rounded_o":
        o = rnd(o)
    elif delta_from == "gpu_fwd":
        o = torch.where(l > 0, (rnd(e) @ v) / l.clamp_min(1e-300), torch.zeros_like(o))
    delta = (do * o).sum(-1, keepdim=True)
    ds = rnd(p * (do @ v.transpose(-1, -2) - delta), round_p_ds)
    dq = ds @ k
    if shift:
        last = torch.where(keep, torch.arange(keep.shape[-1]), -1).amax(-1).clamp_min(0)
        dq = dq - ds.sum(-1, keepdim=True) * k[..., last, :]
    dk, dv = ds.transpose(-1, -2) @ q, rnd(p, round_p_ds).transpose(-1, -2) @ do
    b, h, sk, d = dk.shape
    dk, dv = (x.view(b, h // group, group, sk, d).sum(2) for x in (dk, dv))
    back = lambda x: x.transpose(1, 2)[0] if packed else x.transpose(1, 2)  # noqa: E731
    return [rnd(back(x)) for x in (dq * scale, dk * scale, dv)]


def main(argv=None) -> int:
    files = (argv if argv is not None else sys.argv[1:]) or ["lab/results/awkward_cpu_seed1129_528b9e4.txt"]
    os.environ["TRITON_INTERPRET"] = "1"
    from kcollect import verify

    from .awkward import attention as family, common, sweep

    seen = set()
    for f in files:
        for case in sweep.worst_cases(Path(f)):
            if case.get("op") != "attention" or case["path"] == "decode" or case["seed"] in seen:
                continue
            seen.add(case["seed"])
            subject = family.subject(case, "cpu")
            if not subject.grad_inputs or case["refusal"]:
                continue
            _, want, dys = common._reference(subject)
            row = lambda grads: " ".join(f"d{n} {verify.rel_error(g, w):.3g}"  # noqa: E731
                                         for n, g, w in zip("qkv", grads, want))
            print(json.dumps(case))
            for name, fn in (("ours", subject.ours), ("eager", subject.eager)):
                print(f"    {name:40s} {row(common._run(fn, subject, dys).grads)}")
            inputs = subject.make_inputs()
            for name, args in VARIANTS.items():
                print(f"    {'replay, ' + name:40s} {row(replay(inputs, dys[0], subject.dtype, *args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
