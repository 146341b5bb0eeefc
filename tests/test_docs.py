"""The documents speak for themselves and stay true: no path outside the repository, every link to
a file of the repository resolves, and docs/architecture.md lists every column of the store."""
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


def test_architecture_lists_every_column_of_the_store():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert f"Schema version {SCHEMA_VERSION}" in text
    for table, columns in (("environments", ENV_COLUMNS), ("runs", RUN_COLUMNS), ("results", RESULT_COLUMNS)):
        section = text[text.index(f"`{table}`, one row per"):]
        section = section[:section.index("\n\n", section.index("| --- |"))]
        listed = re.findall(r"^\| `(\w+)` \| (\w+) \|", section, re.M)
        assert [c for c, _ in listed] == list(columns), table
        assert all(columns[c].split()[0] == t for c, t in listed), table
