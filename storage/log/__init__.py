"""The write-ahead log of one partition replica: segments, indexes, epochs, checkpoints,
recovery, retention and compaction.

Directory layout (Kafka's)::

    00000000000000000000.log        stored RecordBatch v2 bytes, exactly as stamped
    00000000000000000000.index      sparse offset index   (see segment.py)
    00000000000000000000.timeindex  sparse time index     (see segment.py)
    00000000000000000000.txnindex   aborted transactions  (see txnindex.py; only if any)
    leader-epoch-checkpoint         "0\\n<count>\\n" then "<epoch> <startOffset>" lines
    high-watermark-checkpoint       "0\\n<high watermark>\\n"
    log-start-offset-checkpoint     "0\\n<log start offset>\\n" (DeleteRecords)
    cleaner-offset-checkpoint       "0\\n<first dirty offset>\\n<next delete horizon>\\n"
    00000000000000001234.snapshot   producer-state snapshot at offset 1234 (see snapshots.py)

Modules, one concern each:

- ``log.py``: :class:`Log`, the facade: the public operations, the lock, flushes;
- ``state.py``: what a log knows about itself, the state the modules below share;
- ``appends.py``: offset assignment and stamping, a follower's contiguity checks, rolls;
- ``config.py``: :class:`LogConfig` and the log's limits;
- ``segment.py``: one segment, its ``.log`` file and its two indexes (byte layouts there);
- ``txnindex.py``: a segment's aborted-transaction index (``.txnindex``, Kafka's layout);
- ``segment_list.py``: a log's segments, oldest first, and the inactive ones kept open;
- ``recovery.py``: what :meth:`Log.open` accepts after a crash, and what it cuts;
- ``epochs.py``: the leader-epoch cache (KIP-101/279) and its checkpoint;
- ``checkpoints.py``: the checkpoint files' format (high watermark, log start, cleaner);
- ``snapshots.py``: the producer-state snapshot files (their bytes are the replica's);
- ``reads.py``: locating and reading whole batches, extents for short-circuit reads;
- ``retention.py``: what leaves the head (retention, the log start offset);
- ``truncation.py``: what leaves the tail (truncation, starting over empty);
- ``compaction.py``: a cleaning pass (plan, swap); ``rewrite.py``: its rewrite, files only;
  ``cleaner.py``: the per-batch rules of Kafka's log cleaner (pure).

Limits (bounded memory): one batch <= MAX_BATCH_BYTES (64 MiB) on both paths and in
recovery; index positions and relative offsets are int32, so segment.bytes < 2 GiB; the
active segment's indexes live in memory (20 bytes per index.interval.bytes of data, 5 MiB for
a full 1 GiB segment at 4 KiB), plus at most MAX_OPEN_INACTIVE_SEGMENTS inactive segments
with loaded indexes and an open descriptor (LRU); recovery reads 8 MiB at a time. Per
segment the Log keeps a few integers only.
"""

from raylog.storage.log.appends import AppendInfo
from raylog.storage.log.checkpoints import (
    CLEANER_CHECKPOINT,
    DAMAGE_CHECKPOINT,
    HIGH_WATERMARK_CHECKPOINT,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    Damage,
)
from raylog.storage.log.compaction import CleanResult
from raylog.storage.log.config import MAX_BATCH_BYTES, LogConfig, cleanup_policies
from raylog.storage.log.epochs import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, EpochEntry
from raylog.storage.log.log import Log, wall_clock_ms
from raylog.storage.log.reads import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    DamagedBatchError,
    Extents,
    TimestampOffset,
)
from raylog.storage.log.rewrite import RewriteJob, RewriteRunner, Rewritten, rewrite_segments
from raylog.storage.log.segment import CLEANED_SUFFIX
from raylog.storage.log.segment_list import ClosedSegment
from raylog.storage.log.state import LogStats
from raylog.storage.log.txnindex import AbortedTxn

__all__ = [
    "CLEANED_SUFFIX",
    "CLEANER_CHECKPOINT",
    "DAMAGE_CHECKPOINT",
    "EARLIEST_TIMESTAMP",
    "HIGH_WATERMARK_CHECKPOINT",
    "LATEST_TIMESTAMP",
    "LEADER_EPOCH_CHECKPOINT",
    "LOG_START_OFFSET_CHECKPOINT",
    "MAX_BATCH_BYTES",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "AbortedTxn",
    "AppendInfo",
    "CleanResult",
    "ClosedSegment",
    "Damage",
    "DamagedBatchError",
    "EpochEntry",
    "Extents",
    "Log",
    "LogConfig",
    "LogStats",
    "RewriteJob",
    "RewriteRunner",
    "Rewritten",
    "TimestampOffset",
    "cleanup_policies",
    "rewrite_segments",
    "wall_clock_ms",
]
