"""AlterUserScramCredentials (key 51), version 0 (KIP-554): create, replace and delete SCRAM
credentials.

The client salts the password (the request carries the salt, the iterations and the salted
password), so no password reaches raylog; the controller derives and stores the keys only. The
answer is one result per user named, as Kafka's controller gives it
(``metadata.alter_scram_credentials``): a user named twice in a request is DUPLICATE_RESOURCE
(92), an unknown mechanism type UNSUPPORTED_SASL_MECHANISM (33), an empty user name or iterations
outside [4096, 16384] UNACCEPTABLE_CREDENTIAL (93), deleting a credential that does not exist
RESOURCE_NOT_FOUND (91); the other users' changes are made. When the controller cannot be asked,
every user gets its code.

Authorization: ALTER on the cluster, else CLUSTER_AUTHORIZATION_FAILED (31) for every user.
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.admin import AlterUserScramCredentialsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import AdminBackend
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.handlers.describe_user_scram_credentials import MECHANISM_TYPES
from raylog.gateway.protocol import Request

API_KEY = 51

_Result = AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult


def _mechanism(mechanism_type: int) -> str:
    # A type Kafka does not know becomes a name no SCRAM mechanism has: the controller answers
    # UNSUPPORTED_SASL_MECHANISM for that user.
    return MECHANISM_TYPES.get(mechanism_type, f"mechanism type {mechanism_type}")


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(AdminBackend, context.backend)
    deletions = [(d.name, _mechanism(d.mechanism)) for d in body.deletions]
    upsertions = [
        (u.name, _mechanism(u.mechanism), u.iterations, bytes(u.salt), bytes(u.salted_password))
        for u in body.upsertions
    ]
    if context.authorized_cluster(AclOperation.ALTER):
        results = await backend.alter_scram_credentials(upsertions, deletions)
    else:  # Kafka's answer: every user named gets the code
        named = dict.fromkeys(change[0] for change in (*deletions, *upsertions))
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        results = [(user, code, AUTHORIZATION_FAILED) for user in named]
    return AlterUserScramCredentialsResponse(
        throttle_time_ms=0,
        results=[
            _Result(user=user, error_code=code, error_message=message or None)
            for user, code, message in results
        ],
    )
