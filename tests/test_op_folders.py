"""Every op folder is built one way (docs/add-a-kernel.md): spec.py declares SPEC = KernelSpec(...) with
named arguments, its grids come from grids.toml, naive.py holds the float64 reference, kernel files
are named by what they do; and KernelSpec refuses a declaration that cannot be measured."""
import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch

from kcollect.kernels._spec.kit import grids_of
from kcollect.registry import BUILTIN
from kcollect.spec import DTYPE_NAMES, KernelSpec, Provider, Shape

KERNELS = Path(importlib.import_module("kcollect.kernels").__file__).parent
REQUIRED = ("__init__.py", "spec.py", "config.py", "grids.toml", "naive.py")
# Names that say nothing of what a file does (what the folders used to hold: kernels.py, launch.py,
# maths.py, chunks.py ...): a kernel file is named by its pass (fwd, bwd, step) or its path (rows,
# split, scan, lanes ...).
VAGUE = {"kernels.py", "launch.py", "maths.py", "chunks.py", "decode.py", "ours.py", "eager.py", "utils.py",
         "helpers.py", "arch.py", "blocks.py", "misc.py", "common_utils.py"}
SPEC_SIDE = {"spec.py", "naive.py", "providers.py"}  # the collector's side of a folder: may use the spec kits


