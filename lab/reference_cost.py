"""What the float64 reference of a stepped op costs the collector (one forward and backward, as
verify.reference_modes computes it for a case's modes), against the same step loop written with an
index per step (x[:, t]): that form's backward writes each step's gradient into zeros of the whole
input, quadratic in T. The indexed forms below are the references as they were before they took
their steps with unbind; they are kept here only to be timed.

    python -m lab.reference_cost [--device cuda] [--ops rtu,selective_scan,slstm]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

# a large full-grid shape of each op, and a CPU-sized one of the same length
SHAPES = {
    "cuda": {
        "rtu": {"B": 8, "T": 8192, "H": 1024, "R": "diag", "resets": 1, "p": 0.01},
        "selective_scan": {"B": 8, "T": 2048, "D": 1024, "N": 16},
        "slstm": {"B": 64, "NH": 16, "T": 256, "DH": 64, "resets": "0.1"},
    },
    "cpu": {
        "rtu": {"B": 8, "T": 4096, "H": 64, "R": "diag", "resets": 1, "p": 0.01},
        "selective_scan": {"B": 2, "T": 2048, "D": 128, "N": 16},
        "slstm": {"B": 2, "NH": 4, "T": 2048, "DH": 32, "resets": "0.1"},
    },
}


def indexed_rtu(x, nu_log, theta_log, map1, map2, resets=None):
    from kcollect.kernels.rtu.naive import dynamics, injections

    u1, u2 = injections(x, map1, map2)
    lam, gamma = dynamics(nu_log, theta_log)
    drive = torch.complex(u1, u2) * gamma
    c = torch.zeros(x.shape[0], x.shape[2], dtype=drive.dtype, device=x.device)
    states = []
    for t in range(x.shape[1]):
        if resets is not None:
            c = c * (~resets[:, t, None]).to(x.dtype)
        c = lam * c + drive[:, t]
        states.append(c)
    c = torch.stack(states, dim=1)
    return F.silu(torch.cat([c.real, c.imag], dim=-1))


def indexed_selective_scan(x, delta, A, B, C, D, z):
    from torch.utils.checkpoint import checkpoint

    from kcollect.kernels.selective_scan.naive import REFERENCE_STEPS_KEPT

    def steps(h, x, dt, A, B, C, D):
        ys = []
        for t in range(x.shape[1]):
            h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[:, :, None] * B[:, t, None, :]
            ys.append((h * C[:, t, None, :]).sum(-1) + D * x[:, t])
        return h, torch.stack(ys, dim=1)

    dt = F.softplus(delta)
    h = torch.zeros(x.shape[0], x.shape[2], A.shape[1], dtype=x.dtype, device=x.device)
    parts = []
    for t0 in range(0, x.shape[1], REFERENCE_STEPS_KEPT):
        s = slice(t0, t0 + REFERENCE_STEPS_KEPT)
        h, y = checkpoint(steps, h, x[:, s], dt[:, s], A, B[:, s], C[:, s], D, use_reentrant=False)
        parts.append(y)
    return torch.cat(parts, dim=1) * F.silu(z)


def indexed_slstm(wx, r, b, y0, c0, n0, m0, resets=None):
    """The sLSTM step loop with wx indexed a step at a time: the index is the only difference, so
    the current loop runs on a wrapper whose unbind hands out those indexed views."""
    from kcollect.kernels.slstm import spec

    class Indexed(torch.Tensor):
        def unbind(self, dim=0):
            plain = self.as_subclass(torch.Tensor)
            return [plain.select(dim, t) for t in range(plain.shape[dim])]

    return spec.step_loop(wx.as_subclass(Indexed), r, b, y0, c0, n0, m0, resets)


INDEXED = {"rtu": indexed_rtu, "selective_scan": indexed_selective_scan, "slstm": indexed_slstm}


def seconds(spec, inputs, device: str) -> float:
    from kcollect import verify

    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    verify.reference_modes(spec, inputs, ("fwd", "bwd"), 1)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    from dataclasses import replace

    from kcollect.registry import load

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ops", default="rtu,selective_scan,slstm")
    args = ap.parse_args()
    registry = load(plugins=False)
    print(f"{'op':<15} {'shape':<48} {'unbind s':>9} {'indexed s':>10}", flush=True)
    for op in args.ops.split(","):
        spec = registry.get(op)
        dims = SHAPES[args.device][op]
        inputs = spec.make_inputs(dims, torch.bfloat16, args.device, 0)
        seconds(spec, inputs, args.device)  # the first call: the allocator and first launches
        new = seconds(spec, inputs, args.device)
        old = seconds(replace(spec, reference=INDEXED[op]), inputs, args.device)
        shape = ",".join(f"{k}={v}" for k, v in dims.items())
        print(f"{op:<15} {shape:<48} {new:9.2f} {old:10.2f}", flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
