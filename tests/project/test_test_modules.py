"""Every test module has a name of its own.

pytest imports test modules by their base name (the test folders are not packages), so two
modules named alike in different folders fail collection of the whole suite. Proves no two
``test_*.py`` files under tests/ share a name, and that the check sees a pair when there is one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def shared_names(paths: Iterable[Path]) -> list[str]:
    counts = Counter(path.name for path in paths)
    return sorted(name for name, n in counts.items() if n > 1)


def test_no_two_test_modules_share_a_name() -> None:
    modules = [p for p in TESTS.rglob("test_*.py") if "node_modules" not in p.parts]
    assert len(modules) > 100
    assert shared_names(modules) == []


def test_the_check_sees_a_shared_name() -> None:
    assert shared_names([Path("a/test_x.py"), Path("b/test_x.py"), Path("b/test_y.py")]) == [
        "test_x.py"
    ]
