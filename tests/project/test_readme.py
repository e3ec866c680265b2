"""The README's configuration reference lists every topic and broker key raylog accepts.

Proves the documentation cannot drift from the one config registry: a key added to
raylog.actors.control.config_keys without a README row fails here.
"""

from __future__ import annotations

from pathlib import Path

from raylog.actors.control import config_keys

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_config_key_is_documented_with_its_default() -> None:
    text = README.read_text()
    for registry in (config_keys.TOPIC_CONFIGS, config_keys.BROKER_CONFIGS):
        for d in registry.defs.values():
            assert f"| `{d.name}` | `{d.default}` |" in text, f"README lacks {d.name}={d.default}"
