"""The documents speak for themselves and stay true: no path outside the repository, every link to
a file of the repository resolves, every path of the repository they name exists, and
docs/architecture.md lists every column of the store."""
import re
from pathlib import Path

from kcollect.store import ENV_COLUMNS, RESULT_COLUMNS, RUN_COLUMNS, SCHEMA_VERSION

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_no_file_points_outside_the_repository():
    for path in DOCS + [ROOT / "pyproject.toml", *sorted((ROOT / "scripts").glob("*"))]:
        text = path.read_text()
        assert "../" not in text and "shared/" not in text, path
    for path in DOCS:
        prose = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for ref in re.findall(r"\]\(([^)#\s]+)", prose):  # Markdown links
            if not ref.startswith(("http://", "https://")):
                assert (path.parent / ref).exists(), f"{path.name} links to {ref}, which does not exist"
    pyproject = (ROOT / "pyproject.toml").read_text()
    for name in re.findall(r"\b([\w/-]+\.md)\b", pyproject):
        assert (ROOT / name).exists() or (ROOT / "docs" / name).exists(), f"pyproject names {name}"


# A path of the repository as the documents write it: a top-level folder, then names; <placeholder>
# parts (`kernels/<op>/`) match any name, and at least one file must match them.
REPO_PATH = re.compile(r"(?<![\w./~-])((?:\.github|\.ci|collector|kernels|templates|tests|benchmarks|lab|scripts|"
                       r"requirements|docs|data)/(?:[\w.*-]|<[^>]*>|/)*)")
# What the documents name but a checkout does not hold: build output, the local store, the site's
# pages (site/kernels/NAME.html).
NOT_COMMITTED = re.compile(r"^(site/|data/kbench\.duckdb$|kernels/[^/]*\.html$)")


def named_paths(text: str) -> set[str]:
    """The repository paths a document names, less the files its examples have the reader create
    (a code block's `# file: PATH` line)."""
    text = re.sub(r"^# file: \S+$", "", text, flags=re.M)
    return {m.rstrip(".") for m in REPO_PATH.findall(text)}


def test_every_repository_path_the_documents_name_exists():
    for doc in DOCS:
        for path in sorted(named_paths(doc.read_text())):
            if NOT_COMMITTED.match(path):
                continue
            pattern = re.sub(r"<[^>]*>", "*", path)
            found = any(ROOT.glob(pattern.rstrip("/"))) if "*" in pattern else (ROOT / path).exists()
            assert found, f"{doc.name} names {path}, which does not exist"


def test_the_path_check_can_fail():
    assert named_paths("see `benchmarks/<kernel>_ab.py` and lab/ab.py.\n# file: tests/test_x.py\n") == {
        "benchmarks/<kernel>_ab.py", "lab/ab.py"}
    assert not any(ROOT.glob("benchmarks/*_ab.py"))


def test_architecture_lists_every_column_of_the_store():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert f"Schema version {SCHEMA_VERSION}" in text
    for table, columns in (("environments", ENV_COLUMNS), ("runs", RUN_COLUMNS), ("results", RESULT_COLUMNS)):
        section = text[text.index(f"`{table}`, one row per"):]
        section = section[:section.index("\n\n", section.index("| --- |"))]
        listed = re.findall(r"^\| `(\w+)` \| (\w+) \|", section, re.M)
        assert [c for c, _ in listed] == list(columns), table
        assert all(columns[c].split()[0] == t for c, t in listed), table
