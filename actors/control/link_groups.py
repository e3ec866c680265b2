"""Pure: the consumer-group offsets a cross-cluster link mirrors, and the commits it refuses.

This module owns the rules of group-offset mirroring (KIP-986's consumer offset sync); the
sync itself runs in ``gateway/links/groups.py`` and writes through the group coordinator.

Decisions:
- A link mirrors a group's committed offsets when its ``groups_regex`` (``links create
  --groups``) matches the whole group id, for the partitions of the link's mirror topics only
  (offsets name source offsets, and only a mirror holds the source's records at the source's
  offsets). Both conditions hold only while the link is active: a disconnect (of the link, or
  of one topic) clears the topic's mirror mark, and with it this ownership.
- Read-only: while an active link owns a group's offsets of a topic (:func:`owning_link`),
  OffsetCommit and TxnOffsetCommit of that group for that topic are refused; the group's
  other topics stay writable, and JoinGroup, fetching and OffsetFetch are unaffected. The sync
  is the only writer, so a consumer on the destination cannot move offsets the next sync round
  would move back. A user who wants to consume and commit on the destination disconnects the
  link (or the topic) first; reading the mirror without committing needs nothing.
- Clamping (:func:`clamp_to_mirror`): an offset is written only up to the mirror partition's
  high watermark. A committed offset beyond what the mirror holds would, once a consumer
  started there, be out of range and reset by ``auto.offset.reset``: records skipped or read
  twice. A partition whose high watermark is unknown this round is left for the next.
- The leader epoch of a mirrored commit is -1 (unknown): the source's epochs are not the
  destination's, and a consumer validating a committed position (KIP-320) against a foreign
  epoch could truncate wrongly; -1 skips that validation.
- A group with members on the destination is skipped (as Kafka's MirrorMaker 2 skips groups
  active on its target): the sync writes only Empty (or new) groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from raylog.actors.control.links import ClusterLink, MirrorInfo

__all__ = [
    "GROUPS_SYNC_INTERVAL_MS",
    "MAX_GROUPS_PER_ROUND",
    "LinkGroupState",
    "clamp_to_mirror",
    "link_mirror_topics",
    "owning_link",
    "refusal_message",
]

GROUPS_SYNC_INTERVAL_MS = "link.groups.sync.interval.ms"
# The most groups one broker syncs per link per round (the first, by name); the others wait.
MAX_GROUPS_PER_ROUND = 1_000

SYNCED = "synced"
SKIPPED_ACTIVE = "skipped-active"
ERROR = "error"

TopicPartition = tuple[str, int]


class LinkGroupState(msgspec.Struct, frozen=True, kw_only=True):
    """One mirrored group as the broker coordinating it last synced it (``links describe``)."""

    group: str
    state: str  # synced | skipped-active | error
    offsets: int = 0  # the partitions whose offsets the group holds from the link
    written: int = 0  # of those, written in the last round (the others were current)
    last_sync_ms: int = 0  # wall clock of the last round that synced it (0: never)
    error: str = ""


def owning_link(
    links: Mapping[str, ClusterLink], mirror: MirrorInfo | None, group: str
) -> ClusterLink | None:
    """The active link that owns ``group``'s offsets of a topic whose mirror mark is
    ``mirror`` (None: the topic is not a mirror, or its link does not mirror this group)."""
    if mirror is None:
        return None
    link = links.get(mirror.link)
    if link is None or not link.active or not link.matches_group(group):
        return None
    return link


def refusal_message(link: ClusterLink, group: str, topics: Iterable[str]) -> str:
    """What the broker says of a refused commit (the client sees INVALID_REQUEST only:
    OffsetCommit's response has no message field)."""
    return (
        f"offsets of group {group!r} in {', '.join(sorted(topics))} are mirrored by link "
        f"{link.name!r} (consumer.groups.regex {link.groups_regex!r}) and read-only while it "
        f"is active; read without committing, or run `raylog links disconnect {link.name}` "
        "first"
    )


def link_mirror_topics(link: str, mirrors: Mapping[str, MirrorInfo | None]) -> list[str]:
    """The topics that are mirrors of ``link`` (``mirrors``: every topic's mirror mark)."""
    return sorted(
        name for name, mirror in mirrors.items() if mirror is not None and mirror.link == link
    )


def clamp_to_mirror(
    source: Mapping[TopicPartition, int], high_watermarks: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """The source's committed offsets each capped at the mirror partition's high watermark;
    partitions without a known high watermark (or a negative offset) are left out."""
    out = {}
    for tp, offset in source.items():
        hw = high_watermarks.get(tp, -1)
        if offset >= 0 and hw >= 0:
            out[tp] = min(offset, hw)
    return out
