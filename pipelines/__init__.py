"""raylog.pipelines: reading raylog topics from Spark and Ray Data.

- ``register(spark)``: adds the ``raylog`` format (batch and Structured Streaming) to a
  SparkSession (:mod:`raylog.pipelines.spark_source`);
- ``read_topic(topic, ...)``: a ``ray.data.Dataset`` of a topic's committed records
  (:mod:`raylog.pipelines.ray_data`);
- :mod:`raylog.pipelines.features`: the example feature pipeline and its event generator
  (`raylog pipeline features|generate`, :mod:`raylog.actors.cli.pipeline`).

Both are imported on first use, so that a Spark worker does not import Ray Data and a Ray
Data job does not import PySpark.
"""

from __future__ import annotations

from typing import Any

__all__ = ["read_topic", "register"]


def register(spark: Any) -> None:
    """Make ``spark.read.format("raylog")`` and ``spark.readStream.format("raylog")``
    available in ``spark``."""
    from raylog.pipelines.spark_source import register as _register

    _register(spark)


def read_topic(topic: str | list[str], **kwargs: Any) -> Any:
    """See :func:`raylog.pipelines.ray_data.read_topic`."""
    from raylog.pipelines.ray_data import read_topic as _read_topic

    return _read_topic(topic, **kwargs)
