"""rms_norm against its float64 reference: each provider, mode and dtype once (opcheck.lean_reference_cases); every
launch path the heuristics can pick, forced onto small shapes through `config=`; what the
heuristics pick on an H100/H200; the GPU-only paths (coop segments that wait for each other, the
PTX widening, the L2 prefetch) on a Hopper GPU."""
import os
import random

import pytest
import torch

import opcheck
from kcollect.kernels import rms_norm as K
from kcollect.kernels._host.rows import persistent_grid
from kcollect.kernels.rms_norm import config as C
from kcollect.kernels.rms_norm.spec import SPEC, reference

# 23x300: four rows a program, tail masked, two sweeps of the CPU's 4-program persistent grid;
# 1x4099: one row (the backward's single program writes dw itself), odd width, the forward in two
# column blocks (4096 + 4); 5x7: rows narrower than a vector. (torch.compile is PyTorch's code on
# the eager function that `torch` checks: not compiled here.)
SHAPES = [{"M": 23, "N": 300}, {"M": 1, "N": 4099}, {"M": 5, "N": 7}]
# The forced paths run once each, in bf16 (the dtype timed) and fp32 (the tightest tolerance) in
# turn; fp16's casts are the default path's, checked above.


@pytest.mark.parametrize("provider, mode, dtype, dims", opcheck.lean_reference_cases(SPEC, SHAPES))
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def inputs(m, n, dtype, tiny_row=True):
    """x, w, eps; tiny_row: see opcheck.row_inputs (left out where elementwise fp32 checks leave no
    room for that row's larger rstd)."""
    inp = opcheck.row_inputs(SPEC, m, n, dtype, ("x",) if tiny_row else ())
    return inp["x"], inp["w"], inp["eps"]


def reference_grads(x, w, eps, dy):
    xd, wd = x.double().requires_grad_(True), w.double().requires_grad_(True)
    y = reference(xd, wd, eps)
    dx, dw = torch.autograd.grad(y, (xd, wd), dy.double())
    return y.detach(), dx, dw


def rel(got, want):
    return (torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want)).item()


def forward_paths(dtype):
    """{name: (M, N, config)}: every forward kernel and its branches on small shapes."""
    vec = 16 // dtype.itemsize
    return {
        # persistent grid with the next tile prefetched; one tile per program without it
        "rows-prefetch": (23, 300, C.RowsConfig(512, 0, 4, 4, prefetch=True)),
        "rows-one-tile": (23, 300, C.RowsConfig(512, 0, 4, 4, persistent=False)),
        "rows-two-blocks": (9, 640, C.RowsConfig(512, 128, 2, 4, prefetch=True)),
        # full chunks and a masked tail, programs striding over the rows (4 for 5); full chunks only;
        # a row of one full chunk and a partial one
        "lines-tail-strided": (5, 2500, K.LinesConfig(512, vec, 4, programs_per_sm=1)),
        "lines-no-tail": (3, 2048, K.LinesConfig(512, vec, 4)),
        "lines-narrow": (5, 100, K.LinesConfig(64, vec, 4, programs_per_sm=2)),
        "packed": (3, 1000, C.PackedConfig(1024, 4)),
        "split": (3, 1000, C.SplitConfig(256, 4)),  # 4 segments a row, the last partial
    }


@pytest.mark.parametrize("path, dtype", opcheck.in_turn(forward_paths(torch.float32)))
def test_forward_paths(path, dtype):
    m, n, config = forward_paths(dtype)[path]
    x, w, eps = inputs(m, n, dtype)
    y, h, rstd = K.rms_norm_forward(x, w, eps, config=config)
    assert h is None
    assert rel(y, reference(x.double(), w.double(), eps)) <= SPEC.tolerance[dtype]
    rstd_ref = 1.0 / torch.sqrt(x.double().pow(2).mean(-1) + eps)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-5, atol=0)


def backward_paths():
    """{name: (M, N, config)}: every backward kernel and its branches on small shapes."""
    return {
        "rows-prefetch-rstd-ahead": (23, 300, C.BwdRowsConfig(512, 4, 4, prefetch=True, rstd_ahead=True)),
        "rows-prefetch": (23, 300, C.BwdRowsConfig(512, 4, 4, prefetch=True, rstd_ahead=False)),
        "rows-no-prefetch": (9, 300, C.BwdRowsConfig(512, 1, 4, prefetch=False, rstd_ahead=False)),
        # several column blocks and row groups, the row dots in several chunks, partial tiles
        "cols": (23, 300, C.ColsConfig(dot_chunk=128, block_r=4, block_c=128)),
        # the GPU's wide-row backward; on the CPU one segment a row (its programs would wait for each
        # other: test_coop_backward_on_the_gpu runs it in segments), 4 programs striding over rows
        "coop": (23, 300, C.CoopConfig(seg=512)),
    }


