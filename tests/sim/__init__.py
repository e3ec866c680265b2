"""Seeded simulator of raylog's partition replication (see cluster.py for what it models)."""
