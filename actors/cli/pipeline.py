"""`raylog pipeline features|generate`: the example feature pipeline and its event generator.

``add_subcommands(subparsers)`` adds the ``pipeline`` command to the `raylog` parser
(:func:`raylog.actors.cli.main.build_parser`). PySpark and confluent-kafka are imported only
when a command runs, so `raylog up` does not pay for them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_CLUSTER = "./raylog-data"  # as `raylog up`'s default data dir
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"  # as `raylog up`'s default first gateway port


def cmd_features(args: argparse.Namespace) -> int:
    from raylog.pipelines.features import DEFAULT_WATERMARK, run_features

    cluster = args.cluster or os.environ.get("RAYLOG_DATA_DIR") or DEFAULT_CLUSTER
    if Path(cluster).expanduser().is_dir() or ":" not in cluster:
        cluster = str(Path(cluster).expanduser().absolute())
    out = Path(args.out).expanduser().absolute()
    checkpoint = Path(args.checkpoint).expanduser().absolute() if args.checkpoint else None
    return run_features(
        cluster=cluster,
        topic=args.topic,
        out=out,
        checkpoint=checkpoint or out / "_checkpoints",
        watermark=args.watermark or DEFAULT_WATERMARK,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from raylog.pipelines.features import run_generate

    acked = run_generate(
        bootstrap=args.bootstrap_servers,
        topic=args.topic,
        rate=args.rate,
        seconds=args.seconds,
        seed=args.seed,
        compression=args.compression,
    )
    print(f"generated {acked} events to {args.topic}", flush=True)
    return 0


def _run(func: Any) -> Any:
    """Bad input is one line on stderr and exit 2, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except ValueError as e:
            print(f"raylog pipeline: {e}", file=sys.stderr)
            return 2

    return run


def add_subcommands(subparsers: Any) -> None:
    """Add ``pipeline features`` and ``pipeline generate`` to the `raylog` command."""
    pipeline = subparsers.add_parser("pipeline", help="the example feature pipeline (Spark)")
    sub = pipeline.add_subparsers(dest="pipeline_command", required=True)

    features = sub.add_parser(
        "features", help="per-user window features of JSON events, written as Parquet"
    )
    features.add_argument("--topic", required=True)
    features.add_argument("--out", required=True, help="output directory (Parquet)")
    features.add_argument("--checkpoint", help="checkpoint directory (default OUT/_checkpoints)")
    features.add_argument(
        "--cluster",
        help=f"data dir of the cluster or a Ray address (default $RAYLOG_DATA_DIR or "
        f"{DEFAULT_CLUSTER})",
    )
    features.add_argument("--watermark", help="event-time watermark delay (default 10 minutes)")
    features.add_argument("--trigger-seconds", type=float, default=5.0)
    features.add_argument(
        "--available-now",
        action="store_true",
        help="process what the topic holds now, then exit",
    )
    features.set_defaults(func=_run(cmd_features))

    generate = sub.add_parser("generate", help="produce JSON events {user, item, amount, ts}")
    generate.add_argument("--topic", required=True)
    generate.add_argument("--rate", type=float, required=True, help="events per second")
    generate.add_argument("--seconds", type=float, default=10.0, help="how long (default 10)")
    generate.add_argument("--bootstrap-servers", default=DEFAULT_BOOTSTRAP)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument(
        "--compression", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    generate.set_defaults(func=_run(cmd_generate))
