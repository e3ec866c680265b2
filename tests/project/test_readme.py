"""The configuration reference (docs/CONFIG.md, linked from the README) lists every topic and
broker key raylog accepts.

Proves the documentation cannot drift from the one config registry: a key added to
raylog.actors.control.config_keys without a row in the reference fails here, and the README
keeps pointing at it.
"""

from __future__ import annotations

from pathlib import Path

from raylog.actors.control import config_keys

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "CONFIG.md"


def test_every_config_key_is_documented_with_its_default() -> None:
    text = REFERENCE.read_text()
    for registry in (config_keys.TOPIC_CONFIGS, config_keys.BROKER_CONFIGS):
        for d in registry.defs.values():
            assert f"| `{d.name}` | `{d.default}` |" in text, (
                f"CONFIG.md lacks {d.name}={d.default}"
            )


def test_the_readme_points_at_the_reference() -> None:
    assert "docs/CONFIG.md" in (ROOT / "README.md").read_text()
