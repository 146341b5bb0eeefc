"""One kernel launch per case, for Nsight Compute on the GPU: what holds each wide-row kernel below
the copy bandwidth (DRAM and L2 throughput, L2 hit rate, pipe use, warp stall reasons).

Each case runs its op three times on random bf16 inputs (the first call compiles), so that
`ncu --launch-skip 1 --launch-count 1 --kernel-name regex:NAME` profiles a warm launch:

    ncu --clock-control none --kernel-name regex:_softmax_fwd_lines --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python benchmarks/ncu_cases.py softmax-fwd-2048x65536

    python benchmarks/ncu_cases.py --list        # the cases and the kernel each profiles
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kcollect.kernels import cross_entropy, layer_norm, rms_norm, softmax  # noqa: E402


def _x(m, n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(m, n, generator=g, device="cuda") * 2).to(torch.bfloat16)


def softmax_fwd(m, n):
    x = _x(m, n)
    return lambda: softmax.softmax_forward(x)


def softmax_bwd(m, n):
    y = softmax.softmax_forward(_x(m, n))
    dy = _x(m, n, 1)
    return lambda: softmax.softmax_backward(dy, y)


def rms_norm_bwd(m, n):
    x, dy = _x(m, n), _x(m, n, 1)
    w = torch.rand(n, device="cuda").to(torch.bfloat16)
    _, _, rstd = rms_norm.rms_norm_forward(x, w)
    return lambda: rms_norm.rms_norm_backward(dy, x, w, rstd)


def layer_norm_bwd(m, n):
    x, dy = _x(m, n), _x(m, n, 1)
    w = torch.rand(n, device="cuda").to(torch.bfloat16)
    b = torch.rand(n, device="cuda").to(torch.bfloat16)
    _, mean, rstd = layer_norm.layer_norm_forward(x, w, b, 1e-5)
    return lambda: layer_norm.layer_norm_backward(dy, x, w, mean, rstd)


def cross_entropy_grad(m, n):
    x = _x(m, n)
    t = torch.randint(0, n, (m,), device="cuda")
    return lambda: cross_entropy.cross_entropy_forward(x, t, cross_entropy.IGNORE_INDEX, 0.0, need_grad=True)


# name -> (builder, M, N, the kernel to profile)
CASES = {
    "softmax-fwd-2048x65536": (softmax_fwd, 2048, 65536, "_softmax_fwd_lines"),
    "softmax-fwd-1024x262144": (softmax_fwd, 1024, 262144, "_softmax_fwd_coop"),
    "softmax-bwd-2048x65536": (softmax_bwd, 2048, 65536, "_softmax_bwd_coop"),
    "rms_norm-bwd-1024x65536": (rms_norm_bwd, 1024, 65536, "^_bwd_coop"),
    "layer_norm-bwd-2048x65536": (layer_norm_bwd, 2048, 65536, "_ln_bwd_coop"),
    "layer_norm-bwd-32768x4096": (layer_norm_bwd, 32768, 4096, "_ln_bwd_rows"),
    "cross_entropy-grad-8192x128256": (cross_entropy_grad, 8192, 128256, "_ce_rows"),
    "cross_entropy-grad-4096x256000": (cross_entropy_grad, 4096, 256000, "_ce_rows"),
}


def main():
    if sys.argv[1:] == ["--list"]:
        for name, (_, _, _, kernel) in CASES.items():
            print(name, kernel)
        return
    (name,) = sys.argv[1:]
    build, m, n, _ = CASES[name]
    fn = build(m, n)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
