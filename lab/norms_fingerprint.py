"""The launches of rms_norm, add_rms_norm and layer_norm on an emulated H100 / H200
(lab/fingerprint_norms.py): every shape of their full grids, bf16 (fp16 and fp32 on a few shapes),
each phase the collector's modes run: `fwd` (mode fwd: inference, no autograd), `fwd_train` (the
forward of modes bwd and fwd+bwd, which keeps the statistics) and `bwd` (the backward, as the
autograd wrappers call it).

    python lab/norms_fingerprint.py --out after.json
    mkdir /tmp/old && git archive REV | tar -x -C /tmp/old    # the kernels before a change
    python lab/norms_fingerprint.py --tree /tmp/old --out before.json
    python lab/norms_fingerprint.py --compare before.json after.json
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab import fingerprint_norms as fingerprint  # noqa: E402  (first: it sets up the offline compile)

import torch  # noqa: E402

# (op, dims) also timed in fp16 and fp32: a shape of each launch path (register tiles of one and
# two column blocks, persistent grids, unaligned rows, the wide rows' lines / packed / coop paths)
OTHER_DTYPES = {
    ("rms_norm", (8192, 4096)), ("rms_norm", (16384, 5120)), ("rms_norm", (2048, 16384)),
    ("rms_norm", (999, 5003)), ("rms_norm", (1024, 65536)),
    ("add_rms_norm", (8192, 4096)), ("add_rms_norm", (999, 5003)), ("add_rms_norm", (1024, 65536)),
    ("layer_norm", (4096, 4096)), ("layer_norm", (8192, 8192)), ("layer_norm", (3000, 5120)),
    ("layer_norm", (4096, 16384)), ("layer_norm", (2048, 65536)),
}


def _meta(*shape, dtype, grad=False):
    return torch.empty(shape, dtype=dtype, device="meta").requires_grad_(grad)


def _rms_norm(K, m, n, dtype):
    def fwd(grad):
        x, w = _meta(m, n, dtype=dtype, grad=grad), _meta(n, dtype=dtype, grad=grad)
        with torch.set_grad_enabled(grad):
            K.rms_norm(x, w, 1e-6)

    def bwd():
        x, w = _meta(m, n, dtype=dtype), _meta(n, dtype=dtype)
        K.rms_norm_backward(_meta(m, n, dtype=dtype), x, w, _meta(m, dtype=torch.float32))
    return fwd, bwd


def _add_rms_norm(K, R, m, n, dtype):
    def fwd(grad):
        x, r, w = _meta(m, n, dtype=dtype, grad=grad), _meta(m, n, dtype=dtype, grad=grad), _meta(n, dtype=dtype)
        with torch.set_grad_enabled(grad):
            K.add_rms_norm(x, r, w, 1e-6)

    def bwd():  # AddRMSNormFunction.backward with both outputs used
        h, w = _meta(m, n, dtype=dtype), _meta(n, dtype=dtype)
        R.rms_norm_backward(_meta(m, n, dtype=dtype), h, w, _meta(m, dtype=torch.float32), dh=_meta(m, n, dtype=dtype))
    return fwd, bwd


def _layer_norm(K, m, n, dtype):
    def fwd(grad):
        x, w, b = (_meta(*s, dtype=dtype, grad=grad) for s in ((m, n), (n,), (n,)))
        with torch.set_grad_enabled(grad):
            K.layer_norm(x, w, b, 1e-5)

    def bwd():
        x, w = _meta(m, n, dtype=dtype), _meta(n, dtype=dtype)
        stats = _meta(m, dtype=torch.float32)
        K.layer_norm_backward(_meta(m, n, dtype=dtype), x, w, stats, stats)
    return fwd, bwd


def cases() -> list[dict]:
    from kcollect.kernels import add_rms_norm, layer_norm, rms_norm
    from kcollect.kernels.add_rms_norm.spec import SPEC as ADD
    from kcollect.kernels.layer_norm.spec import SPEC as LN
    from kcollect.kernels.rms_norm.spec import SPEC as RMS

    makers = {"rms_norm": (RMS, lambda m, n, d: _rms_norm(rms_norm, m, n, d)),
              "add_rms_norm": (ADD, lambda m, n, d: _add_rms_norm(add_rms_norm, rms_norm, m, n, d)),
              "layer_norm": (LN, lambda m, n, d: _layer_norm(layer_norm, m, n, d))}
    out = []
    for op, (spec, make) in makers.items():
        for shape in spec.grids["full"]:
            m, n = shape.dims["M"], shape.dims["N"]
            dtypes = (torch.bfloat16,) + ((torch.float16, torch.float32) if (op, (m, n)) in OTHER_DTYPES else ())
            for dtype in dtypes:
                fwd, bwd = make(m, n, dtype)
                name = dict(op=op, shape=f"{m}x{n}", dtype=str(dtype)[6:])
                out += [name | dict(phase="fwd", call=lambda f=fwd: f(False)),
                        name | dict(phase="fwd_train", call=lambda f=fwd: f(True)),
                        name | dict(phase="bwd", call=bwd)]
    return out


if __name__ == "__main__":
    sys.exit(fingerprint.main(cases))