@pytest.mark.parametrize("path, dtype", opcheck.in_turn(backward_paths()))
def test_backward_paths(path, dtype):
    m, n, config = backward_paths()[path]
    x, w, eps = inputs(m, n, dtype)
    dy = torch.randn(m, n).to(dtype)
    _, _, rstd = K.rms_norm_forward(x, w, eps)
    dx, dw = K.rms_norm_backward(dy, x, w, rstd, config=config)
    _, dx_ref, dw_ref = reference_grads(x, w, eps, dy)
    tol = SPEC.tolerance[dtype]
    assert rel(dx, dx_ref) <= tol and rel(dw, dw_ref) <= tol


def test_every_element_is_written_and_rstd_saved():
    # fp32, elementwise: a skipped tile, row or column block would show wherever empty() left
    # garbage; rstd is what the backward relies on.
    x, w, eps = inputs(23, 640, torch.float32, tiny_row=False)  # the forward in two blocks (512 + 128)
    dy = torch.randn(23, 640)
    y, _, rstd = K.rms_norm_forward(x, w, eps)
    dx, dw = K.rms_norm_backward(dy, x, w, rstd)
    y_ref, dx_ref, dw_ref = reference_grads(x, w, eps, dy)
    rstd_ref = 1.0 / torch.sqrt(x.double().pow(2).mean(-1) + eps)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx.double(), dx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw.double(), dw_ref, rtol=1e-5, atol=1e-5)


def test_inference_keeps_no_rstd():
    x, w, eps = inputs(9, 300, torch.float32)
    y, _, rstd = K.rms_norm_forward(x, w, eps, need_rstd=False)
    assert rstd is None
    with torch.no_grad():
        torch.testing.assert_close(K.rms_norm(x, w, eps), y, rtol=0, atol=0)
    torch.testing.assert_close(y, K.rms_norm_forward(x, w, eps)[0], rtol=0, atol=0)


def test_batched_input_and_fp32_weight():
    # [B, T, N] input; a weight kept in fp32 next to bf16 activations: y takes x's dtype, dw w's.
    x = torch.randn(2, 5, 384).to(torch.bfloat16).requires_grad_(True)
    w = (1.0 + 0.3 * torch.randn(384)).requires_grad_(True)
    y = K.rms_norm(x, w, 1e-6)
    dy = torch.randn(2, 5, 384).to(torch.bfloat16)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert dx.dtype == torch.bfloat16 and dx.shape == x.shape and dw.dtype == torch.float32
    y_ref, dx_ref, dw_ref = reference_grads(x.detach(), w.detach(), 1e-6, dy)
    tol = SPEC.tolerance[torch.bfloat16]
    assert rel(y, y_ref) <= tol and rel(dx, dx_ref) <= tol and rel(dw, dw_ref) <= tol


