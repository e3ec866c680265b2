"""Ray's autoscaler as raylog sees it: whether one runs, and asking it for ``raylog`` nodes.

This module owns raylog's two calls into Ray's autoscaler, for the controller's capacity
requests (``actors/control/capacity.py`` decides how many nodes; this module asks):

- :func:`autoscaler_kind`: ``"v2"`` when the cluster runs Ray's autoscaler v2 (the GCS keeps a
  key saying so), ``"v1"`` when the v1 monitor has written its status to the GCS within
  ``V1_STATUS_FRESH_S`` with node types of a configuration (without one, Ray runs a read-only
  autoscaler that launches nothing), None when no autoscaler can add nodes (a fixed cluster,
  the embedded one): then nothing is asked and a topic that does not fit is refused at once.
- :func:`request_raylog_nodes`: ``ray.autoscaler.sdk.request_resources`` with one
  ``{"raylog": 1}`` bundle per node wanted. Ray's request is the cluster's standing demand,
  not an increment: the autoscaler keeps enough nodes for every bundle at once, counting
  each node's total (what runs on it does not matter), and each call replaces the previous
  one, whoever made it. So raylog asks for the total number of ``raylog`` nodes it wants and
  clears the request (no bundles) once they have joined or its time is up, which lets the
  autoscaler give back nodes raylog no longer uses (a decommissioned broker's). A request
  another program of the same Ray cluster made is replaced while raylog's stands.

Both run in the controller's process (joined to Ray) and block on the GCS: call them from a
thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import json
import logging
import re
import time

import ray

log = logging.getLogger(__name__)

RAYLOG_RESOURCE = "raylog"
V1_STATUS_FRESH_S = 60.0  # the v1 monitor writes its status every update (5 s by default)
# Without an autoscaling config, Ray's v1 monitor runs a read-only autoscaler (it launches
# nothing) whose node types are "node_" and each node's id.
_READONLY_TYPE = re.compile(r"node_[0-9a-f]{56}")


def autoscaler_kind() -> str | None:
    """See the module docstring; None also when the GCS cannot be asked (logged)."""
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import internal_kv_get_gcs_client

        gcs = internal_kv_get_gcs_client()
        v2 = gcs.internal_kv_get(
            ray._raylet.GCS_AUTOSCALER_V2_ENABLED_KEY.encode(),
            namespace=ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode(),
        )
        status = gcs.internal_kv_get(
            ray_constants.DEBUG_AUTOSCALING_STATUS.encode(), namespace=None
        )
    except Exception as exc:  # Ray's private API moved, or the GCS did not answer
        log.warning("cannot tell whether Ray's autoscaler runs: %s", exc)
        return None
    return kind_from(v2, status, time.time())


def kind_from(v2_key: bytes | None, v1_status: bytes | None, now: float) -> str | None:
    """:func:`autoscaler_kind` from what the GCS holds: the v2 key, the v1 monitor's status."""
    if v2_key == b"1":
        return "v2"
    if not v1_status:
        return None
    try:
        report = json.loads(v1_status)
        written = float(report.get("time", 0))
        types = _node_types(report.get("autoscaler_report") or {})
    except (ValueError, TypeError, AttributeError):
        return None
    if not types or all(_READONLY_TYPE.fullmatch(t) for t in types):
        return None  # no autoscaler, or the read-only one of a cluster without a config
    return "v1" if now - written <= V1_STATUS_FRESH_S else None


def _node_types(report: dict[str, object]) -> set[str]:
    """The node types a v1 autoscaler report names (its active nodes' and its mapping's)."""
    active = report.get("active_nodes") or {}
    mapping = report.get("node_type_mapping") or {}
    if not isinstance(active, dict) or not isinstance(mapping, dict):
        return set()
    return {str(t) for t in active} | {str(t) for t in mapping.values()}


def request_raylog_nodes(total: int) -> None:
    """Ask Ray's autoscaler for ``total`` nodes with the ``raylog`` resource in all (0: clear
    the request). See the module docstring for what Ray does with it."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[{RAYLOG_RESOURCE: 1}] * max(0, total))
