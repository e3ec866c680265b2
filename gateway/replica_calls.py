"""How one call from a gateway reaches a replica actor on its broker: channel, arena or Ray.

This module owns the three ways a gateway calls this broker's replica actors, and choosing
between them per call:

1. The replica's channel (``actors/transport/channel.py``): one framed TCP (or TLS, once the
   gateway has its certificate) link per replica, whose calls the replica starts in arrival
   order. Used for the data calls (:data:`CHANNEL_RESULTS`) once the link is connected, and only
   while no Ray call to that replica is outstanding, so that a partition's calls never overtake
   each other while switching paths.
2. Produce by reference (``actors/transport/arena.py``): the server receives large requests
   into shared memory; a replica on a same-host link that could open that memory is handed each
   batch's place in it instead of its bytes. The first batch from an arena to a replica goes as
   it is while the replica is asked to open it.
3. A Ray call on the replica's actor handle: the path before the channel is connected, when it
   is down, and for every call that has no channel form. Handles are cached by name and looked
   up again when a call fails with RayActorError (a dead or restarting actor). Every call is
   awaited as an asyncio future, never with a blocking ``ray.get``.

A call that produced no outcome raises :class:`NoOutcome` carrying the Kafka error the client
gets. A produce that failed that way is not retried here: whether it was appended is unknown, so
the client decides (it gets 6, refreshes metadata and retries). Reads are retried once, on a
fresh handle.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Callable
from typing import Any

import msgspec
import ray
from ray.exceptions import RayActorError, RayTaskError

from raylog.actors.calls import NAMESPACE, FetchOutcome, MirrorOutcome, ProduceOutcome
from raylog.actors.transport import arena
from raylog.actors.transport.arena import ArenaPool, ArenaRef, Block
from raylog.actors.transport.channel import CallFailed, CallLink, ChannelAddress, channel_secret
from raylog.gateway.errors import ErrorCode
from raylog.storage import pki
from raylog.storage.pki import LeafCertificate

__all__ = ["CHANNEL_RESULTS", "LOOKUP_TIMEOUT_S", "NoOutcome", "ReplicaCalls"]

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 10.0  # ray.get_actor, run in a thread: a GCS round trip
# Replica methods called over the replica's channel once it is connected, and their results.
CHANNEL_RESULTS: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "produce": msgspec.msgpack.Decoder(ProduceOutcome),
    "produce_shared": msgspec.msgpack.Decoder(ProduceOutcome),
    "open_arena": msgspec.msgpack.Decoder(bool),
    "fetch": msgspec.msgpack.Decoder(FetchOutcome),
    "fetch_extents": msgspec.msgpack.Decoder(FetchOutcome),
    "list_offsets": msgspec.msgpack.Decoder(tuple[int, int, int, int]),
    "write_txn_marker": msgspec.msgpack.Decoder(ProduceOutcome),
    "mirror_append": msgspec.msgpack.Decoder(MirrorOutcome),
}


class NoOutcome(Exception):
    """A replica call that produced no outcome; ``error_code`` is what the client gets.

    NOT_LEADER_OR_FOLLOWER (6) when the actor could not be reached (missing, dead, restarting):
    clients refresh metadata and retry. UNKNOWN_SERVER_ERROR (-1) when the replica raised (a bug
    there, logged here): the gateway answers rather than dropping the client's connection.
    """

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class ReplicaCalls:
    """Calls to the replica actors named ``replica_actor_name(...)`` in ``namespace``."""

    def __init__(self, *, namespace: str = NAMESPACE, use_channels: bool = True) -> None:
        self._namespace = namespace
        self._handles: dict[str, Any] = {}
        # ``_ray_in_flight`` counts Ray calls per replica: the channel is used only when none
        # is outstanding (path 1 of the module docstring).
        self._use_channels = use_channels
        self._channel_secret = channel_secret() if use_channels else b""
        self._links: dict[str, CallLink] = {}
        self._ray_in_flight: dict[str, int] = {}
        self._channel_tls: ssl.SSLContext | None = None
        # One lookup at a time: callers queue FIFO on it, so calls for one partition are still
        # submitted in the order they arrived (see produce's ordering in handlers/produce.py).
        self._lookup_lock = asyncio.Lock()
        # Path 2. Per (replica, arena): True once it opened it, False if it could not, None
        # while asking.
        self.arenas = ArenaPool() if use_channels and arena.enabled() else None
        self._arena_open: dict[tuple[str, ArenaRef], bool | None] = {}

    async def call(
        self,
        name: str,
        method: str,
        args: tuple[Any, ...],
        *,
        timeout_s: float,
        retry: bool,
        on_sent: Callable[[], None] | None = None,
    ) -> Any:
        """Call ``method`` on the replica actor ``name``; bounded by ``timeout_s``.

        ``on_sent`` is called when the call went onto the replica's channel: one TCP stream,
        whose calls the replica starts in arrival order, so a later call cannot overtake it.
        A Ray call gives no such promise (an argument in the object store may arrive later
        than a later call's), so on that path the caller learns nothing before the outcome.
        Raises NoOutcome when there is no outcome, TimeoutError past the bound.
        """
        attempts = 2 if retry else 1
        async with asyncio.timeout(timeout_s):
            if method in CHANNEL_RESULTS and self._use_channels:
                done, result = await self._channel_call(
                    name, method, args, retry=retry, on_sent=on_sent
                )
                if done:
                    return result
            # Ray pickles its arguments, and a memoryview does not pickle: bytes of it.
            args = tuple(bytes(a) if isinstance(a, memoryview) else a for a in args)
            for attempt in range(1, attempts + 1):
                # Invariant: with a cached handle nothing is awaited before .remote(), so calls
                # are submitted in the order this coroutine was entered.
                handle = self._handles.get(name)
                if handle is None:
                    handle = await self._lookup(name)
                self._ray_in_flight[name] = self._ray_in_flight.get(name, 0) + 1
                try:
                    return await getattr(handle, method).remote(*args)
                except RayActorError as exc:
                    # Dead or restarting: the name may point at a new incarnation next time.
                    if self._handles.get(name) is handle:
                        del self._handles[name]
                    if attempt == attempts:
                        raise NoOutcome(
                            ErrorCode.NOT_LEADER_OR_FOLLOWER, f"replica {name}: {exc!r}"
                        ) from exc
                except RayTaskError as exc:
                    log.error("replica %s failed in %s: %s", name, method, exc)
                    raise NoOutcome(
                        ErrorCode.UNKNOWN_SERVER_ERROR, f"{name}.{method} failed"
                    ) from exc
                finally:
                    self._ray_in_flight[name] -= 1
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close the channels to the replicas (the gateway stops)."""
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.aclose() for link in links))

    def set_channel_tls(self, leaf: LeafCertificate) -> None:
        """Use mutual TLS with ``leaf`` (from the cluster CA) on the channels to the replicas;
        links made before are closed and remade."""
        self._channel_tls = pki.client_context(leaf)
        for link in self._links.values():
            link.close()
        self._links.clear()

    async def _channel_call(
        self,
        name: str,
        method: str,
        args: tuple[Any, ...],
        *,
        retry: bool,
        on_sent: Callable[[], None] | None = None,
    ) -> tuple[bool, Any]:
        """``(True, result)`` when the call went over the replica's channel, ``(False, None)``
        when it must go by Ray (no link yet, or Ray calls to that replica outstanding)."""
        link = self._links.get(name)
        if link is None:
            link = self._links[name] = CallLink(name, self._channel_secret, self._channel_tls)
        if link.full:  # the replica is behind on this link: wait (never go round it by Ray)
            await link.wait_room()
        hold = None
        if method == "produce" and self.arenas is not None and link.local:
            method, args, hold = self._by_reference(name, link, args)
        future = link.call(method, args, hold) if not self._ray_in_flight.get(name) else None
        if future is None:
            link.ensure_connecting(lambda: self._channel_address(name))
            return False, None
        if on_sent is not None:
            on_sent()
        try:
            raw = await future
        except CallFailed as exc:
            if not exc.lost and hold is not None:
                # It opened the arena, and cannot read this batch from it: hand it batches in
                # the calls from now on; the client resends this one.
                self._arena_open[(name, hold.arena.ref)] = False
                log.warning("replica %s refused a batch by reference: %s", name, exc)
                raise NoOutcome(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(exc)) from exc
            if not exc.lost:
                log.error("replica %s failed in %s: %s", name, method, exc)
                code = ErrorCode.UNKNOWN_SERVER_ERROR
                raise NoOutcome(code, f"{name}.{method} failed") from exc
            if retry:  # a read: ask again by Ray
                return False, None
            raise NoOutcome(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(exc)) from exc
        finally:
            if future.cancelled():  # timed out here: its reply, if it comes, is dropped
                link.forget(future)
        return True, CHANNEL_RESULTS[method].decode(raw)

    def _by_reference(
        self, name: str, link: CallLink, args: tuple[Any, ...]
    ) -> tuple[str, tuple[Any, ...], Block | None]:
        """A produce call that hands the replica its batch's place in the arena, when the
        batch is in it and the replica opened it; else the call as it is. The first batch
        from an arena to a replica goes as it is while the replica is asked to open it."""
        records = args[0]
        assert self.arenas is not None
        found = self.arenas.locate(records) if isinstance(records, memoryview) else None
        if found is None:
            return "produce", args, None
        block, offset = found
        ref = block.arena.ref
        key = (name, ref)
        if key not in self._arena_open:
            probe = link.call("open_arena", ref)
            if probe is not None:
                self._arena_open[key] = None
                probe.add_done_callback(functools.partial(self._arena_opened, key))
            return "produce", args, None
        if not self._arena_open[key]:
            return "produce", args, None
        return "produce_shared", (*ref, offset, len(records), *args[1:]), block

    def _arena_opened(self, key: tuple[str, ArenaRef], probe: asyncio.Future[Any]) -> None:
        if probe.cancelled() or probe.exception() is not None:
            self._arena_open.pop(key, None)  # the link broke: ask again on the next connection
            return
        opened = CHANNEL_RESULTS["open_arena"].decode(probe.result())
        self._arena_open[key] = opened
        if not opened:
            log.info("replica %s cannot open the produce arena: batches go in calls", key[0])

    async def _channel_address(self, name: str) -> ChannelAddress:
        handle = self._handles.get(name) or await self._lookup(name)
        address = await asyncio.wait_for(handle.channel_address.remote(), LOOKUP_TIMEOUT_S)
        if address is None:
            raise LookupError(f"{name} has no channel")
        return tuple(address)  # type: ignore[return-value]

    async def _lookup(self, name: str) -> Any:
        async with self._lookup_lock:
            handle = self._handles.get(name)
            if handle is not None:
                return handle
            try:
                async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                    handle = await asyncio.to_thread(ray.get_actor, name, namespace=self._namespace)
            except ValueError as exc:  # no such actor (yet): metadata is ahead of placement
                raise NoOutcome(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER, f"no replica actor {name}"
                ) from exc
            except TimeoutError as exc:
                raise NoOutcome(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER, f"looking up {name} timed out"
                ) from exc
            self._handles[name] = handle
            return handle
