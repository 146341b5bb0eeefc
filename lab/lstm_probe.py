"""Where an fp32 LSTM case's error comes from, step by step: the gate pre-activations z_t, the cell
states c_t and the gate gradients dG_t (= dL/dz_t) of ours (the kernels' own act, cs and dG) and of
eager (the PyTorch step loop in fp32), each against the float64 step loop of the same inputs and
upstream gradients (lab.awkward's case and draw), and dh0 at the end.

    python -m lab.lstm_probe [--case JSON] [--device cuda]

Without --case: the H200 sweep's one fp32 LSTM case over 2x eager (seed 180 at 873dc1e: B1 H1 T3,
x_scale 10, dh0 4.3e-6 against eager's 1.6e-7; the CPU interpreter's eager 2.1e-6). Prints, per
step and per gate (i, f, g, o), the relative error of each quantity, ours beside eager's."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

CASE = {"op": "lstm", "dtype": "float32", "dims": {"B": 1, "H": 1, "I": 1, "T": 3},
        "options": {"resets": "clear", "gates": "typical", "x_scale": 10.0, "layout": "strided",
                    "grad_layout": "strided"}, "refusal": None, "seed": 516135693}
GATES = "ifgo"


def step_loop(x, h0, c0, w_ih, w_hh, b, resets):
    """The LSTM step loop (kcollect.kernels.lstm.naive) keeping each step's z (gate-major [B, 4H],
    its gradient retained) and c."""
    from kcollect.kernels._spec.cells import keep_factor

    gx = (x @ w_ih.t() + b).unbind(1)
    h, c, ys, zs, cs = h0, c0, [], [], []
    for t in range(x.shape[1]):
        keep = keep_factor(resets, t, x)
        if keep is not None:
            h, c = h * keep, c * keep
        z = gx[t] + h @ w_hh.t()
        z.retain_grad()
        i, f, g, o = z.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        ys.append(h), zs.append(z), cs.append(c)
    return (torch.stack(ys, 1), h, c), zs, cs


def _run_loop(inputs, dys, dtype):
    """(zs, cs, dGs, dh0) of the step loop in `dtype` from the inputs and upstream gradients."""
    xs = {k: (v.to(dtype).detach().requires_grad_(k == "h0") if torch.is_tensor(v) and v.is_floating_point()
              else v) for k, v in inputs.items()}
    outs, zs, cs = step_loop(**xs)
    torch.autograd.backward(list(outs), [d.to(dtype) for d in dys])
    return [z.detach() for z in zs], [c.detach() for c in cs], [z.grad for z in zs], xs["h0"].grad


def _ours(inputs, dys):
    """(zs, cs, dGs, dh0) of our kernels, gate-major like the step loop's."""
    from kcollect.kernels.lstm import fitted, lstm_bwd, lstm_fwd, pick
    from kcollect.kernels._host.cells import unit_major

    x, h0, c0, w_ih, w_hh, b, resets = (inputs[k] for k in ("x", "h0", "c0", "w_ih", "w_hh", "b", "resets"))
    B, T, I = x.shape
    H = w_hh.shape[1]
    config = fitted(pick(B, H, x.device), x.dtype, H, x.device, picked=True)
    perm = unit_major(H, 4, x.device)
    inv = torch.argsort(perm)
    w_ih_p, w_hh_p = w_ih[perm], w_hh[perm].contiguous()
    gx = torch.addmm(b[perm], x.reshape(B * T, I), w_ih_p.t()).view(B, T, 4 * H)
    resets = resets.contiguous() if resets is not None else None
    _, cs, act, _ = lstm_fwd(gx, w_hh_p.t().contiguous(), h0.contiguous(), c0.contiguous(), resets, True, config)
    dy, dhn, dcn = (d.to(x.dtype).contiguous() for d in dys)
    dg, dh0, _ = lstm_bwd(dy, dhn, dcn, w_hh_p, act, cs, resets, config)
    return ([act[:, t][:, inv] for t in range(T)], [cs[:, t + 1] for t in range(T)],
            [dg[:, t][:, inv] for t in range(T)], dh0)


def _err(got, want) -> str:
    """Norm-wise relative error, and the largest element's."""
    from kcollect import verify

    g, w = got.double(), want.double()
    elem = ((g - w).abs() / w.abs().clamp_min(1e-300)).max().item() if w.numel() else 0.0
    return f"{verify.rel_error(g, w):.2e} (max {elem:.1e})"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.lstm_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", help="a case of lab.awkward (JSON); default: seed 180's")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined
    from kcollect import verify
    from lab.awkward import cells, common

    case = json.loads(args.case) if args.case else CASE
    subject = cells.subject(case, args.device)
    _, _, dys = common._reference(subject)
    inputs = subject.make_inputs()
    z64, c64, g64, dh64 = _run_loop(verify.upcast(inputs), dys, torch.float64)
    eager = _run_loop(inputs, dys, torch.float32)
    ours = _ours(inputs, dys)
    H = inputs["w_hh"].shape[1]
    print(f"# {json.dumps(case)} on {args.device}")
    for t in range(len(z64)):
        print(f"step {t}: c ours {_err(ours[1][t], c64[t])}  eager {_err(eager[1][t], c64[t])}")
        for k, name in enumerate(GATES):
            s = slice(k * H, (k + 1) * H)
            print(f"  {name}: z {z64[t][:, s].abs().max().item():8.3g}  z ours {_err(ours[0][t][:, s], z64[t][:, s])}"
                  f"  eager {_err(eager[0][t][:, s], z64[t][:, s])}   dG ours {_err(ours[2][t][:, s], g64[t][:, s])}"
                  f"  eager {_err(eager[2][t][:, s], g64[t][:, s])}")
    print(f"dh0: ours {_err(ours[3], dh64)}  eager {_err(eager[3], dh64)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
