"""Every document a comment or docstring cites exists in the repo (issue 14: code comments cited
documents that do not exist here). A name is looked for as given from the repo root, in docs/,
and beside the citing file."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]\.md)\b")


def _missing(root: Path = ROOT) -> list[str]:
    out = []
    for folder in ("ledger", "tests", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for ref in DOC.findall(line):
                    if not any(p.is_file() for p in (root / ref, root / "docs" / ref, path.parent / ref)):
                        out.append(f"  {path.relative_to(root)}:{n} cites {ref}")
    return out


def test_cited_documents_exist():
    missing = _missing()
    assert not missing, "comments cite documents that are not in the repo:\n" + "\n".join(missing)


def test_the_check_can_fail(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "gate.md").write_text("# gate\n")
    (tmp_path / "ledger").mkdir()
    absent = "GATE" + ".md"  # spelled apart, so this file does not cite it
    (tmp_path / "ledger" / "m.py").write_text(f'"""See docs/gate.md and gate.md, not {absent}."""\n')
    assert _missing(tmp_path) == [f"  ledger/m.py:1 cites {absent}"]
