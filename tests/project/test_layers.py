"""raylog's layer rules, checked on every module's imports (read with ``ast``, nothing imported).

Proves, for every module of the four code folders:

1. imports point one way: ``storage`` <- ``actors`` <- ``gateway``, and ``actors`` <-
   ``pipelines``. ``raylog.actors.cluster`` (which assembles brokers with their gateways) may
   import the gateway; ``raylog.actors.cli`` may import anything;
2. nothing outside ``raylog.actors.cli`` imports the CLI;
3. the gateway reaches actors through ``raylog.actors.calls`` and the pure packages, never
   through an actor module (``replica``, ``controller``, ``broker``);
4. pipelines use only the public surface of the other layers: ``raylog.storage``,
   ``raylog.actors.calls`` and ``raylog.actors.raycluster``;
5. pure modules (the decision-making ones, and any whose docstring opens by calling itself
   pure) import no Ray, asyncio, sockets, threads, clock, randomness or boto3;
6. an import of a raylog module inside a function is there for a stated reason (in
   ``LAZY_IMPORTS``), never to dodge an import cycle.

Each rule is also run against a module that breaks it, so that none of them can pass vacuously.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"actors", "gateway", "storage", "pipelines"}

# Where a module may import from, by the longest matching prefix of its own name.
ALLOWED: dict[str, tuple[str, ...]] = {
    "raylog.storage": ("raylog.storage",),
    "raylog.actors": ("raylog.storage", "raylog.actors"),
    "raylog.actors.cluster": ("raylog.storage", "raylog.actors", "raylog.gateway"),
    "raylog.actors.cli": ("raylog",),
    "raylog.gateway": ("raylog.storage", "raylog.actors", "raylog.gateway"),
    "raylog.pipelines": (
        "raylog.storage",
        "raylog.actors.calls",
        "raylog.actors.raycluster",
        "raylog.pipelines",
    ),
}
# Never imported by the layer on the left, whatever ALLOWED says.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "raylog.actors.cli": (),
    "raylog.actors": ("raylog.actors.cli", "raylog.actors.cluster"),
    "raylog.actors.cluster": ("raylog.actors.cli",),
    "raylog.gateway": (
        "raylog.actors.cli",
        "raylog.actors.cluster",
        "raylog.actors.replica",
        "raylog.actors.controller",
        "raylog.actors.broker",
    ),
}

IMPURE = {"ray", "asyncio", "socket", "threading", "time", "random", "boto3", "botocore"}
IMPURE |= {"datetime", "subprocess", "concurrent", "selectors", "multiprocessing"}
PURE = (
    "raylog.actors.replication",
    "raylog.actors.control.metadata",
    "raylog.actors.control.election",
    "raylog.actors.control.placement",
    "raylog.actors.control.reassignment",
    "raylog.actors.control.balancer",
    "raylog.actors.control.capacity",
    "raylog.actors.control.sessions",
    "raylog.actors.control.health",
    "raylog.actors.control.config_keys",
    "raylog.storage.batch",
    "raylog.storage.records",
    "raylog.storage.log.cleaner",
    "raylog.storage.lease",
    "raylog.gateway.protocol",
    "raylog.gateway.codec",
    "raylog.gateway.groups.group",
    "raylog.gateway.groups.records",
    "raylog.pipelines.stream_offsets",
    "raylog.pipelines.records",
)

# Imports of raylog modules inside functions, each with why it cannot be at the top.
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("raylog.storage", "raylog.storage.s3store"): "S3ObjectStore imports boto3 (slow) on use",
    ("raylog.storage.objectstore", "raylog.storage.s3store"): "boto3 only for an s3:// store",
    ("raylog.storage.objectstore", "raylog.storage.localstore"): (
        "localstore subclasses ObjectStore, defined in this module"
    ),
    ("raylog.pipelines", "raylog.pipelines.spark_source"): "pyspark only for Spark users",
    ("raylog.pipelines", "raylog.pipelines.ray_data"): "Ray Data only for its users",
    ("raylog.pipelines.features", "raylog.pipelines"): "pyspark only when the job runs",
    ("raylog.actors.cli.pipeline", "raylog.pipelines.features"): "pyspark only when it runs",
}
# Modules where every raylog import may be lazy, and why.
LAZY_MODULES: dict[str, str] = {
    "raylog.actors.cli": "a command imports what it runs: `raylog topics` must not import Ray",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # what it imports (a module, or a package with a name from it)
    line: int
    lazy: bool  # inside a function
    typing_only: bool  # under ``if TYPE_CHECKING:``


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["raylog", *parts])


def source_files() -> Iterator[Path]:
    for folder in sorted(FOLDERS):
        yield from sorted((ROOT / folder).rglob("*.py"))


def imports_of(module: str, tree: ast.Module, is_package: bool) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_lazy = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            child_typing = typing_only or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module if is_package else module.rsplit(".", 1)[0]
                    for _ in range(child.level - 1):
                        package = package.rsplit(".", 1)[0]
                    base = f"{package}.{base}" if base else package
                targets = [f"{base}.{a.name}" for a in child.names]
            for target in targets:
                found.append(Import(module, target, child.lineno, child_lazy, child_typing))
            visit(child, child_lazy, child_typing)

    visit(tree, False, False)
    return found


def all_imports() -> list[Import]:
    out: list[Import] = []
    for path in source_files():
        tree = ast.parse(path.read_text(), str(path))
        out.extend(imports_of(module_name(path), tree, path.name == "__init__.py"))
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _layer(module: str, table: dict[str, tuple[str, ...]]) -> str | None:
    keys = [k for k in table if _under(module, k)]
    return max(keys, key=len) if keys else None


def direction_violations(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        if not imp.target.startswith("raylog."):
            continue
        layer = _layer(imp.module, ALLOWED)
        assert layer is not None, f"{imp.module} is in no layer"
        if not any(_under(imp.target, ok) for ok in ALLOWED[layer]):
            bad.append(f"{imp.module}:{imp.line} imports {imp.target} (layer {layer})")
        forbidden_layer = _layer(imp.module, FORBIDDEN)
        forbidden = FORBIDDEN.get(forbidden_layer or "", ())
        if any(_under(imp.target, f) and not _under(imp.module, f) for f in forbidden):
            bad.append(f"{imp.module}:{imp.line} must not import {imp.target}")
    return bad


def is_pure(module: str, tree: ast.Module) -> bool:
    doc = (ast.get_docstring(tree) or "").split("\n\n")[0].lower()
    said = " pure" in f" {doc}" and "not pure" not in doc
    return said or any(_under(module, p) for p in PURE)


def purity_violations(imports: list[Import], pure: set[str]) -> list[str]:
    return [
        f"{imp.module}:{imp.line} is pure but imports {imp.target}"
        for imp in imports
        if imp.module in pure and not imp.typing_only and imp.target.split(".")[0] in IMPURE
    ]


def lazy_violations(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        if not imp.lazy or not imp.target.startswith("raylog"):
            continue
        if any(_under(imp.module, m) for m in LAZY_MODULES):
            continue
        if any(imp.module == m and _under(imp.target, t) for m, t in LAZY_IMPORTS):
            continue
        bad.append(f"{imp.module}:{imp.line} imports {imp.target} inside a function")
    return bad


def _trees() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text()) for p in source_files()}


def test_imports_point_one_way() -> None:
    assert direction_violations(all_imports()) == []


def test_pure_modules_import_no_io_clock_or_randomness() -> None:
    trees = _trees()
    pure = {m for m, tree in trees.items() if is_pure(m, tree)}
    assert "raylog.actors.replication.partition" in pure  # the table names real modules
    assert purity_violations(all_imports(), pure) == []


def test_raylog_modules_are_imported_lazily_only_for_a_stated_reason() -> None:
    assert lazy_violations(all_imports()) == []


def test_every_exception_names_an_import_that_exists() -> None:
    """A stale entry in LAZY_IMPORTS would let a future cycle-dodge through unnoticed."""
    lazy = {(i.module, i.target) for i in all_imports() if i.lazy}
    for module, target in LAZY_IMPORTS:
        assert any(m == module and _under(t, target) for m, t in lazy), (module, target)


def _fake(module: str, source: str) -> list[Import]:
    return imports_of(module, ast.parse(source), False)


def test_each_rule_catches_a_module_that_breaks_it() -> None:
    assert direction_violations(_fake("raylog.storage.log", "from raylog.actors import calls"))
    assert direction_violations(_fake("raylog.actors.replica", "import raylog.gateway.codec"))
    assert direction_violations(_fake("raylog.gateway.server", "from raylog.actors.cli import x"))
    assert direction_violations(_fake("raylog.gateway.x", "from raylog.actors.replica import y"))
    assert direction_violations(_fake("raylog.pipelines.x", "from raylog.actors import replica"))
    assert not direction_violations(
        _fake("raylog.pipelines.x", "from raylog.actors.calls import y")
    )
    assert purity_violations(_fake("raylog.storage.batch", "import time"), {"raylog.storage.batch"})
    lazy = "def f():\n    from raylog.actors import calls\n"
    assert lazy_violations(_fake("raylog.actors.replica", lazy))
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import asyncio\n"
    assert not purity_violations(_fake("raylog.x", typing_only), {"raylog.x"})
