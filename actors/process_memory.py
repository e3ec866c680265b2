"""What a raylog process costs in memory, and what keeps a replica's process small.

Each partition replica is a Ray actor, so a process of its own: its private memory (what the
process alone holds, Linux's USS: the Private_Clean and Private_Dirty pages of
``/proc/<pid>/smaps_rollup``) is the marginal cost of one more replica on a node.
:func:`private_mib` measures it; brokers report their replicas' figure and the controller's
memory check of new replicas uses it (``control/placement.py``).

:func:`lean_serialization_context` keeps about 10 MiB of modules out of a replica's process:
Ray builds each process's serialization context on first use and, for the custom serializers
of Ray Data and Serve, imports pyarrow (with numpy) and pydantic into it, none of which a
replica uses. Building the context once with those two hidden leaves them out; an import of
either later in the process works as usual (it only finds no Arrow serializers registered).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

# What Ray's serialization context imports for serializers a replica never uses.
UNUSED_BY_REPLICAS = ("pyarrow", "pydantic")


def private_mib(pid: int | str = "self") -> float | None:
    """The private memory (USS) of process ``pid`` in MiB; None where Linux's
    ``smaps_rollup`` cannot be read (another OS, a process gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kib = sum(
        int(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("Private_Clean:", "Private_Dirty:"))
    )
    return kib / 1024


def lean_serialization_context() -> None:
    """In a Ray worker process whose context is not built yet, build it with
    :data:`UNUSED_BY_REPLICAS` hidden (a driver or a process that imported them is left
    alone). Called where a replica's module loads, which Ray does before it decodes the
    replica's first arguments."""
    import ray

    worker = getattr(ray._private.worker, "global_worker", None)  # Ray has no public hook
    if getattr(worker, "mode", None) != ray.WORKER_MODE:
        return
    if any(m in sys.modules for m in UNUSED_BY_REPLICAS):
        return
    try:
        for name in UNUSED_BY_REPLICAS:
            sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
        worker.get_serialization_context()
    except Exception as exc:  # a Ray whose internals moved: the replica starts as Ray's own
        log.warning("Ray's serialization context not built lean: %r", exc)
    finally:
        for name in UNUSED_BY_REPLICAS:  # none was imported (checked above): unhide
            sys.modules.pop(name, None)


__all__ = ["UNUSED_BY_REPLICAS", "lean_serialization_context", "private_mib"]
