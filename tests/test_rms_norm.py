"""rms_norm against its float64 reference: every provider, mode and dtype, on awkward shapes; the
wide-row paths (split, chunked) forced onto small shapes; the persistent grid's arithmetic."""
import os
import random

import pytest
import torch

import opcheck as gate
from kcollect import verify
from kcollect.kernels import rms_norm as K

SPEC = K.SPEC
# 37 x 1000: two rows per program, tail masked, several sweeps of the persistent grid;
# 9 x 1536: forward in two column blocks (1024 + 512), two rows per program; 1 x 4099: one row,
# odd width, forward blocks 4096 + 4; 5 x 7: rows narrower than a vector; 3 x 20000: wide-row path
SHAPES = [{"M": 37, "N": 1000}, {"M": 9, "N": 1536}, {"M": 1, "N": 4099}, {"M": 5, "N": 7},
          {"M": 3, "N": 20000}]
RUNNABLE = [p.name for p in SPEC.providers if p.available("cpu") is None]


def _id(d):
    return "x".join(map(str, d.values()))


@pytest.mark.parametrize("provider", RUNNABLE)
@pytest.mark.parametrize("mode", SPEC.modes)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", SHAPES, ids=_id)
def test_matches_reference(provider, mode, dtype, dims):
    if gate.too_few_for_bf16(dims, dtype):
        pytest.skip("bf16 over a few dozen elements is too noisy to gate on (tests/gate.py)")
    if provider == "compile" and dims["M"] != 37:
        pytest.skip("compile is checked once per mode and dtype: each shape costs a CPU compile")
    result = verify.check(SPEC, provider, dims, dtype, mode, seed=random.randrange(2**31))
    assert result.ok, f"{provider} {mode} {dtype} {dims}: error {result.error:.3g} > {result.tolerance:.3g}"


def _inputs(m, n, dtype, seed=None):
    inp = SPEC.make_inputs({"M": m, "N": n}, dtype, "cpu", random.randrange(2**31) if seed is None else seed)
    return inp["x"], inp["w"], inp["eps"]


def _reference_grads(x, w, eps, dy):
    xd = x.double().requires_grad_(True)
    wd = w.double().requires_grad_(True)
    y = K.reference(xd, wd, eps)
    dx, dw = torch.autograd.grad(y, (xd, wd), dy.double())
    return y.detach(), dx, dw


def _rel(got, want):
    return (torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want)).item()


@pytest.mark.parametrize("wide", ["split", "chunked", "packed", "lines"])
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", [(37, 1000), (6, 4099)], ids=["37x1000", "6x4099"])
def test_chunked_paths(wide, dtype, dims):
    # max_block=256 sends these shapes through the wide-row kernels, which the grid only reaches
    # at 65536 wide: the forward's _fwd_split (256-element segments, 4 or 17 a row, the last one
    # partial; the last program of each row writes it), _fwd_chunked (128-element chunks) or
    # _fwd_packed (the whole row in one program; its bf16 widening on the GPU is PTX, compiled by
    # test_packed_forward_assembles_for_sm90), _fwd_lines (one 16 KB chunk or less a row: no full
    # chunk at 1000 fp32, a masked tail at 4099);
    # _bwd_row_dot + _bwd_cols (64-column blocks).
    x, w, eps = _inputs(*dims, dtype)
    dy = torch.randn(dims).to(dtype)
    y, h, rstd = K.rms_norm_forward(x, w, eps, max_block=256, wide=wide)
    dx, dw = K.rms_norm_backward(dy, x, w, rstd, max_block=256)
    y_ref, dx_ref, dw_ref = _reference_grads(x, w, eps, dy)
    tol = SPEC.tolerance[dtype]
    assert h is None
    assert _rel(y, y_ref) <= tol and _rel(dx, dx_ref) <= tol and _rel(dw, dw_ref) <= tol
    # the register path on the same inputs: both round once per output from fp32 maths
    y2, _, rstd2 = K.rms_norm_forward(x, w, eps)
    torch.testing.assert_close(rstd, rstd2, rtol=1e-5, atol=0)
    torch.testing.assert_close(y, y2, rtol=tol, atol=tol)


