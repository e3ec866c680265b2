"""The Spark source's option checks, without a cluster or a Spark session.

Proves: batch and stream defaults (earliest / latest), the checks that differ between batch and
streaming (startingOffsets=latest, endingOffsets), maxOffsetsPerTrigger validation, and that
the removed temporary ``catalog`` option is now an unknown option.
"""

from __future__ import annotations

import pytest

from raylog.pipelines.reading import EARLIEST, LATEST
from raylog.pipelines.spark_source import ReadOptions

BASE = {"cluster": "/data", "subscribe": "t"}


def test_defaults_differ_between_batch_and_stream() -> None:
    assert ReadOptions(BASE).starting == EARLIEST
    stream = ReadOptions(BASE, streaming=True)
    assert stream.starting == LATEST and stream.max_offsets_per_trigger is None


def test_mode_specific_checks() -> None:
    latest = {**BASE, "startingOffsets": "latest"}
    assert ReadOptions(latest, streaming=True).starting == LATEST
    assert ReadOptions(latest, streaming=None).starting == LATEST  # schema(): either mode
    with pytest.raises(ValueError, match="streaming"):
        ReadOptions(latest)
    ending = {**BASE, "endingOffsets": "latest"}
    with pytest.raises(ValueError, match="endingOffsets is for batch"):
        ReadOptions(ending, streaming=True)
    assert ReadOptions(ending).ending == LATEST


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be positive"),
        ({"maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger: not an integer"),
        ({"catalog": "{}"}, "unknown option"),
        ({"subscribePattern": "(", "subscribe": ""}, "bad regex"),
        ({"cluster": ""}, "cluster is required"),
    ],
)
def test_bad_options(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReadOptions({**BASE, **extra}, streaming=True)


def test_max_offsets_per_trigger_is_parsed() -> None:
    options = ReadOptions({**BASE, "MaxOffsetsPerTrigger": "500"}, streaming=True)
    assert options.max_offsets_per_trigger == 500
