"""The plugin path of docs/add-a-kernel.md, as a user walks it: the guide's code, written out as a
package of its own, installed beside kcollect, registered by its entry point; it must be listed,
run on the CPU, pass its own tests and get its page. Also the registry's rules for plugins, and the
builtin specs' grids against their own shape checks."""
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import opcheck
from kcollect import registry
from kcollect.cli import main
from kcollect.registry import RegistryError
from kcollect.store import Store

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "add-a-kernel.md"
KCOLLECT = [sys.executable, "-m", "kcollect.cli"]
BLOCK = re.compile(r"```\w+\n# file: (\S+)\n(.*?)```", re.S)


def guide_files() -> dict[str, str]:
    files = {path: body for path, body in BLOCK.findall(GUIDE.read_text())}
    assert {"pyproject.toml", "my_kernels/squared_relu.py", "my_kernels/kcollect_spec.py"} <= set(files)
    return files


def kc(*args, env, timeout=600):
    return subprocess.run(KCOLLECT + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def install(src: Path, site: Path) -> None:
    """What `pip install` of the guide's pyproject.toml leaves in site-packages, made by hand so
    that no build backend or index is needed: the packages it names, and a dist-info with its
    metadata and its entry points, which is all importlib.metadata (and so kcollect) reads."""
    project = tomllib.loads((src / "pyproject.toml").read_text())
    meta, packages = project["project"], project["tool"]["setuptools"]["packages"]
    for pkg in packages:
        shutil.copytree(src / pkg, site / pkg)
    info = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    groups = meta["entry-points"]
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in groups.items()))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """The guide's package, written out and installed into a folder put on PYTHONPATH."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = tmp / "src"
    for path, body in guide_files().items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(body)
    site = tmp / "site-packages"
    install(src, site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    return {"tmp": tmp, "src": src, "env": env}


def test_the_guide_blocks_are_what_the_test_builds():
    # Guards the extraction: every fenced block that names a file is written out, none is missed.
    text = GUIDE.read_text()
    assert text.count("# file: ") == len(guide_files())
    assert 'squared_relu = "my_kernels.kcollect_spec:SPEC"' in text
    assert '[project.entry-points."kcollect.kernels"]' in text


@pytest.mark.e2e
def test_installed_plugin_is_listed_runs_and_gets_its_page(package):
    env, tmp = package["env"], package["tmp"]
    listed = kc("list", "--device", "cpu", "--format", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    mine = [r for r in json.loads(listed.stdout) if r["kernel"] == "squared_relu"]
    assert {r["provider"] for r in mine} == {"triton", "torch", "compile"}
    assert all(r["origin"].startswith("entry point squared_relu") and r["available"] for r in mine)

    db = tmp / "k.duckdb"
    ran = kc("run", "squared_relu", "--device", "cpu", "--provider", "triton", "--provider", "torch",
             "--db", str(db), "--warmup-ms", "0", "--rep-ms", "1", "--min-reps", "1", env=env)
    assert ran.returncode == 0, ran.stderr
    with Store(db, read_only=True) as s:
        rows = s.query("SELECT mode, provider, shape, status FROM results")
        (env,) = s.query("SELECT plugins FROM environments")
    # the plugin's distribution and version are in the run's environment: its rows are traceable to it
    meta = tomllib.loads((package["src"] / "pyproject.toml").read_text())["project"]
    assert json.loads(env["plugins"]) == {meta["name"]: meta["version"]}
    assert {(r["mode"], r["provider"]) for r in rows} == {(m, p) for m in ("fwd", "bwd", "fwd+bwd")
                                                          for p in ("triton", "torch")}
    assert {r["shape"] for r in rows} == {"M=8,N=1024", "M=3,N=1001"}
    assert {r["status"] for r in rows} == {"ok"}, rows

    # build-site reads the store alone: no plugin on its path
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    built = kc("build-site", "--db", str(db), "--out", str(tmp / "site"), "--data", "", env=plain)
    assert built.returncode == 0, built.stderr
    page = tmp / "site" / "kernels" / "squared_relu.html"
    assert page.is_file() and "squared_relu" in page.read_text()


@pytest.mark.e2e
def test_the_guides_own_tests_pass(package):
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=package["src"], env=package["env"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "6 passed" in out.stdout


@pytest.mark.e2e
def test_kernel_module_file_for_a_one_off(package):
    # The spec file named directly, without the package installed (its own imports on PYTHONPATH).
    env = {**os.environ, "PYTHONPATH": str(package["src"])}
    spec_file = package["src"] / "my_kernels" / "kcollect_spec.py"
    listed = kc("list", "--device", "cpu", "--format", "csv", "--kernel-module", str(spec_file), env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [ln for ln in listed.stdout.splitlines() if ln.startswith("squared_relu,")]
    assert len(rows) == 3 and all(str(spec_file) in ln for ln in rows)


def test_a_missing_kernel_module_is_one_line_and_exit_2(tmp_path):
    # in-process: the exit code of a real process is test_cli's test_bad_input_in_a_real_process
    out = CliRunner().invoke(main, ["list", "--kernel-module", str(tmp_path / "nope.py")])
    assert out.exit_code == 2 and out.stderr.strip().count("\n") == 0, (out.stderr, out.exception)
    assert "nope.py: no such file" in out.stderr


# -- the registry's rules, in-process -------------------------------------------------------------

def _spec_file(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return path


def test_a_duplicate_name_is_refused_with_both_origins(tmp_path):
    dup = _spec_file(tmp_path, "dup", "from kcollect.registry import builtin_spec\n"
                                      "SPEC = builtin_spec('swiglu')\n")
    with pytest.raises(RegistryError, match="kernel 'swiglu', which builtin already declares"):
        registry.load([dup], plugins=False)


def test_a_file_without_spec_and_a_broken_file_are_one_sentence(tmp_path):
    empty = _spec_file(tmp_path, "empty", "X = 1\n")
    broken = _spec_file(tmp_path, "broken", "raise RuntimeError('boom')\n")
    with pytest.raises(RegistryError, match="defines neither SPEC nor SPECS"):
        registry.load([empty], plugins=False)
    with pytest.raises(RegistryError, match="failed to import: RuntimeError: boom"):
        registry.load([broken], plugins=False)


def test_a_broken_entry_point_does_not_stop_the_others(monkeypatch):
    class EP:
        name, value = "bad", "nowhere:SPEC"

        def load(self):
            raise ImportError("No module named 'nowhere'")

    monkeypatch.setattr(registry, "entry_points", lambda group: [EP()] if group == registry.GROUP else [])
    reg = registry.load()
    assert set(registry.BUILTIN) <= set(reg.names())
    assert reg.errors == {"entry point bad (nowhere:SPEC)": "ImportError: No module named 'nowhere'"}


@pytest.mark.parametrize("op", registry.BUILTIN)
def test_builtin_grid_shapes_pass_their_own_check(op):
    # one test for every op (an op added to BUILTIN is covered without a line of its own)
    opcheck.check_grids_accepted(registry.builtin_spec(op))
