"""SaslHandshake (key 17), version 1: the client names its SASL mechanism; the exchange
follows in SaslAuthenticate requests (``raylog.gateway.authentication`` decides)."""

from __future__ import annotations

import secrets
from typing import Any

from kafka.protocol.sasl import SaslHandshakeResponse

from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 17
NONCE_BYTES = 24  # SCRAM's server nonce: 192 random bits


async def handle(context: RequestContext, request: Request) -> Any:
    authenticator = context.authenticator
    session = context.session
    if authenticator is None or session is None or not session.sasl_listener:
        return SaslHandshakeResponse(
            error_code=ErrorCode.ILLEGAL_SASL_STATE,
            mechanisms=list(authenticator.mechanisms) if authenticator else [],
        )
    outcome = session.handshake(
        request.body.mechanism, authenticator, secrets.token_urlsafe(NONCE_BYTES)
    )
    return SaslHandshakeResponse(
        error_code=outcome.error_code, mechanisms=list(authenticator.mechanisms)
    )
