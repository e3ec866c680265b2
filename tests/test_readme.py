"""The README's configuration reference lists every topic and broker key raylog accepts.

Proves the documentation cannot drift from the one config registry: a key added to
raylog.actors.topic_config without a README row fails here.
"""

from __future__ import annotations

from pathlib import Path

from raylog.actors import topic_config

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_config_key_is_documented_with_its_default() -> None:
    text = README.read_text()
    for registry in (topic_config.TOPIC_CONFIGS, topic_config.BROKER_CONFIGS):
        for d in registry.defs.values():
            assert f"| `{d.name}` | `{d.default}` |" in text, f"README lacks {d.name}={d.default}"
