"""Replication channels: replica-to-replica messages over direct sockets instead of Ray calls.

This module is the channel's public surface; the parts live beside it:

- ``frames``: the wire format (``u32 length, u8 kind, msgpack body``), the message kinds and
  the sans-IO :class:`FrameParser`;
- ``connection``: one connection's asyncio protocol and its bounded outgoing queue;
- ``auth``: the HMAC handshake on the cluster secret, same-host Unix sockets, ``SO_PEERCRED``
  and the kernel's boot id;
- ``server``: :class:`ChannelServer`, the receiving end of a replica;
- ``links``: :class:`PeerLink` (one-way replication messages) and :class:`CallLink` (the
  gateway's request/response calls), the sending ends.

Why: a Ray actor call costs far more CPU on each side than a framed message on an open socket,
and replicating one batch to two followers takes five of them (the produce, two pushes, two
acks). Ray stays the control plane (creating actors, controller commands, finding a peer's
address); the channel carries the four replication messages (``FetchRequest``,
``FetchResponse``, ``ReplicateRequest``, ``ReplicateAck``) and the gateway's calls.

The channel keeps the one-way, lossy contract the state machine assumes (it resends what
matters after timeouts): a message to a peer without a connection yet goes by a Ray call while
the connection is made in the background, and a broken connection drops what was queued on it.
TCP keeps each link's messages in order.

Each connection's outgoing frames wait in a bounded queue written by one task that lets the
socket drain between frames: a one-way message finding the queue full is dropped, a gateway
call waits for room, and a server with too many replies queued stops reading calls until its
peer takes them. Frames are encoded in place after their header, and a large one is received
straight into a buffer of its own, so a megabyte batch is copied once on each side.

Security: each link is authenticated by the HMAC handshake before any message (``auth``).
Under that, when the ends have certificates from the cluster's CA (``storage/pki.py``; the
controller issues them), the connection is mutual TLS 1.3 and a peer without such a certificate
never completes the TLS handshake. Same-host links (a broker's gateway and its own replicas,
always; replicas of one topic on one machine) use a Unix socket without TLS: it never leaves
the kernel, and skipping TLS and the TCP stack makes the local hop several times cheaper.
``RAYLOG_CHANNEL_LOCAL_SOCKETS=0`` in the cluster's environment turns them off (every link then
TCP, with TLS when configured).
"""

from __future__ import annotations

from raylog.actors.transport.auth import (
    LOCAL_SOCKETS_ENV,
    ChannelAddress,
    channel_secret,
    local_sockets_enabled,
)
from raylog.actors.transport.connection import WritableProtocol
from raylog.actors.transport.frames import (
    CHANNEL_KINDS,
    FRAME_BYTES_MAX,
    Buffer,
    CallReply,
    CallRequest,
    FrameError,
    FrameParser,
    encode_frame,
    is_channel_message,
)
from raylog.actors.transport.links import CallFailed, CallLink, PeerLink
from raylog.actors.transport.server import ChannelServer

__all__ = [
    "CHANNEL_KINDS",
    "FRAME_BYTES_MAX",
    "LOCAL_SOCKETS_ENV",
    "Buffer",
    "CallFailed",
    "CallLink",
    "CallReply",
    "CallRequest",
    "ChannelAddress",
    "ChannelServer",
    "FrameError",
    "FrameParser",
    "PeerLink",
    "WritableProtocol",
    "channel_secret",
    "encode_frame",
    "is_channel_message",
    "local_sockets_enabled",
]
