"""Every Python package in the four code folders is shipped by the distribution.

Proves that pyproject's explicit package list (needed for the raylog.* package-dir mapping)
names every folder holding an __init__.py, so `pip install .` installs all of raylog.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "actors": "raylog.actors",
    "gateway": "raylog.gateway",
    "storage": "raylog.storage",
    "pipelines": "raylog.pipelines",
}


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert config["package-dir"] == {package: folder for folder, package in FOLDERS.items()}
    found = set()
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found == listed, f"unlisted: {sorted(found - listed)}, stale: {sorted(listed - found)}"