# The A/B variants of the register path (benchmarks/rms_norm_ab.py), each through the same checks.
# Shapes: 37 x 1000 (two rows per program by default, 19 tiles striding over the CPU's 4-program
# persistent grid, tail masked), 7 x 1536 (two column blocks 1024 + 512; one block of 2048 unsplit),
# 5 x 4099 (4096 + 4, odd width).
FWD_VARIANTS = {
    "liger_like": dict(liger_like=True),
    "liger_like_prefetch": dict(liger_like=True, prefetch=True),
    "no_cap": dict(maxnreg=False),
    "no_prefetch": dict(prefetch=False),
    "prefetch": dict(prefetch=True),
    "no_hint": dict(x_policy=""),
    "no_prefetch_persistent": dict(prefetch=False, persistent=True),
    "no_prefetch_one_tile": dict(prefetch=False, persistent=False),
    "rows2_16w": dict(rows=2, num_warps=16),
    "rows2_4w": dict(rows=2, num_warps=4),
    "unsplit": dict(split=False),
}


@pytest.mark.parametrize("variant", FWD_VARIANTS)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", [(37, 1000), (7, 1536), (5, 4099)], ids=["37x1000", "7x1536", "5x4099"])
def test_forward_variants(variant, dtype, dims):
    x, w, eps = _inputs(*dims, dtype)
    y, h, rstd = K.rms_norm_forward(x, w, eps, **FWD_VARIANTS[variant])
    assert h is None
    assert _rel(y, K.reference(x.double(), w.double(), eps)) <= SPEC.tolerance[dtype]
    rstd_ref = 1.0 / torch.sqrt(x.double().pow(2).mean(-1) + eps)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-5, atol=0)
    y2, _, none = K.rms_norm_forward(x, w, eps, need_rstd=False, **FWD_VARIANTS[variant])
    assert none is None and torch.equal(y, y2)


@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("w_ahead", [True, False], ids=["w-ahead", "w-at-use"])
@pytest.mark.parametrize("dims,chunk,programs", [((9, 5003), 1024, 1), ((3, 4096), 512, "rows"), ((5, 100), 64, 2)],
                         ids=["tail-strided", "no-tail", "narrow"])
def test_lines_forward_chunks(dims, chunk, programs, w_ahead, dtype):
    # _fwd_lines with several chunks a row: full chunks and a masked tail, full chunks only, a
    # row of one partial chunk and one full one; programs striding over the rows (CPU: 4 "SMs");
    # w's chunks prefetched or loaded at their use
    x, w, eps = _inputs(*dims, dtype)
    y, _, rstd = K.rms_norm_forward(x, w, eps, max_block=16, wide="lines", lines_chunk=chunk, lines_programs=programs,
                                    lines_w_ahead=w_ahead)
    y_ref = _reference_grads(x, w, eps, torch.randn(dims).to(dtype))[0]
    assert _rel(y, y_ref) <= SPEC.tolerance[dtype]
    torch.testing.assert_close(rstd, K.rms_norm_forward(x, w, eps)[2], rtol=1e-5, atol=0)


def test_forward_wide_path_must_be_known():
    x, w, eps = _inputs(3, 1000, torch.float32)
    with pytest.raises(ValueError, match="'split', 'chunked', 'packed' or 'lines'"):
        K.rms_norm_forward(x, w, eps, max_block=256, wide="streamed")


def test_forward_rows_must_be_a_power_of_two_within_the_register_block():
    x, w, eps = _inputs(4, 4099, torch.float32)
    for rows in (3, 4):  # 4 x (4096 + 4) > MAX_REG_BLOCK
        with pytest.raises(ValueError, match="power of two"):
            K.rms_norm_forward(x, w, eps, rows=rows)


BWD_VARIANTS = {
    "no_prefetch": dict(prefetch=False),
    "prefetch": dict(prefetch=True),
    "sum_rows_2": dict(sum_rows=2),
    "rstd_at_use": dict(prefetch=True, rstd_ahead=False),
    "evict_last": dict(policy="evict_last"),
    "4w": dict(num_warps=4),  # default 8 warps at 1000 wide, 32 at 4099 (one 8192 block)
    "16w": dict(num_warps=16),
    "no_prefetch_8w": dict(prefetch=False, num_warps=8),
    "cols_8x64": dict(max_block=256, cols_tile=(8, 64)),
    "cols_2x32": dict(max_block=256, cols_tile=(2, 32)),
    # _bwd_coop, the GPU's wide-row backward; on the CPU one segment a row (its programs would wait
    # for each other: test_coop_backward_on_the_gpu runs it in segments), 4 programs striding
    "coop": dict(max_block=256, wide="coop"),
    "coop_8w": dict(max_block=256, wide="coop", coop_warps=8),
    "coop_w_at_use": dict(max_block=256, wide="coop", coop_w_at_use=True),
    "coop_reload": dict(max_block=256, wide="coop", coop_reload=True),
}


