"""SaslAuthenticate (key 36), versions 0-2: one message of the SASL exchange the handshake chose.

A failure is answered SASL_AUTHENTICATION_FAILED with a message naming no secret; the server
closes the connection once that answer is sent (after the failure delay), and logs one line
with the user named and the client's address. PLAIN derives a key per credential (PBKDF2), so
its step runs in a thread rather than on the event loop. No re-authentication (KIP-368):
``session_lifetime_ms`` is 0.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.sasl import SaslAuthenticateResponse

from raylog.gateway import sasl
from raylog.gateway.authentication import Outcome
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 36


async def handle(context: RequestContext, request: Request) -> Any:
    session = context.session
    if session is None:
        outcome = Outcome(ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate without a session")
    elif session.mechanism == sasl.PLAIN:
        outcome = await asyncio.to_thread(session.authenticate, bytes(request.body.auth_bytes))
    else:
        outcome = session.authenticate(bytes(request.body.auth_bytes))
    return SaslAuthenticateResponse(
        error_code=outcome.error_code,
        error_message=outcome.message,
        auth_bytes=outcome.auth_bytes,
        session_lifetime_ms=0,
    )
