"""Who may talk on a channel: the cluster secret's handshake, and same-host Unix sockets.

Each link is authenticated before any message: the server sends a random nonce, the client
answers with the name of the replica it wants and HMAC-SHA256(cluster secret, nonce + name);
the server closes the connection unless both match, so a stale address reused by another
replica, or a process without the secret, never gets a message in. The secret is the cluster's
Ray auth token (every process of the cluster has it).

A server also listens on a Unix socket in Linux's abstract namespace and names it in its
address with the kernel's boot id (:data:`ChannelAddress`), so a peer on another machine never
tries it. Both ends check with ``SO_PEERCRED`` that the other runs as their own user, and the
HMAC handshake runs there as on TCP. ``RAYLOG_CHANNEL_LOCAL_SOCKETS=0`` in the cluster's
environment turns same-host sockets off.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import os
import socket
import struct
import sys
from pathlib import Path

from raylog.actors.transport.connection import Connection, WritableProtocol

log = logging.getLogger(__name__)

NONCE_BYTES = 16
HANDSHAKE_NAME_BYTES_MAX = 512
HANDSHAKE_TIMEOUT_S = 5.0
_MAC_CONTEXT = b"raylog-replication-channel-v1"
LOCAL_SOCKETS_ENV = "RAYLOG_CHANNEL_LOCAL_SOCKETS"  # "0": same-host links over TCP too
LOCAL_SEND_BUFFER_BYTES = 4 << 20
_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

# Where a channel server listens: (host, port, local), ``local`` naming its same-host Unix
# socket as "<boot id>/<abstract name>", or "" when it has none.
ChannelAddress = tuple[str, int, str]


def channel_secret() -> bytes:
    """The cluster's shared secret: its Ray auth token (empty when the cluster has none)."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        with contextlib.suppress(OSError):
            return Path(path).read_bytes().strip()
    return os.environ.get("RAY_AUTH_TOKEN", "").encode()


def _mac(secret: bytes, nonce: bytes, name: bytes) -> bytes:
    return hmac.new(secret, _MAC_CONTEXT + nonce + name, hashlib.sha256).digest()


async def client_handshake(conn: Connection, peer_name: str, secret: bytes) -> None:
    """The client's half: read the server's nonce, answer with the replica's name and the MAC."""
    nonce = await conn.readexactly(NONCE_BYTES)
    name = peer_name.encode()
    conn.write(struct.pack(">H", len(name)) + name + _mac(secret, nonce, name))
    await conn.drain()


async def server_handshake(conn: Connection, server_name: str, secret: bytes) -> bool:
    """The server's half: send a nonce; whether the client asked for ``server_name`` with the
    right MAC (within ``HANDSHAKE_TIMEOUT_S``)."""
    nonce = os.urandom(NONCE_BYTES)
    conn.write(nonce)
    await conn.drain()
    async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
        (name_len,) = struct.unpack(">H", await conn.readexactly(2))
        if name_len > HANDSHAKE_NAME_BYTES_MAX:
            return False
        name = await conn.readexactly(name_len)
        mac = await conn.readexactly(hashlib.sha256().digest_size)
    if name != server_name.encode():
        log.warning("replication channel: a peer asked %s for %r", server_name, name[:80])
        return False
    if not hmac.compare_digest(mac, _mac(secret, nonce, name)):
        log.warning("replication channel to %s: a peer failed authentication", server_name)
        return False
    return True


@functools.cache
def boot_id() -> str:
    """This kernel's boot id: which machine (and boot) a same-host socket belongs to."""
    if not sys.platform.startswith("linux"):
        return ""
    try:
        return _BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""


def local_sockets_enabled() -> bool:
    """Same-host links over Unix sockets: on Linux, unless the environment turns them off."""
    return os.environ.get(LOCAL_SOCKETS_ENV, "1") != "0" and bool(boot_id())


def widen_send_buffer(conn: WritableProtocol) -> None:
    """Let one send move a large frame: a Unix socket's default send buffer (about 200 KiB)
    cuts each megabyte frame into several event-loop rounds; TCP on loopback grows its own."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):  # capped by net.core.wmem_max; best effort
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LOCAL_SEND_BUFFER_BYTES)


def same_user(conn: WritableProtocol) -> bool:
    """Whether the process at the other end of a Unix socket runs as this process's user (the
    kernel's word, ``SO_PEERCRED``)."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is None:
        return False
    try:
        _, uid, _ = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
    except OSError:
        return False
    return uid == os.getuid()


async def connect_local(local: str) -> Connection | None:
    """A connection to the same-host socket ``local`` ("<boot id>/<name>"), or None when it is
    on another machine, turned off, gone, or served by another user (then TCP is used)."""
    peer_boot_id, _, name = local.partition("/")
    if not name or peer_boot_id != boot_id() or not local_sockets_enabled():
        return None
    try:
        _, conn = await asyncio.get_running_loop().create_unix_connection(Connection, "\0" + name)
    except OSError as exc:
        log.debug("same-host channel socket %s: %r; using TCP", name, exc)
        return None
    if not same_user(conn):
        log.warning("same-host channel socket %s is served by another user; using TCP", name)
        conn.close()
        return None
    widen_send_buffer(conn)
    conn.local = True
    return conn
