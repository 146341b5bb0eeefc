"""Attention's backward, kernel by kernel (torch.profiler, ms a call over 10 calls): attention()'s
picked backward beside SDPA's cuDNN backend, at issue 41's D 128 shapes (bf16), on one GPU.

    PYTHONPATH=. python lab/attention_bwd_kernels.py
"""
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity
from kcollect.kernels.attention import attention
def prof(name, fn, calls=10):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls): fn()
        torch.cuda.synchronize()
    rows = sorted(((e.device_time_total / calls / 1000, e.key) for e in p.key_averages() if e.device_time_total > 0), reverse=True)
    print(f"  {name}: " + "; ".join(f"{k[:70]} {ms:.4f} ms" for ms, k in rows[:6]), flush=True)
for B, H, HKV, S, causal in ((4, 16, 16, 4096, False), (4, 16, 16, 4096, True), (1, 16, 16, 16384, True), (4, 32, 8, 4096, True)):
    print(f"B{B} H{H}:{HKV} S{S} D128 causal={causal} bf16", flush=True)
    q = torch.randn(B, S, H, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, S, HKV, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    do = torch.randn_like(q)
    o = attention(q, k, v, causal)
    prof("kcollect bwd", lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=H != HKV)
    dot = do.transpose(1, 2).contiguous()
    prof("cudnn bwd", lambda: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True))
