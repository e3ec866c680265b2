"""DescribeUserScramCredentials (key 50), version 0 (KIP-554): each SCRAM user's mechanisms and
iterations, never a salt or a key.

As Kafka answers it: a null or empty user list asks for every user; a user without credentials
is RESOURCE_NOT_FOUND (91) and a user named twice DUPLICATE_RESOURCE (92), each in that user's
result (``metadata.describe_scram_credentials``, run by the controller). The top-level error is
for the request as a whole: the controller could not be asked (its code, with a message).
Mechanisms cross the wire as Kafka's ScramMechanism types (1: SCRAM-SHA-256, 2: SCRAM-SHA-512).

Authorization: DESCRIBE on the cluster, else CLUSTER_AUTHORIZATION_FAILED (31).
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.admin import DescribeUserScramCredentialsResponse

from raylog.actors.control.acls import AclOperation
from raylog.actors.control.scram import SCRAM_SHA_256, SCRAM_SHA_512
from raylog.gateway.backend import AdminBackend
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request

API_KEY = 50

# Kafka's org.apache.kafka.clients.admin.ScramMechanism types (0 is UNKNOWN).
MECHANISM_TYPES = {1: SCRAM_SHA_256, 2: SCRAM_SHA_512}
MECHANISM_TYPE_OF = {name: t for t, name in MECHANISM_TYPES.items()}

_Result = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult
_Info = _Result.CredentialInfo


async def handle(context: RequestContext, request: Request) -> Any:
    backend = cast(AdminBackend, context.backend)
    users = request.body.users
    if not context.authorized_cluster(AclOperation.DESCRIBE):
        return DescribeUserScramCredentialsResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            error_message=AUTHORIZATION_FAILED,
            results=[],
        )
    wanted = None if users is None else [u.name for u in users]
    error, found = await backend.describe_scram_credentials(wanted)
    return DescribeUserScramCredentialsResponse(
        throttle_time_ms=0,
        error_code=error.error_code,
        error_message=error.message or None,
        results=[
            _Result(
                user=d.user,
                error_code=d.error_code,
                error_message=d.message or None,
                credential_infos=[
                    _Info(mechanism=MECHANISM_TYPE_OF[m], iterations=i) for m, i in d.credentials
                ],
            )
            for d in found
        ],
    )
