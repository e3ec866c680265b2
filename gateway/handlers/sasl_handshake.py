"""SaslHandshake (key 17), version 1: the client names its SASL mechanism; the exchange
follows in SaslAuthenticate requests (``raylog.gateway.authentication`` decides). Version 0 is
answered UNSUPPORTED_VERSION and the connection closed."""

from __future__ import annotations

import secrets
from typing import Any

from kafka.protocol.sasl import SaslHandshakeResponse

from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 17
# SCRAM's server nonce: 192 random bits, as hex. Kafka's is alphanumeric too; librdkafka 2.0
# (kcat's) fails the exchange on a server nonce with '-' or '_' (URL-safe base64).
NONCE_BYTES = 24


async def handle(context: RequestContext, request: Request) -> Any:
    authenticator = context.authenticator
    session = context.session
    if request.api_version == 0 and session is not None and session.sasl_listener:
        # v0 would carry the exchange as raw tokens outside Kafka's framing: refused, and the
        # connection closed (advertised only because librdkafka looks for it).
        session.refuse("SaslHandshake v0 (raw SASL tokens) is not supported; use v1")
        return SaslHandshakeResponse(
            error_code=ErrorCode.UNSUPPORTED_VERSION,
            mechanisms=list(authenticator.mechanisms) if authenticator else [],
        )
    if authenticator is None or session is None or not session.sasl_listener:
        return SaslHandshakeResponse(
            error_code=ErrorCode.ILLEGAL_SASL_STATE,
            mechanisms=list(authenticator.mechanisms) if authenticator else [],
        )
    outcome = session.handshake(
        request.body.mechanism, authenticator, secrets.token_hex(NONCE_BYTES)
    )
    return SaslHandshakeResponse(
        error_code=outcome.error_code, mechanisms=list(authenticator.mechanisms)
    )
