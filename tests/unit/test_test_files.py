"""The test tree's one rule pytest enforces only when it collects everything: no two test files
share a name (tests/ holds no packages, so pytest imports each file by its basename)."""

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_two_test_files_share_a_name():
    files = [p for p in (ROOT / "tests").rglob("test_*.py") if "output" not in p.parts]
    repeated = {name for name, count in Counter(p.name for p in files).items() if count > 1}
    assert not repeated, sorted(str(p.relative_to(ROOT)) for p in files if p.name in repeated)
