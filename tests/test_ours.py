"""Whose code a row timed: declared on the provider (spec.Provider.ours), stored on every row."""
import torch

from kcollect import registry
from kcollect.plan import Case
from kcollect.runner import make_row
from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers


def test_every_builtin_kernel_declares_its_own_provider():
    for spec in registry.load(plugins=False).specs:
        ours = [p.name for p in spec.providers if p.ours]
        assert len(ours) == 1, (spec.name, ours)
        assert all(p.package == "" for p in spec.providers if p.ours)


def test_standard_providers_and_peers():
    mine, eager, compiled = standard_providers(lambda x: x, lambda x: x)
    assert (mine.ours, eager.ours, compiled.ours) == (True, False, False)
    assert eager.package == "" and compiled.package == ""
    # a peer names the distribution of the module it imports (Jinja2 installs the module jinja2)
    assert Provider("peer", lambda x: x, peer_available("jinja2")).package == "jinja2"


def test_rows_carry_ours_and_the_peer_package():
    spec = KernelSpec(
        name="k", description="", modes=("fwd",), baseline="torch",
        providers=(Provider("mine", lambda x: x, ours=True), Provider("torch", lambda x: x),
                   Provider("peer", lambda x: x, peer_available("jinja2"))),
        reference=lambda x: x, make_inputs=lambda dims, dtype, device, seed: {"x": torch.ones(dims["N"])},
        grad_inputs=("x",), grids={"quick": (Shape({"N": 4}, "tiny"),)}, bytes_moved=lambda dims, dtype, mode: 8,
        flops=lambda dims, mode: 1.0, bound="memory", tolerance={torch.float32: 1e-6}, dtypes=(torch.float32,))
    case = Case(spec, Shape({"N": 4}, "tiny"), torch.float32, ("fwd",), ("mine", "torch", "peer"))
    rows = {p: make_row("r", 1, case, "fwd", p, status="ok") for p in ("mine", "torch", "peer")}
    assert {p: (r["ours"], r["package"]) for p, r in rows.items()} == {
        "mine": (True, ""), "torch": (False, ""), "peer": (False, "jinja2")}