@pytest.mark.parametrize("tiles,resident", [(8192, 528), (19, 4), (1, 132), (1000, 1000), (32768, 264), (7, 3)])
def test_persistent_grid(tiles, resident):
    programs, per = persistent_grid(tiles, resident)
    assert programs <= resident and programs * per >= tiles  # fits one wave, covers every tile
    assert (programs - 1) * per < tiles  # no program is left without a tile
    assert per == -(-tiles // resident)  # as few sweeps as the resident slots allow
    if (tiles, resident) == (8192, 528):
        assert (programs, per) == (512, 16)


def test_bad_inputs_and_configs_are_refused():
    with pytest.raises(ValueError, match="weight must be"):
        K.rms_norm(torch.randn(4, 8), torch.randn(7))
    with pytest.raises(ValueError, match="weight must be"):
        K.rms_norm(torch.randn(4, 8), torch.randn(1, 8))
    x, w, eps = inputs(4, 1000, torch.float32)
    with pytest.raises(ValueError, match="must cover"):
        K.rms_norm_forward(x, w, eps, config=C.RowsConfig(512, 256))
    with pytest.raises(ValueError, match="power-of-two"):
        K.rms_norm_forward(x, w, eps, config=C.RowsConfig(1024, 0, rows=3))
    with pytest.raises(ValueError, match="holds rows of up to 512"):
        K.rms_norm_forward(x, w, eps, config=C.PackedConfig(512, 4))
    with pytest.raises(ValueError, match="not a forward config"):
        K.rms_norm_forward(x, w, eps, config=C.ColsConfig())
    with pytest.raises(ValueError, match="not a backward config"):
        K.rms_norm_backward(x, x, w, torch.ones(4), config=C.SplitConfig(256, 4))
    with pytest.raises(ValueError, match="need a GPU"):  # segments that would wait for each other
        K.rms_norm_backward(x, x, w, torch.ones(4), config=C.CoopConfig(seg=256))


def test_forward_picks(monkeypatch):
    gpu, b, f32 = opcheck.fake_gpu(monkeypatch), torch.bfloat16, torch.float32
    fwd = C.pick_forward
    # one block where a second would not save lanes (1000 -> 1024, two rows a program; 3584 -> 4096),
    # two where it does (5120 = 4096 + 1024, 1536 = 1024 + 512, 2560 = 2048 + 512; 4099 = 4096 + 4);
    # the sm_90 register caps where measured
    assert fwd(37, 1000, b, False, gpu) == C.RowsConfig(1024, 0, 2, 4, maxnreg=48, prefetch=False, persistent=True)
    assert fwd(16384, 5120, b, False, gpu) == C.RowsConfig(4096, 1024, 1, 8, maxnreg=64, prefetch=True)
    assert fwd(9, 1536, f32, False, gpu) == C.RowsConfig(1024, 512, 2, 4)
    assert fwd(9, 2560, f32, False, gpu) == C.RowsConfig(2048, 512, 1, 4, maxnreg=72)
    assert fwd(3000, 3584, b, False, gpu) == C.RowsConfig(4096, 0, 1, 4)
    assert fwd(1, 4099, b, False, gpu) == C.RowsConfig(4096, 4, 1, 8)  # rows not whole vectors: no prefetch
    # 4096 wide: 4 warps uncapped, one tile a program; with a residual 8 warps capped, one tile a program
    assert fwd(8192, 4096, b, False, gpu) == C.RowsConfig(4096, 0, 1, 4, persistent=False)
    assert fwd(8192, 4096, b, True, gpu) == C.RowsConfig(4096, 0, 1, 8, maxnreg=64, persistent=False)
    assert fwd(2048, 16384, b, False, gpu) == C.RowsConfig(16384, 0, 1, 32, prefetch=True)
    # wide rows, a row per SM at least: lines without a residual; packed with one in bf16, else split;
    # fewer rows than SMs: split
    assert fwd(1024, 65536, b, False, gpu) == K.LinesConfig(32768, 8, 32)
    assert fwd(1024, 65536, f32, False, gpu) == K.LinesConfig(16384, 4, 32)
    assert fwd(1024, 65536, b, True, gpu) == C.PackedConfig(65536, 32)
    assert fwd(1024, 65537, b, True, gpu) == C.SplitConfig(16384, 16)
    assert fwd(1024, 65536, torch.float16, True, gpu) == C.SplitConfig(16384, 16)
    assert fwd(131, 65536, b, False, gpu) == C.SplitConfig(16384, 16)
    assert fwd(1024, 65536, f32, True, gpu) == C.SplitConfig(8192, 16)
    # other GPUs: no register caps; the CPU: no PTX (no packed rows)
    assert fwd(37, 1000, b, False, "cpu").maxnreg is None
    assert fwd(1024, 65536, b, True, "cpu") == C.SplitConfig(16384, 16)
    opcheck.fake_gpu(monkeypatch, (8, 0))
    assert fwd(37, 1000, b, False, gpu).maxnreg is None


def test_backward_picks(monkeypatch):
    gpu, b, f32 = opcheck.fake_gpu(monkeypatch), torch.bfloat16, torch.float32
    bwd = C.pick_backward
    # 8 elements a thread, 16 with dh in 2-byte types; no prefetch at 16384; rstd ahead without dh
    assert bwd(8192, 4096, b, False, gpu) == C.BwdRowsConfig(4096, 1, 16, prefetch=True, rstd_ahead=True)
    assert bwd(8192, 4096, b, True, gpu) == C.BwdRowsConfig(4096, 1, 8, prefetch=True, rstd_ahead=False)
    assert bwd(8192, 4096, f32, True, gpu) == C.BwdRowsConfig(4096, 1, 16, prefetch=True, rstd_ahead=False)
    assert bwd(5, 7, b, False, gpu) == C.BwdRowsConfig(8, 256, 8, prefetch=True, rstd_ahead=True)
    assert bwd(2048, 16384, b, False, gpu) == C.BwdRowsConfig(16384, 1, 32, prefetch=False, rstd_ahead=False)
    # wide rows: coop, capped on sm_90, one row prefetched into L2 ahead only without dh
    assert bwd(1024, 65536, b, False, gpu) == C.CoopConfig(2048, 4, maxnreg=128, l2_ahead=1)
    assert bwd(1024, 65536, b, True, gpu) == C.CoopConfig(2048, 4, maxnreg=128, l2_ahead=0)
    assert bwd(1024, 65536, b, False, "cpu") == C.ColsConfig()
    opcheck.fake_gpu(monkeypatch, (8, 0))
    assert bwd(1024, 65536, b, False, gpu) == C.CoopConfig(2048, 4, maxnreg=None, l2_ahead=0)


class Launched(Exception):
    pass


def test_coop_launch_prefetches_only_rows_of_whole_vectors(monkeypatch):
    # the config's L2 prefetch distance reaches the kernel where the rows allow it (l2_prefetch_ok:
    # sm_90, rows of whole 16-byte vectors), else 0
    from kcollect.kernels._host import prefetch
    from kcollect.kernels.rms_norm import bwd

    asked = []

    def plan(*args, **kw):
        asked.append(kw["L2_AHEAD"])
        raise Launched

    monkeypatch.setattr(bwd, "coop_plan", plan)
    config = C.CoopConfig(l2_ahead=1)
    for ok in (True, False):
        monkeypatch.setattr(prefetch, "l2_prefetch_ok", lambda t, ok=ok: ok)
        x, w = torch.empty(4, 65536, dtype=torch.bfloat16), torch.empty(65536, dtype=torch.bfloat16)
        with pytest.raises(Launched):
            K.rms_norm_backward(x, x, w, torch.empty(4), config=config)
    assert asked == [1, 0]


def test_grid_shapes_and_cost_model():
    assert any(s.dims["N"] > C.MAX_REG_BLOCK for s in SPEC.grids["full"])  # the wide paths are timed
    dims, fwd = {"M": 4096, "N": 4096}, (2 * 4096 * 4096 + 4096) * 2
    opcheck.check_pass_bytes(SPEC, dims, fwd, bwd=(3 * 4096 * 4096 + 2 * 4096) * 2)
    assert SPEC.bytes_moved(dims, torch.float32, "fwd") == 2 * fwd
    assert set(SPEC.tolerance) == set(SPEC.dtypes)


def test_config_is_recorded():
    inputs_ = SPEC.make_inputs({"M": 3, "N": 100}, torch.float32, "cpu", 0)
    record = SPEC.provider("triton").config(inputs_)
    assert record["fwd"] == {"block_n": 128, "block_b": 0, "rows": 16, "warps": 4, "maxnreg": None,
                             "prefetch": False, "persistent": True, "path": "rows"}
    assert record["bwd"]["path"] == "rows"


ON_GPU = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                            reason="segments that wait for each other and PTX: a GPU only")