def _spec_call(op: str) -> ast.Call:
    tree = ast.parse((KERNELS / op / "spec.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SPEC"]:
            return node.value
    raise AssertionError(f"{op}/spec.py assigns no SPEC")


@pytest.mark.parametrize("op", BUILTIN)
def test_the_op_folder_has_its_files(op):
    files = {p.name for p in (KERNELS / op).iterdir() if p.suffix in (".py", ".toml")}
    assert not set(REQUIRED) - files, f"{op}/ lacks {sorted(set(REQUIRED) - files)}"
    assert not files & VAGUE, f"{op}/ has files named for nothing they do: {sorted(files & VAGUE)}"


@pytest.mark.parametrize("op", BUILTIN)
def test_spec_py_builds_its_kernelspec_explicitly(op):
    call = _spec_call(op)
    assert isinstance(call.func, ast.Name) and call.func.id == "KernelSpec", f"{op}: SPEC is not KernelSpec(...)"
    assert not call.args, f"{op}: KernelSpec takes named arguments only"
    assert "globals()" not in (KERNELS / op / "spec.py").read_text(), f"{op}/spec.py looks its fields up in globals()"
    required = {f.name for f in dataclasses.fields(KernelSpec) if f.default is dataclasses.MISSING}
    named = {k.arg for k in call.keywords}
    assert required <= named, f"{op}: KernelSpec(...) leaves {sorted(required - named)} to a helper"


@pytest.mark.parametrize("op", BUILTIN)
def test_grids_come_from_grids_toml_and_the_reference_from_naive_py(op):
    module = importlib.import_module(f"kcollect.kernels.{op}.spec")
    spec = module.SPEC
    assert spec.name == op
    assert dict(spec.grids) == grids_of(module.__file__), f"{op}: grids not those of its grids.toml"
    assert set(spec.grids) == {"quick", "full"}, f"{op}: grids {sorted(spec.grids)}"
    bench = {DTYPE_NAMES[d] for d in spec.bench_dtypes}
    for shape in spec.grids["quick"] + spec.grids["full"]:
        assert shape.dtypes is None or set(shape.dtypes) <= bench, f"{op} {shape.label}: {shape.dtypes} not benched"
    assert inspect.getmodule(spec.reference).__name__ == f"kcollect.kernels.{op}.naive", \
        f"{op}: the reference is not naive.py's"


def test_a_grid_point_names_only_dtypes_that_exist(tmp_path):
    (tmp_path / "grids.toml").write_text('quick = [{N = 4, dtypes = ["bfloat16"], why = "one"}]\n')
    assert grids_of(str(tmp_path / "spec.py"))["quick"][0] == Shape({"N": 4}, "one", ("bfloat16",))
    for bad in ('["bf16"]', "[]"):
        (tmp_path / "grids.toml").write_text(f'quick = [{{N = 4, dtypes = {bad}, why = "one"}}]\n')
        with pytest.raises(ValueError, match="valid: a list of bfloat16, float16, float32"):
            grids_of(str(tmp_path / "spec.py"))


@pytest.mark.parametrize("op", BUILTIN)
def test_kernel_files_do_not_import_the_spec_kits(op):
    # the spec kits (kernels/_spec) are the collector's side: an op's kernels run without them
    for path in (KERNELS / op).glob("*.py"):
        if path.name in SPEC_SIDE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert "_spec" not in (node.module or "").split("."), f"{op}/{path.name} imports {node.module}"


def test_the_shared_layers_import_downwards_only():
    # _jit: device code only; _host: no spec kit, no collector; _spec may use both
    for layer, banned in (("_jit", ("_host", "_spec", "kcollect")), ("_host", ("_spec", "kcollect"))):
        for path in (KERNELS / layer).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    parts = (node.module or "").split(".")
                    assert not set(parts) & set(banned), f"{layer}/{path.name} imports {node.module}"


def _planted(**change):
    fields = dict(name="planted", description="x", modes=("fwd",), baseline="ours",
                  providers=(Provider("ours", lambda x: x, ours=True), Provider("torch", lambda x: x)),
                  reference=lambda x: x, make_inputs=lambda dims, dtype, device, seed: {}, grad_inputs=("x",),
                  grids={"quick": (Shape({"N": 4}, "tiny"),)}, bytes_moved=lambda dims, dtype, mode: 8,
                  flops=lambda dims, mode: 1.0, bound="memory", tolerance={torch.float32: 1e-6},
                  dtypes=(torch.float32,))
    return KernelSpec(**{**fields, **change})


def test_a_sound_declaration_passes():
    assert _planted().name == "planted"


@pytest.mark.parametrize("change, says", [
    ({"baseline": "liger"}, "baseline 'liger' is not one of its providers"),
    ({"modes": ("forward",)}, "modes must be some of fwd, bwd, fwd+bwd"),
    ({"modes": ()}, "modes must be some of"),
    ({"providers": ()}, "no provider"),
    ({"providers": (Provider("ours", abs), Provider("ours", abs))}, "provider names repeat"),
    ({"bound": "latency"}, "bound must be one of memory, compute"),
    ({"dtypes": (torch.float32, torch.bfloat16)}, "no tolerance for bfloat16"),
    ({"tolerance": {torch.float32: 0.0}}, "positive"),
    ({"grad_inputs": "x"}, "grad_inputs must be a tuple"),
    ({"grids": {"quick": ({"N": 4},)}}, "grids must map"),
    ({"dtypes": ()}, "no dtype"),
])
def test_a_declaration_that_cannot_be_measured_is_refused_with_its_reason(change, says):
    with pytest.raises(ValueError, match="KernelSpec 'planted': ") as e:
        _planted(**change)
    assert says in str(e.value), str(e.value)


def test_the_documented_template_is_the_smallest_op_with_kernels_of_its_own():
    docs = KERNELS.parent / "docs"
    named = {doc.name: set(re.findall(r"`kernels/(\w+)/` is the template", doc.read_text()))
             for doc in (docs / "add-a-kernel.md", docs / "architecture.md")}
    assert all(len(ops) == 1 for ops in named.values()), named
    (template,) = set.union(*named.values())
    size = {op: sum(len(p.read_text().splitlines()) for p in (KERNELS / op).iterdir() if p.is_file())
            for op in BUILTIN if (KERNELS / op / "fwd.py").exists()}
    assert template == min(size, key=size.get), f"the docs' template {template}; sizes {sorted(size.items())}"
