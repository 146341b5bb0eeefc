"""The mLSTM backward's link scan (_mlstm_dlinks) alone, timed over its tiles: steps a program,
warps, and the fp32 path's float64 sigmoid against tl.sigmoid, on random terms at the grid's (BH, T).

    python -m lab.dlinks_ab [--shape BH,T ...] [--chunk 64]

Prints µs a call (triton.testing.do_bench_cudagraph) per shape and tile."""
from __future__ import annotations

import argparse

import torch
import triton.testing

from kcollect.kernels.mlstm.bwd import dlinks, links_meta

SHAPES = ("8,256", "128,60", "64,1024", "128,2048", "512,1024", "8,8192")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.dlinks_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append")
    ap.add_argument("--chunk", type=int, default=64)
    args = ap.parse_args()
    L = args.chunk
    print(f"# {torch.cuda.get_device_name()}, L {L}; µs a call")
    for text in args.shape or SHAPES:
        BH, T = map(int, text.split(","))
        NC = -(-T // L)
        links = torch.randn(BH, NC, 4, device="cuda")
        links[..., 3] = torch.randint(-1, L + 1, (BH, NC), device="cuda").float()
        f = torch.randn(BH, T, device="cuda", dtype=torch.bfloat16) * 3
        di, df = (torch.randn(BH, T, device="cuda") for _ in range(2))
        out = [torch.empty(BH, T, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        row = []
        for precise in (False, True):
            for steps in (64, 128, 256, 512, 1024, 4096):
                for warps in (0, 1, 4):
                    tile = dict(steps=steps, warps=warps)
                    if precise and (steps, warps) != (512, 0):
                        continue
                    ms = triton.testing.do_bench_cudagraph(
                        lambda: dlinks(links, f, di, df, *out, L, precise, **tile), rep=50)
                    meta = links_meta(L, NC, **tile)
                    row.append((ms * 1e3, f"{'f64sig ' if precise else ''}steps{steps} w{meta['num_warps']} "
                                          f"G{meta['G']} CB{meta['CB']}"))
        row.sort()
        print(f"BH={BH} T={T}: " + "; ".join(f"{name} {us:.1f}" for us, name in row[:6])
              + f" ... worst {row[-1][1]} {row[-1][0]:.1f}; f64 " + "; ".join(f"{us:.1f}" for us, n in row if "f64" in n))


if __name__ == "__main__":
    main()