@pytest.mark.parametrize("variant", BWD_VARIANTS)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", [(37, 1000), (6, 4099)], ids=["37x1000", "6x4099"])
def test_backward_variants(variant, dtype, dims):
    x, w, eps = _inputs(*dims, dtype)
    dy = torch.randn(dims).to(dtype)
    _, _, rstd = K.rms_norm_forward(x, w, eps)
    dx, dw = K.rms_norm_backward(dy, x, w, rstd, **BWD_VARIANTS[variant])
    _, dx_ref, dw_ref = _reference_grads(x, w, eps, dy)
    tol = SPEC.tolerance[dtype]
    assert _rel(dx, dx_ref) <= tol and _rel(dw, dw_ref) <= tol


def test_backward_wide_path_must_be_known_and_coop_segments_need_a_gpu():
    x, w, eps = _inputs(3, 1000, torch.float32)
    dy = torch.randn(3, 1000)
    _, _, rstd = K.rms_norm_forward(x, w, eps)
    with pytest.raises(ValueError, match="'cols' or 'coop'"):
        K.rms_norm_backward(dy, x, w, rstd, max_block=256, wide="rows")
    with pytest.raises(ValueError, match="need a GPU"):
        K.rms_norm_backward(dy, x, w, rstd, max_block=256, wide="coop", coop_seg=256)


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the coop kernel's segments wait for each other: a GPU only")
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims,seg", [((37, 5003), 2048), ((300, 1000), 256), ((1024, 65536), None)],
                         ids=["37x5003-seg2048", "300x1000-seg256", "1024x65536-default"])
@pytest.mark.parametrize("with_dh", [False, True], ids=["", "dh"])
@pytest.mark.parametrize("w_at_use", [False, True], ids=["", "w@use"])
@pytest.mark.parametrize("reload", [False, True], ids=["held", "reload"])
def test_coop_backward_on_the_gpu(dtype, dims, seg, with_dh, w_at_use, reload):
    # S > 1 segments a row (3 with the last partial, 4, 32), row groups striding, dh (add_rms_norm),
    # w held or loaded at its uses, the row finished late held or re-read; the sm_90 register cap
    # where it applies (the default segment)
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    x = (torch.randn(dims, generator=g, device="cuda") * torch.exp(torch.randn((dims[0], 1), generator=g,
                                                                                 device="cuda"))).to(dtype)
    w = (1 + 0.3 * torch.randn(dims[1], generator=g, device="cuda")).to(dtype)
    dy = torch.randn(dims, generator=g, device="cuda").to(dtype)
    dh = torch.randn(dims, generator=g, device="cuda").to(dtype) if with_dh else None
    _, _, rstd = K.rms_norm_forward(x, w, 1e-6)
    kw = dict(dh=dh, max_block=256 if seg else K.MAX_REG_BLOCK, wide="coop", coop_seg=seg, coop_w_at_use=w_at_use,
              coop_reload=reload)
    dx, dw = K.rms_norm_backward(dy, x, w, rstd, **kw)
    _, dx_ref, dw_ref = _reference_grads(x, w, 1e-6, dy)
    if with_dh:
        dx_ref = dx_ref + dh.double()
    tol = SPEC.tolerance[dtype]
    assert _rel(dx, dx_ref) <= tol and _rel(dw, dw_ref) <= tol
    # deterministic: every program of a row sums the same partials in the same order
    assert torch.equal(dx, K.rms_norm_backward(dy, x, w, rstd, **kw)[0])


def test_every_element_is_written_and_rstd_saved():
    # fp32, elementwise: a skipped tile, row or column block would show wherever empty() left
    # garbage; rstd is what the backward relies on.
    x, w, eps = _inputs(23, 1500, torch.float32)
    dy = torch.randn(23, 1500)
    y, _, rstd = K.rms_norm_forward(x, w, eps)
    dx, dw = K.rms_norm_backward(dy, x, w, rstd)
    y_ref, dx_ref, dw_ref = _reference_grads(x, w, eps, dy)
    rstd_ref = 1.0 / torch.sqrt(x.double().pow(2).mean(-1) + eps)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx.double(), dx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw.double(), dw_ref, rtol=1e-5, atol=1e-5)


def test_inference_keeps_no_rstd():
    x, w, eps = _inputs(9, 300, torch.float32)
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
    y_ref, dx_ref, dw_ref = _reference_grads(x.detach(), w.detach(), 1e-6, dy)
    tol = SPEC.tolerance[torch.bfloat16]
    assert _rel(y, y_ref) <= tol and _rel(dx, dx_ref) <= tol and _rel(dw, dw_ref) <= tol