_SM90_COMPILE = """
from benchmarks.compile_report import report
from kcollect.kernels.rms_norm import bwd, config, fwd
b, C = "*bf16", "constexpr"
packed = {"x_ptr": b, "r_ptr": b, "h_ptr": b, "w_ptr": b, "y_ptr": b, "rstd_ptr": "*fp32", "N": "i32", "eps": "fp32",
          "BLOCK": C, "HAS_RES": C, "STORE_RSTD": C, "ASM": C}
r = report(fwd._fwd_packed, packed, {"BLOCK": 65536, "HAS_RES": True, "STORE_RSTD": True, "ASM": True}, 32,
           aligned=("x_ptr", "r_ptr", "h_ptr", "w_ptr", "y_ptr", "N"))
print("packed", 1, 0, r["registers"], r["stack"], 0)
coop = {"x_ptr": b, "w_ptr": b, "dy_ptr": b, "dh_ptr": b, "rstd_ptr": "*fp32", "dx_ptr": b, "dwp_ptr": "*fp32",
        "slot_ptr": "*i64", "M": "i32", "N": "i32", "S": "i32", "iters": "i32", "SEG": C, "S_BLOCK": C, "HAS_DH": C,
        "L2_AHEAD": C}
for dh, ahead in ((False, 0), (False, 1), (True, 0)):
    r = report(bwd._bwd_coop, coop, {"SEG": config.COOP_SEG, "S_BLOCK": 32, "HAS_DH": dh, "L2_AHEAD": ahead},
               config.COOP_WARPS, maxnreg=config.COOP_MAXNREG, sass=True,
               aligned=tuple(k for k, v in coop.items() if v.startswith("*")) + ("N",))
    print("coop", int(dh), ahead, r["registers"], r["stack"], r["sass"].count("UBLKPF"))
"""


