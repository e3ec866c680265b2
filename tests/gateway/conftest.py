"""Fixtures for the gateway's tests (helpers are in ``gateway_support``).

- ``live_gateway`` (module scope): a real ``GatewayServer`` on 127.0.0.1 port 0 over
  ``InMemoryBackend`` with ``sample_topics()``, in its own thread; stopped at the end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.gateway import InMemoryBackend, LiveGateway, sample_topics


@pytest.fixture(scope="module")
def live_gateway() -> Iterator[LiveGateway]:
    gateway = LiveGateway(InMemoryBackend(topic_states=sample_topics()))
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()