@pytest.mark.parametrize("tiles,resident", [(8192, 528), (19, 4), (1, 132), (1000, 1000), (32768, 264), (7, 3)])
def test_persistent_grid(tiles, resident):
    programs, per = K._persistent_grid(tiles, resident)
    assert programs <= resident and programs * per >= tiles  # fits one wave, covers every tile
    assert (programs - 1) * per < tiles  # no program is left without a tile
    assert per == -(-tiles // resident)  # as few sweeps as the resident slots allow
    if (tiles, resident) == (8192, 528):
        assert (programs, per) == (512, 16)


def test_tile_settings():
    # (BLOCK_N, BLOCK_B, ROWS, warps): several rows per program below MIN_TILE, one row up to
    # MAX_REG_BLOCK, 4-32 warps; a second block where it saves lanes (5120 = 4096 + 1024, and
    # 4099 = 4096 + 4 rather than 8192), not where it would not (3584 -> 4096, 1000 -> 1024)
    assert K._tile(1000, K.FWD_PER_THREAD) == (1024, 0, 2, 4)
    assert K._tile(4096, K.FWD_PER_THREAD) == (4096, 0, 1, 8)
    assert K._tile(16384, K.FWD_PER_THREAD) == (16384, 0, 1, 32)
    assert K._tile(4096, K.BWD_PER_THREAD) == (4096, 0, 1, 16)
    assert K._tile(7, K.BWD_PER_THREAD) == (8, 0, 256, 8)
    assert K._tile(5120, K.FWD_PER_THREAD) == (4096, 1024, 1, 8)
    assert K._tile(4099, K.FWD_PER_THREAD) == (4096, 4, 1, 8)
    assert K._tile(3584, K.FWD_PER_THREAD) == (4096, 0, 1, 8)
    assert K._tile(1536, K.FWD_PER_THREAD) == (1024, 512, 2, 4)
    assert K._tile(5120, K.BWD_PER_THREAD, split=False) == (8192, 0, 1, 32)  # the backward: one block
    assert K._in_registers(16384, K.MAX_REG_BLOCK) and not K._in_registers(16385, K.MAX_REG_BLOCK)


def test_bad_weight_is_refused():
    with pytest.raises(ValueError, match="weight must be"):
        K.rms_norm(torch.randn(4, 8), torch.randn(7))
    with pytest.raises(ValueError, match="weight must be"):
        K.rms_norm(torch.randn(4, 8), torch.randn(1, 8))


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape
    assert {"quick", "full"} <= set(SPEC.grids)
    assert any(s.dims["N"] > K.MAX_REG_BLOCK for s in SPEC.grids["full"])  # the chunked path is timed


def test_cost_model():
    dims = {"M": 4096, "N": 4096}
    fwd = SPEC.bytes_moved(dims, torch.bfloat16, "fwd")
    bwd = SPEC.bytes_moved(dims, torch.bfloat16, "bwd")
    assert fwd == (2 * 4096 * 4096 + 4096) * 2
    assert bwd == (3 * 4096 * 4096 + 2 * 4096) * 2
    assert SPEC.bytes_moved(dims, torch.bfloat16, "fwd+bwd") == fwd + bwd
    assert SPEC.bytes_moved(dims, torch.float32, "fwd") == 2 * fwd
    assert set(SPEC.tolerance) == set(SPEC.dtypes)


_PACKED_COMPILE = """
from benchmarks.compile_report import report
from kcollect.kernels import rms_norm
sig = {"x_ptr": "*bf16", "r_ptr": "*bf16", "h_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "rstd_ptr": "*fp32",
       "N": "i32", "eps": "fp32", "BLOCK": "constexpr", "HAS_RES": "constexpr", "STORE_RSTD": "constexpr",
       "ASM": "constexpr"}
for res in (False, True):
    r = report(rms_norm._fwd_packed, sig, {"BLOCK": 65536, "HAS_RES": res, "STORE_RSTD": True, "ASM": True}, 32,
               aligned=("x_ptr", "r_ptr", "h_ptr", "w_ptr", "y_ptr", "N"))
    print(res, r["stack"])
"""


def test_packed_forward_assembles_for_sm90():
    # _fwd_packed's bf16 widening on the GPU is PTX (_utils.widen), which the interpreter cannot
    # run: compile it offline for sm_90 (its own process, without TRITON_INTERPRET) at the 65536
    # block it is the default for. It must assemble, and keep the row in registers: a few words of
    # spill at most (Triton 3.6: 32 bytes without a residual, none with one; widened to fp32 the
    # row spills 23-70 registers a thread).
    stdout = gate.run_offline_compile(_PACKED_COMPILE)
    stack = {line.split()[0]: int(line.split()[1]) for line in stdout.strip().splitlines()}
    assert stack["False"] <= 32 and stack["True"] <= 32, stack


_COOP_COMPILE = """
from benchmarks.compile_report import report
from kcollect.kernels import rms_norm as K
sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "dy_ptr": "*bf16", "dh_ptr": "*bf16", "rstd_ptr": "*fp32", "dx_ptr": "*bf16",
       "dwp_ptr": "*fp32", "slot_ptr": "*i64", "M": "i32", "N": "i32", "S": "i32", "iters": "i32", "SEG": "constexpr",
       "S_BLOCK": "constexpr", "HAS_DH": "constexpr", "W_AT_USE": "constexpr", "RELOAD": "constexpr"}
for dh in (False, True):
    key = (dh, False, K.COOP_RELOAD, K.COOP_SEG, K.COOP_WARPS)
    r = report(K._bwd_coop, sig, {"SEG": K.COOP_SEG, "S_BLOCK": 32, "HAS_DH": dh, "W_AT_USE": False,
               "RELOAD": K.COOP_RELOAD}, K.COOP_WARPS, maxnreg=K.COOP_MAXNREG.get(key),
               aligned=("x_ptr", "w_ptr", "dy_ptr", "dh_ptr", "dx_ptr", "dwp_ptr", "N"))
    print(dh, r["registers"], r["stack"])
"""


def test_coop_backward_fits_four_programs_per_sm():
    # The coop backward's default launch (bf16, w held, the row re-read) compiled offline for sm_90
    # with its register cap: 128 registers a thread at most, i.e. 4 programs of 4 warps per SM, and
    # no spill (held in registers instead, the row needs 168 uncapped; capped, it spills).
    stdout = gate.run_offline_compile(_COOP_COMPILE)
    got = {line.split()[0]: (int(line.split()[1]), int(line.split()[2])) for line in stdout.strip().splitlines()}
    assert got["False"][0] <= 128 and got["True"][0] <= 128 and got["False"][1] == got["True"][1] == 0, got


def test_wide_forward_rule(monkeypatch):
    # the default wide path, with a row for every SM at least (the CPU counts 4; fewer: the split):
    # without a residual the lines path; with one, packed only where its PTX runs (bf16 on a GPU,
    # faked here) and for rows up to PACKED_MAX_BLOCK, else the split
    x = torch.empty(4, 65536, dtype=torch.bfloat16)
    assert K._wide_default(x, 65536, False) == "lines"
    assert K._wide_default(torch.empty(4, 65536, dtype=torch.float32), 65536, False) == "lines"
    assert K._wide_default(torch.empty(3, 65536, dtype=torch.bfloat16), 65536, False) == "split"  # fewer rows than SMs
    assert K._wide_default(x, 65536, True) == "split"  # CPU: no PTX
    monkeypatch.setattr(K, "widen_asm", lambda t: t.dtype == torch.bfloat16)
    assert K._wide_default(x, 65536, True) == "packed"
    assert K._wide_default(x, 40000, True) == "packed"
    assert K._wide_default(torch.empty(4, 65537, dtype=torch.bfloat16), 65537, True) == "split"  # over the block
    assert K._wide_default(torch.empty(3, 65536, dtype=torch.bfloat16), 65536, True) == "split"  # fewer rows than SMs
    assert K._wide_default(torch.empty(4, 65536, dtype=torch.float16), 65536, True) == "split"
    assert K._wide_default(x, 65536, False) == "lines"

def test_coop_register_cap(monkeypatch):
    # sm_90, the default segment and warps: COOP_MAXNREG's cap for the row re-read (w held, with or
    # without dh) and for the row held (w held without dh, at its uses with dh); otherwise none,
    # unless given
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert K._coop_cap(cuda, False, False, True, None, None, None) == {"maxnreg": 128}
    assert K._coop_cap(cuda, True, False, True, None, None, None) == {"maxnreg": 128}
    assert K._coop_cap(cuda, False, False, False, None, None, None) == {"maxnreg": 128}
    assert K._coop_cap(cuda, True, True, False, None, None, None) == {"maxnreg": 128}
    assert K._coop_cap(cuda, True, False, False, None, None, None) == {}
    assert K._coop_cap(cuda, True, True, True, None, None, None) == {}
    assert K._coop_cap(cuda, False, False, True, 4096, None, None) == {}
    assert K._coop_cap(cuda, False, False, True, None, 8, None) == {}
    assert K._coop_cap(cuda, False, False, True, None, None, 0) == {}
    assert K._coop_cap(cuda, True, False, False, None, None, 96) == {"maxnreg": 96}
    assert K._coop_cap(cpu, False, False, True, None, None, None) == {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert K._coop_cap(cuda, False, False, True, None, None, None) == {}
