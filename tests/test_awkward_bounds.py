"""lab/awkward/bounds.py: the interpreter's loads and stores checked against their launch's tensors.
Run in a child process, so that the patched interpreter stays out of the other tests."""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lab.awkward import bounds

SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, triton, triton.language as tl
    from lab.awkward import bounds
    bounds.install()

    @triton.jit
    def copy(X, Y, n, N: tl.constexpr, MASKED: tl.constexpr):
        i = tl.arange(0, N)
        m = i < n if MASKED else i >= 0
        tl.store(Y + i, tl.load(X + i, mask=m, other=0.0), mask=m)

    x, y = torch.randn(8), torch.empty(16)
    copy[(1,)](x, y, 8, 16, True)  # lanes 8-15 address past x, but are masked off
    assert torch.equal(y[:8], x)
    try:
        copy[(1,)](x, y, 8, 16, False)
    except Exception as e:
        print("raised:", e)
    else:
        print("not raised")
""")


def test_a_masked_off_lane_passes_and_an_active_one_past_the_tensor_raises():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "raised:" in out.stdout and "out-of-bounds load: 8 of 16 active lanes" in out.stdout, out.stdout


@pytest.mark.parametrize("mask_dtype", [bool, np.int8, np.uint8])
def test_the_mask_selects_lanes_whatever_its_dtype(mask_dtype):
    """A mask held as integers must select lanes, not index them (an int8 mask of zeros once made
    its lanes 0 and 1 'active')."""
    base = np.arange(1000, 1064, 4, dtype=np.uint64)  # 16 lanes of 4 bytes
    bounds._RANGES[:] = [(1000, 1032)]  # the first 8 lanes
    inside = np.arange(16) < 8
    bounds.check(base, inside.astype(mask_dtype), 4, "load")
    bounds.check(base, np.zeros(16, dtype=mask_dtype), 4, "load")
    with pytest.raises(bounds.OutOfBounds, match="8 of 16"):
        bounds.check(base, np.ones(16, dtype=mask_dtype), 4, "load")
    bounds._RANGES.clear()
