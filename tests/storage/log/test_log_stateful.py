"""Randomized comparison of the Log against a plain in-memory model, with crashes.

Proves, over random sequences of leader and replicated appends, reads, truncations (also
truncate_fully_and_start_at), segment rolls (tiny segment.bytes), retention, flushes (after
every append, or now and then) and crashes followed by reopen, that: every batch appended
before a flush returned survives a crash;
nothing corrupt or damaged is ever returned; the log holds exactly a prefix of what the model
wrote, whose end the log end offset reports; reads follow the documented batch rules; the
epoch cache matches the batches.

A crash abandons the Log without flushing and then damages each segment file beyond the
size it had at its last fsync (the test's fsync records it): drop the unsynced tail, keep a
random prefix of it (a torn write), or flip a byte in it. Examples: HYPOTHESIS_PROFILE=
default (100, about 10 s), ci (300) or thorough (2000).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from raylog.storage import Log, LogConfig
from raylog.storage import batch as rb
from raylog.storage.batch import Record, build_batch
from raylog.storage.errors import OffsetOutOfRangeError

_EXAMPLES = {"default": 100, "ci": 300, "thorough": 2000}
EXAMPLES = _EXAMPLES.get(os.environ.get("HYPOTHESIS_PROFILE", "default"), 100)


class StoredBatch:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.header = rb.parse_header(data)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="raylog-stateful-"))
        self.durable_sizes: dict[str, int] = {}  # .log path -> size at its last fsync
        self.model: list[StoredBatch] = []
        self.model_start = 0
        self.acked_end = 0  # every offset below is acknowledged durable
        self.epoch = 0
        self.config = LogConfig()
        self.flush_every_append = False
        self.log: Log | None = None

    # -- helpers ------------------------------------------------------------------------------

    def _fsync(self, fd: int) -> None:
        os.fdatasync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        self.durable_sizes[path] = os.fstat(fd).st_size

    def _open(self) -> None:
        # Whatever is on disk at open has survived a crash: it counts as durable.
        for p in self.dir.glob("*.log"):
            self.durable_sizes[str(p)] = p.stat().st_size
        self.log = Log.open(self.dir, self.config, clock_ms=lambda: 0, fsync=self._fsync)

    @property
    def model_end(self) -> int:
        return self.model[-1].header.next_offset if self.model else self.model_start

    def _record_append(self, stored: bytes) -> None:
        self.model.append(StoredBatch(stored))

    def _after_append(self) -> None:
        """A replica's flush per append: what the flush covers is acknowledged."""
        assert self.log is not None
        if self.flush_every_append:
            self.log.flush()
            self.acked_end = self.model_end

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules --------------------------------------------------------------------------------

    @initialize(
        segment_bytes=st.sampled_from([300, 700, 4096]),
        flush_every_append=st.booleans(),
        retention_bytes=st.sampled_from([-1, 900, 2500]),
    )
    def start(self, segment_bytes: int, flush_every_append: bool, retention_bytes: int) -> None:
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=128,
            retention_ms=-1,
            retention_bytes=retention_bytes,
        )
        self.flush_every_append = flush_every_append
        self._open()

    @rule(
        records=st.integers(1, 4),
        value_size=st.integers(0, 150),
        bump=st.booleans(),
        ts=st.integers(0, 10_000),
    )
    def leader_append(self, records: int, value_size: int, bump: bool, ts: int) -> None:
        assert self.log is not None
        self.epoch += int(bump)
        value = bytes([len(self.model) % 251]) * value_size
        data = build_batch([Record(b"k", value, ts + i) for i in range(records)])
        info = self.log.append(data, self.epoch)
        assert info.base_offset == self.model_end
        assert info.last_offset == self.model_end + records - 1
        self._record_append(self.log.read(info.base_offset, 1))
        self._after_append()

    @rule(count=st.integers(1, 3), records=st.integers(1, 3), bump=st.booleans())
    def replicated_append(self, count: int, records: int, bump: bool) -> None:
        assert self.log is not None
        self.epoch += int(bump)
        base = self.model_end
        batches = []
        for _ in range(count):
            batches.append(
                build_batch(
                    [Record(None, b"r%d" % base, base) for _ in range(records)],
                    base_offset=base,
                    partition_leader_epoch=self.epoch,
                )
            )
            base += records
        self.log.append_replicated(b"".join(batches))
        for data in batches:
            self._record_append(data)
        self._after_append()

    @rule()
    def flush(self) -> None:
        assert self.log is not None
        self.log.flush()
        self.acked_end = self.model_end

    @rule(data=st.data(), max_bytes=st.integers(0, 2000), bounded=st.booleans())
    def read(self, data: st.DataObject, max_bytes: int, bounded: bool) -> None:
        assert self.log is not None
        offset = data.draw(st.integers(self.model_start, self.model_end))
        max_offset = data.draw(st.integers(offset, self.model_end + 2)) if bounded else None
        got = self.log.read(offset, max_bytes, max_offset)
        assert got == self._expected_read(offset, max_bytes, max_offset)

    def _expected_read(self, offset: int, max_bytes: int, max_offset: int | None) -> bytes:
        limit = self.model_end if max_offset is None else min(max_offset, self.model_end)
        out: list[bytes] = []
        total = 0
        for b in self.model:
            if b.header.last_offset < offset:
                continue
            if b.header.last_offset >= limit or (out and total + len(b.data) > max_bytes):
                break
            out.append(b.data)
            total += len(b.data)
        return b"".join(out)

    @rule(data=st.data())
    def out_of_range_reads(self, data: st.DataObject) -> None:
        assert self.log is not None
        for offset in (self.model_start - 1, self.model_end + 1):
            if offset >= 0:
                try:
                    self.log.read(offset, 100)
                except OffsetOutOfRangeError:
                    continue
                raise AssertionError(f"read at {offset} did not raise")

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        assert self.log is not None
        offset = data.draw(st.integers(self.model_start, self.model_end))
        new_end = self.log.truncate_to(offset)
        self.model = [b for b in self.model if b.header.last_offset < offset]
        assert new_end == self.model_end
        self.acked_end = min(self.acked_end, new_end)  # truncation is durable

    @rule(gap=st.integers(0, 50))
    def truncate_fully_and_start_at(self, gap: int) -> None:
        assert self.log is not None
        start = self.model_end + gap
        self.log.truncate_fully_and_start_at(start)
        self.model = []
        self.model_start = start
        self.acked_end = start

    @rule()
    def retention(self) -> None:
        assert self.log is not None
        self.log.enforce_retention(now_ms=0)
        start = self.log.log_start_offset
        assert start >= self.model_start
        assert start == self.model_end or any(b.header.base_offset == start for b in self.model)
        self.model = [b for b in self.model if b.header.base_offset >= start]
        self.model_start = start
        if self.config.retention_bytes >= 0:
            sizes = sum(len(b.data) for b in self.model)
            assert sizes <= self.config.retention_bytes + self.config.segment_bytes + 700

    @rule(mode=st.sampled_from(["drop", "torn", "flip"]), data=st.data())
    def crash_and_reopen(self, mode: str, data: st.DataObject) -> None:
        assert self.log is not None
        for seg in self.log._state.segments:  # abandon without flushing, as a crash would
            seg.release()
        self.log = None
        for path in sorted(self.dir.glob("*.log")):
            size = path.stat().st_size
            durable = min(self.durable_sizes.get(str(path), 0), size)
            if durable == size:
                continue
            with open(path, "r+b") as f:
                if mode == "drop":
                    f.truncate(durable)
                elif mode == "torn":
                    f.truncate(durable + data.draw(st.integers(0, size - durable - 1)))
                else:
                    # Flip a byte under the CRC of an unsynced batch (baseOffset and the
                    # leader epoch are outside the CRC by Kafka's design).
                    f.seek(durable)
                    tail = f.read()
                    spans = [(p, h) for p, h in rb.valid_prefix(tail)[0]]
                    if spans:
                        p, h = data.draw(st.sampled_from(spans))
                        at = durable + p + data.draw(st.integers(rb.CRC_START, h.size - 1))
                        f.seek(at)
                        byte = f.read(1)[0]
                        f.seek(at)
                        f.write(bytes([byte ^ 0x20]))
        self._open()
        assert self.log is not None
        end = self.log.log_end_offset
        assert self.acked_end <= end <= self.model_end, (self.acked_end, end, self.model_end)
        assert self.log.log_start_offset == self.model_start
        self.model = [b for b in self.model if b.header.last_offset < end]
        assert self.model_end == end
        self.acked_end = end  # what survived is on disk now

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def matches_model(self) -> None:
        if self.log is None:
            return
        assert self.log.log_end_offset == self.model_end
        assert self.log.log_start_offset == self.model_start
        everything = self.log.read(self.model_start, 1 << 30)
        assert everything == b"".join(b.data for b in self.model)
        for _, h in rb.iter_batches(everything, verify=True):
            assert h.magic == 2

    @invariant()
    def epochs_match_batches(self) -> None:
        if self.log is None:
            return
        expected: list[tuple[int, int]] = []
        for b in self.model:
            e = b.header.partition_leader_epoch
            if not expected or e > expected[-1][0]:
                expected.append((e, b.header.base_offset))
        assert [tuple(e) for e in self.log.epoch_entries] == expected
        if expected:
            assert self.log.end_offset_for_epoch(expected[-1][0]) == (
                expected[-1][0],
                self.model_end,
            )

    @precondition(lambda self: self.log is not None)
    @rule()
    def close_and_reopen(self) -> None:
        assert self.log is not None
        self.log.close()
        self._open()
        self.acked_end = self.model_end


LogMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLog = LogMachine.TestCase
