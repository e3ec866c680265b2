"""The log's checkpoint files: small text files in Kafka's checkpoint format, a version line
then values, each file rewritten whole and atomically (temp file, fsync, rename, fsync of the
directory).

| file                        | lines                                                        |
|-----------------------------|--------------------------------------------------------------|
| leader-epoch-checkpoint     | ``0``, ``<count>``, then ``<epoch> <startOffset>`` per entry |
|                             | (see epochs.py)                                              |
| high-watermark-checkpoint   | ``0``, ``<high watermark>``                                  |
| log-start-offset-checkpoint | ``0``, ``<log start offset>`` (DeleteRecords; see log.py)    |
| cleaner-offset-checkpoint   | ``0``, ``<first dirty offset>``, ``<next delete horizon ms>``|
|                             | (-1: no kept tombstone waits; see compaction.py)             |
| damage-checkpoint           | ``0``, ``<cut offset>``, ``<repair offset>`` (damaged data   |
|                             | the log drops and must re-fetch; see :class:`Damage`)        |

A missing file reads as absent; an unreadable one (another version, not a number, short) is
ignored with a warning, and the log falls back to what its segments say. Every value read is
clamped into the log by its caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

from raylog.storage.errors import KafkaStorageError
from raylog.storage.log.segment import fsync_directory, write_file_atomically

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 0
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "high-watermark-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
DAMAGE_CHECKPOINT = "damage-checkpoint"

_T = TypeVar("_T")


def read_checkpoint(path: Path, parse: Callable[[list[str]], _T]) -> _T | None:
    """``parse`` of the lines after the version line; None when the file is missing, or when
    it is unreadable (a warning): ``parse`` raises ValueError or IndexError for that."""
    try:
        lines = path.read_text().split("\n")
        if int(lines[0]) != CHECKPOINT_VERSION:
            raise ValueError(f"version {lines[0]}")
        return parse(lines[1:])
    except FileNotFoundError:
        return None
    except (ValueError, IndexError) as exc:
        logger.warning("ignoring unreadable %s: %s", path, exc)
        return None


def write_checkpoint(directory: Path, name: str, values: list[str]) -> None:
    """Replace checkpoint ``name`` by the version line and ``values``, durably; raises
    KafkaStorageError."""
    text = "\n".join([str(CHECKPOINT_VERSION), *values]) + "\n"
    try:
        write_file_atomically(directory / name, text.encode())
        fsync_directory(directory)
    except OSError as exc:
        raise KafkaStorageError(f"{name} failed: {exc}") from exc


def read_offset(directory: Path, name: str) -> int | None:
    """The offset in a ``0``, ``<offset>`` checkpoint; None when missing or unreadable."""
    return read_checkpoint(directory / name, lambda values: int(values[0]))


def write_offset(directory: Path, name: str, offset: int) -> None:
    write_checkpoint(directory, name, [str(offset)])


class CleanerCheckpoint(NamedTuple):
    """Where a log's next cleaning pass starts, and when a kept tombstone may go."""

    first_dirty_offset: int = 0  # offsets below it were cleaned by an earlier pass
    next_delete_horizon_ms: int = -1  # the earliest delete horizon of a kept batch; -1: none


def read_cleaner(directory: Path) -> CleanerCheckpoint:
    """The cleaner checkpoint; the default (nothing cleaned) when missing or unreadable."""

    def parse(values: list[str]) -> CleanerCheckpoint:
        return CleanerCheckpoint(int(values[0]), int(values[1]))

    return read_checkpoint(directory / CLEANER_CHECKPOINT, parse) or CleanerCheckpoint()


def write_cleaner(directory: Path, checkpoint: CleanerCheckpoint) -> None:
    write_checkpoint(directory, CLEANER_CHECKPOINT, [str(value) for value in checkpoint])


class Damage(NamedTuple):
    """Data a replica's log lost or holds damaged: everything from ``cut_offset`` on is dropped
    when the log is next opened (recovery truncates there), and until the log ends at
    ``repair_offset`` again (the high watermark when the damage was found: committed data)
    the replica lacks committed records and must not lead."""

    cut_offset: int
    repair_offset: int

    def merged(self, other: Damage | None) -> Damage:
        """Both damages at once: the lower cut, the higher repair offset."""
        if other is None:
            return self
        return Damage(
            min(self.cut_offset, other.cut_offset), max(self.repair_offset, other.repair_offset)
        )


def read_damage(directory: Path) -> Damage | None:
    """The damage checkpoint; None when there is none (or it is unreadable: a warning)."""
    return read_checkpoint(
        directory / DAMAGE_CHECKPOINT, lambda values: Damage(int(values[0]), int(values[1]))
    )


def write_damage(directory: Path, damage: Damage | None) -> None:
    """Replace the damage checkpoint (None: remove it), durably; raises KafkaStorageError."""
    if damage is not None:
        write_checkpoint(directory, DAMAGE_CHECKPOINT, [str(value) for value in damage])
        return
    try:
        (directory / DAMAGE_CHECKPOINT).unlink(missing_ok=True)
        fsync_directory(directory)
    except OSError as exc:
        raise KafkaStorageError(f"{DAMAGE_CHECKPOINT} removal failed: {exc}") from exc
