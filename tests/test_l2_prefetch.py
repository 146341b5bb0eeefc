"""The L2 prefetch of the wide-row kernels (kernels/_jit/prefetch.py: prefetch_l2): where it may run at all. Where each
op's launches turn it on, that its kernels compile for sm_90 with it and that the results are right
with it on a GPU: each op's tests (test_rms_norm.py, test_layer_norm.py, test_softmax.py, ...)."""
import types

import torch

from kcollect.kernels._host.prefetch import l2_prefetch_ok


def fake(shape, dtype, device="cuda"):
    """What l2_prefetch_ok reads of a tensor, for a CUDA one on a CPU machine."""
    t = torch.empty(shape, dtype=dtype)
    return types.SimpleNamespace(device=torch.device(device), shape=t.shape, element_size=t.element_size,
                                 stride=t.stride, data_ptr=t.data_ptr)


def test_prefetch_needs_hopper_and_rows_of_whole_vectors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert l2_prefetch_ok(fake((4, 65536), torch.bfloat16))
    assert l2_prefetch_ok(fake((4, 1000), torch.float32))
    assert not l2_prefetch_ok(fake((4, 5003), torch.bfloat16))  # rows not whole 16-byte vectors
    assert not l2_prefetch_ok(fake((4, 65536), torch.bfloat16, "cpu"))  # the interpreter runs no PTX
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not l2_prefetch_ok(fake((4, 65536), torch.bfloat16))