@ON_GPU
def test_sm90_binaries_hold_their_register_budgets():
    # PTX and register budgets the interpreter cannot check, compiled offline for sm_90 (its own
    # process, without TRITON_INTERPRET; run with the GPU tests, ~10 s of CPU; the lab's fingerprint
    # of every default launch records the registers too): _fwd_packed's bf16 widening (PTX)
    # assembles and keeps the 65536-wide row and its residual in registers (a few words of spill at
    # most: widened to fp32 the row spills 23-70 registers a thread); the coop backward's default
    # launch fits 4 programs of 4 warps per SM under its cap with no spill, with or without dh, and
    # its L2 prefetch takes no register and is there (one bulk prefetch per tensor a step).
    got = {}
    for line in opcheck.run_offline_compile(_SM90_COMPILE).split("\n"):
        if line:
            kind, flag, ahead, regs, stack, n = line.split()
            got[kind, int(flag), int(ahead)] = (int(regs), int(stack), int(n))
    assert got["packed", 1, 0][1] <= 32, got
    for key in (("coop", 0, 0), ("coop", 0, 1), ("coop", 1, 0)):
        assert got[key][0] <= 128 and got[key][1] == 0, got
    assert got["coop", 0, 0][2] == 0 and got["coop", 0, 1][2] == 2, got
    assert got["coop", 0, 1][0] <= got["coop", 0, 0][0], got


def gpu_inputs(dims, dtype):
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    x = torch.randn(dims, generator=g, device="cuda") * torch.exp(torch.randn((dims[0], 1), generator=g, device="cuda"))
    w = 1 + 0.3 * torch.randn(dims[1], generator=g, device="cuda")
    dy = torch.randn(dims, generator=g, device="cuda")
    dh = torch.randn(dims, generator=g, device="cuda")
    return x.to(dtype), w.to(dtype), dy.to(dtype), dh.to(dtype)


@ON_GPU
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims,seg", [((37, 5003), 2048), ((300, 1000), 256), ((1024, 65536), None)],
                         ids=["37x5003-seg2048", "300x1000-seg256", "1024x65536-default"])
@pytest.mark.parametrize("with_dh", [False, True], ids=["", "dh"])
@pytest.mark.parametrize("ahead", [None, 2], ids=["", "l2-ahead-2"])
def test_coop_backward_on_the_gpu(dtype, dims, seg, with_dh, ahead):
    # S > 1 segments a row (3 with the last partial, 4, 32), row groups striding, dh (add_rms_norm),
    # the default launch (cap, L2 prefetch where it applies) and rows prefetched past the last
    x, w, dy, dh = gpu_inputs(dims, dtype)
    dh = dh if with_dh else None
    _, _, rstd = K.rms_norm_forward(x, w, 1e-6)
    config = C.pick_backward(dims[0], dims[1], dtype, with_dh, x.device) if seg is None else C.CoopConfig(seg=seg)
    config = config if ahead is None else C.CoopConfig(config.seg, config.warps, config.maxnreg, ahead)
    assert isinstance(config, C.CoopConfig)
    dx, dw = K.rms_norm_backward(dy, x, w, rstd, dh=dh, config=config)
    _, dx_ref, dw_ref = reference_grads(x, w, 1e-6, dy)
    if with_dh:
        dx_ref = dx_ref + dh.double()
    tol = SPEC.tolerance[dtype]
    assert rel(dx, dx_ref) <= tol and rel(dw, dw_ref) <= tol
    # deterministic: every program of a row sums the same partials in the same order
    assert torch.equal(dx, K.rms_norm_backward(dy, x, w, rstd, dh=dh, config=config)[0])


@ON_GPU
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", [(200, 20000), (1024, 65536), (7, 65536)], ids=["200x20000", "1024x65536", "7x65536"])
def test_wide_forward_defaults_on_the_gpu(dtype, dims):
    # the GPU's wide-row forwards as picked: lines, packed (bf16's PTX widening, with a residual),
    # split (fewer rows than SMs, or other dtypes with a residual)
    x, w, r, _ = gpu_inputs(dims, dtype)
    for residual in (None, r):
        y, h, rstd = K.rms_norm_forward(x, w, 1e-6, residual=residual)
        base = x if residual is None else x + residual
        assert rel(y, reference(base.double(), w.double(), 1e-6)) <= SPEC.tolerance[dtype]
        rstd_ref = 1.0 / torch.sqrt(base.double().pow(2).mean(-1) + 1e-6)
        torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-4, atol=0)


def test_quack_provider(monkeypatch):
    # QuACK's autograd rmsnorm (its backward: rmsnorm_bwd), no residual
    opcheck.check_quack_provider(SPEC, monkeypatch, ["rmsnorm"])
