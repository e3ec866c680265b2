"""ElectLeaders (key 43), versions 0-1: preferred or unclean elections by the controller.

Versions: v0 elects preferred leaders only, v1 adds ``election_type`` (0 preferred, 1 unclean)
and a top-level error code; v2+ are flexible versions, which the gateway does not speak outside
ApiVersions. librdkafka and kafka-python pick the highest version both sides know, so 0-1.

The decisions are ``election.elect_leaders``' (run by the controller): per partition 0 when a
new leader was elected, ELECTION_NOT_NEEDED (84), PREFERRED_LEADER_NOT_AVAILABLE (80),
ELIGIBLE_LEADERS_NOT_AVAILABLE (83) or UNKNOWN_TOPIC_OR_PARTITION (3). A null partition list
means every partition, and then, as Kafka does, partitions whose election was not needed are
left out of the answer. An unknown election type is INVALID_REQUEST (42) for the request.

Authorization: ALTER on the cluster, else CLUSTER_AUTHORIZATION_FAILED (31) for the request and
every partition asked for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any, cast

from kafka.protocol.admin import ElectLeadersResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import AdminBackend, AdminResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request

API_KEY = 43

ELECTION_TYPES = {0: "preferred", 1: "unclean"}

_Topic = ElectLeadersResponse.ReplicaElectionResult
_Partition = _Topic.PartitionResult


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(AdminBackend, context.backend)
    if not context.authorized_cluster(AclOperation.ALTER):
        # Kafka's answer: the top-level error, and on every partition asked for.
        denied = AdminResult(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED)
        return _answer(
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            {(t.topic, p): denied for t in body.topic_partitions or () for p in t.partitions},
        )
    election_type = ELECTION_TYPES.get(getattr(body, "election_type", 0))
    if election_type is None:
        return ElectLeadersResponse(
            throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST, replica_election_results=[]
        )
    wanted = None
    if body.topic_partitions is not None:
        wanted = list(
            dict.fromkeys((t.topic, p) for t in body.topic_partitions for p in t.partitions)
        )
    results = await backend.elect_leaders(election_type, wanted)
    if wanted is None:
        results = {
            tp: r for tp, r in results.items() if r.error_code != ErrorCode.ELECTION_NOT_NEEDED
        }
    else:
        missing = AdminResult(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer from the controller")
        results = {tp: results.get(tp, missing) for tp in wanted}
    return _answer(ErrorCode.NONE, results)


def _answer(error_code: int, results: Mapping[tuple[str, int], AdminResult]) -> Any:
    by_topic: dict[str, list[Any]] = defaultdict(list)
    for (topic, partition), r in results.items():
        by_topic[topic].append(
            _Partition(
                partition_id=partition, error_code=r.error_code, error_message=r.message or None
            )
        )
    return ElectLeadersResponse(
        throttle_time_ms=0,
        error_code=error_code,
        replica_election_results=[
            _Topic(topic=topic, partition_result=parts) for topic, parts in by_topic.items()
        ],
    )
