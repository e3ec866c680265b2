"""A simulated network: each message is dropped, delayed, duplicated or held by a partition,
all decided by the simulator's one seeded ``random.Random``.

Reordering comes from independent random delays. A message to a process that has crashed since
it was sent is lost (the connection died with the process), so a restarted replica never sees
messages meant for its previous incarnation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class NetworkConfig:
    drop_probability: float = 0.02
    duplicate_probability: float = 0.02
    delay_min_ms: int = 1
    delay_max_ms: int = 20


@dataclass
class SimNetwork:
    rng: random.Random
    config: NetworkConfig
    # Unordered pairs of addresses that cannot talk to each other right now.
    cut: set[frozenset[int]] = field(default_factory=set)

    def deliveries(self, src: int, dst: int, duplicate: bool = True) -> list[int]:
        """Delays (ms) of the copies of one message from ``src`` to ``dst`` that arrive."""
        if frozenset((src, dst)) in self.cut or self.rng.random() < self.config.drop_probability:
            return []
        copies = 2 if duplicate and self.rng.random() < self.config.duplicate_probability else 1
        return [
            self.rng.randint(self.config.delay_min_ms, self.config.delay_max_ms)
            for _ in range(copies)
        ]
