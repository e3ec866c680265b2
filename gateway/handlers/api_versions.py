"""ApiVersions (key 18): the handshake every client opens with.

Supported versions (0-2 today) are answered with the advertised table. An unsupported version
(clients open with their newest: kafka-python v4, librdkafka v3) is answered exactly as Kafka does,
so that the client retries with a version we know: response header v0, then a v0 body holding
UNSUPPORTED_VERSION (35) and an array with only ApiVersions' own range. The connection layer has
already arranged for that response to be encoded as v0 (``request.response_version == 0``).
The connection is never closed here: librdkafka falls back to a 0.10 feature set if it is.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import ApiVersionsResponse

from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 18

_ApiVersion = ApiVersionsResponse.ApiVersion


async def handle(context: RequestContext, request: Request) -> Any:
    if request.body is None:
        low, high = context.api_versions[API_KEY]
        return ApiVersionsResponse(
            error_code=ErrorCode.UNSUPPORTED_VERSION,
            api_keys=[_ApiVersion(api_key=API_KEY, min_version=low, max_version=high)],
            throttle_time_ms=0,
        )
    return ApiVersionsResponse(
        error_code=ErrorCode.NONE,
        api_keys=[
            _ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in sorted(context.api_versions.items())
        ],
        throttle_time_ms=0,
    )
