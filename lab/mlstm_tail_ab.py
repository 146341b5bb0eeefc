"""The mLSTM backward's two light kernels alone, timed over their tiles on random inputs at the
grid's (BH, T): the link scan (_mlstm_dlinks: steps a program, warps, the fp32 path's float64
sigmoid against tl.sigmoid) and the per-step prep (_mlstm_dprep: rows a program, warps).

    python -m lab.mlstm_tail_ab [--shape BH,T ...] [--chunk 64] [--dh 64]

Prints µs a call (triton.testing.do_bench_cudagraph) per shape and tile, the fastest first."""
from __future__ import annotations

import argparse

import torch
import triton.testing

from kcollect.kernels.mlstm.bwd import _mlstm_dprep, dlinks, links_meta

SHAPES = ("8,256", "128,60", "64,1024", "128,2048", "512,1024", "8,8192")


def time_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3


def links_row(BH: int, T: int, L: int) -> list[tuple[float, str]]:
    NC = -(-T // L)
    links = torch.randn(BH, NC, 4, device="cuda")
    links[..., 3] = torch.randint(-1, L + 1, (BH, NC), device="cuda").float()
    f = torch.randn(BH, T, device="cuda", dtype=torch.bfloat16) * 3
    di, df = (torch.randn(BH, T, device="cuda") for _ in range(2))
    out = [torch.empty(BH, T, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    row = []
    for precise, steps, warps in [(False, s, w) for s in (64, 128, 256, 512, 1024) for w in (0, 1, 4)] + [(True, 512, 0)]:
        tile = dict(steps=steps, warps=warps)
        G, meta = links_meta(L, NC, **tile)
        us = time_us(lambda: dlinks(links, f, di, df, *out, L, precise, **tile))
        row.append((us, f"{'f64sig ' if precise else ''}steps{steps} w{meta['num_warps']} G{G} CB{meta['CB']}"))
    return sorted(row)


def prep_row(BH: int, T: int, DH: int) -> list[tuple[float, str]]:
    R = BH * T
    dh, h = (torch.randn(R, DH, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mo, den = torch.randn(R, device="cuda"), torch.randn(R, device="cuda")
    qinv, dden, dmj = (torch.empty(R, device="cuda") for _ in range(3))
    dp = triton.next_power_of_2(DH)
    row = []
    for elems in (2048, 4096, 8192, 16384):
        for warps in (2, 4, 8):
            br = max(1, elems // dp)
            us = time_us(lambda: _mlstm_dprep[(triton.cdiv(R, br),)](dh, h, mo, den, qinv, dden, dmj, R, DH, 1e-6,
                                                                       BR=br, DP=dp, PRECISE=False, num_warps=warps))
            row.append((us, f"rows{br} w{warps}"))
    return sorted(row)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.mlstm_tail_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--dh", type=int, default=64)
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, L {args.chunk}, DH {args.dh}; µs a call, the fastest first")
    for text in args.shape or SHAPES:
        BH, T = map(int, text.split(","))
        for name, row in (("dlinks", links_row(BH, T, args.chunk)), ("dprep", prep_row(BH, T, args.dh))):
            print(f"{name} BH={BH} T={T}: " + "; ".join(f"{n} {us:.1f}" for us, n in row))


if __name__ == "__main__":
    main()
