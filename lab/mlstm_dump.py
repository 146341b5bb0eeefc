"""Every intermediate of one mLSTM case's forward and backward, saved for a comparison across
machines (the GPU's compiled kernels against the interpreter's; it showed the bf16 case of
lab.mlstm_bf16_diag to be the same on both but for its upstream gradients, which the sweep then
drew on each device's generator):

    python -m lab.mlstm_dump --device cuda --out gpu.pt      (and --device cpu --out cpu.pt)
    python -m lab.mlstm_dump --compare gpu.pt cpu.pt

The case is lab.mlstm_bf16_diag.CASE, or --case (a sweep's case, as JSON), at chunks of 64 on both
(the GPU's). Saved: the returned final state (C_T, n_T, m_T) beside the float64 reference's, the forward's
states at chunk starts (cs, ns, ms), each step's stabiliser and normaliser (mo, den), h, and the
gradients from the float64 reference's upstream gradient; the comparison prints each tensor's
largest difference, relative to its norm, and where."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch


def dump(device: str, out: str, case: dict | None = None) -> None:
    from lab.awkward import cells, common
    from lab.mlstm_bf16_diag import CASE
    from kcollect.kernels.mlstm import dot_mode, mlstm, mlstm_bwd, mlstm_fwd, pick
    from kcollect.kernels.mlstm.naive import EPS

    subject = cells.subject(case or CASE, device)
    outs, grads, dys = common._reference(subject)
    inputs = subject.make_inputs()
    q, k, v, i, f, rs = (inputs[n] for n in ("q", "k", "v", "i", "f", "resets"))
    B, NH, T, DH = q.shape
    config = dataclasses.replace(pick(T, DH, device), chunk=64)
    fast = dot_mode(q.dtype, device, DH)
    flat = [x.reshape(B * NH, T, DH).contiguous() for x in (q, k, v)]
    flat += [x.reshape(B * NH, T).contiguous() for x in (i, f)]
    rs = rs.contiguous() if rs is not None else None
    h, cs, ns, ms, mo, den = mlstm_fwd(*flat, rs, NH, config, fast, EPS)
    dh = dys[0].to(q.dtype).reshape(B * NH, T, DH).contiguous()
    dq, dk, dv, di, df = mlstm_bwd(dh, *flat, rs, NH, h, (cs, ns, ms, mo, den), config, fast, EPS)
    saved = dict(h=h, cs=cs, ns=ns, ms=ms, mo=mo, den=den, dq=dq, dk=dk, dv=dv, di=di, df=df)
    final = mlstm(q, k, v, i, f, rs, config=config)[1:]
    saved.update({n: t for n, t in zip(("C_T", "n_T", "m_T"), final)})
    saved = {n: t.detach().double().cpu() for n, t in saved.items()}
    saved.update({f"ref_{n}": t.detach().double().cpu() for n, t in zip(("C_T", "n_T", "m_T"), outs[1:])})
    saved.update({f"ref_d{n}": g.detach().double().cpu().reshape(saved[f"d{n}"].shape)
                  for n, g in zip(subject.grad_inputs, grads)})
    torch.save(saved, out)


def compare(a_path: str, b_path: str) -> None:
    a, b = torch.load(a_path), torch.load(b_path)
    for name in a:
        x, y = a[name], b[name]
        diff = (x - y).abs()
        rel = (diff.norm() / y.norm().clamp_min(1e-300)).item()
        where = tuple(int(w) for w in torch.nonzero(diff == diff.max())[0]) if diff.numel() else ()
        print(f"{name:8s} {tuple(x.shape)!s:20s} rel {rel:.3g}  max |diff| {diff.max().item():.4g} at {where}: "
              f"{x[where].item():.6g} vs {y[where].item():.6g}")
        if name.startswith("ref_d"):
            ours = name[4:]
            for label, t in (("first", a), ("second", b)):
                e = t[ours] - t[name]  # rows: the steps t
                e = e.reshape(e.shape[1], -1) if e.dim() == 3 else e.reshape(-1, 1)
                per = e.norm(dim=1) / t[name].norm()
                top = torch.topk(per, min(3, per.numel()))
                print(f"    {ours} vs float64, {label}: {per.norm().item():.3g}; rows " +
                      ", ".join(f"t{int(r)} {float(p):.3g}" for p, r in zip(top.values, top.indices)))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.mlstm_dump", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    ap.add_argument("--case", help="a sweep's case (JSON) instead of lab.mlstm_bf16_diag.CASE")
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        return 0
    if args.device == "cpu":  # Triton's interpreter, set before the kernels are imported
        os.environ["TRITON_INTERPRET"] = "1"
    dump(args.device, args.out, json.loads(args.case) if args.case else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
