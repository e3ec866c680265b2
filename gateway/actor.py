"""GatewayActor: one broker's Kafka listener, run as a Ray actor next to its BrokerActor.

Owns the listener's lifetime and keeping its routing metadata fresh. The actor runs a
:class:`~raylog.gateway.server.GatewayServer` with a
:class:`~raylog.gateway.replica_backend.ReplicaBackend` inside its own event loop, and polls the
active controller's ``metadata()`` every ``poll_ms`` to refresh the backend's
:class:`~raylog.gateway.routing.MetadataView` (brokers and partitions as clients see
them; a leaderless partition has leader -1). The listeners are bound at ``start`` but accept
connections only once that view is current: read from the active controller, whose metadata is
the stored one (Kafka's brokers likewise take requests only once their metadata caught up). A
client reaching a starting broker is refused and tries another broker or again, as with a
broker that is down; it is never told that an existing topic does not exist, which clients
take as final (librdkafka fails every queued record of such a topic).

The same controller handle serves the gateway's admin requests (``active_controller``), and
``broker_configs`` (``config_keys.BROKER_CONFIGS`` keys, e.g. ``auto.create.topics.enable``,
``num.partitions``) decide what the gateway does on its own: topic auto-creation from Metadata
and the defaults of CreateTopics' -1 counts. Whoever starts the gateways passes them the same
broker configs it passes the controllers.

Listeners (``raylog.actors.control.listeners``): one socket per listener. A gateway with TLS or
SASL listeners asks the active controller before it listens (bounded) for what they need: its
TLS certificate from the cluster CA with the advertised names (unless ``ssl.keystore.location``
names one; either is reloaded in place, ``TLS_REFRESH_S``) and the key that masks unknown SCRAM
users. SCRAM credentials come with each metadata refresh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from raylog.actors import logs
from raylog.actors.calls import (
    NAMESPACE,
    MirrorOutcome,
    gateway_actor_name,
    ray_call,
    replica_actor_name,
)
from raylog.actors.control import config_keys
from raylog.actors.control import metadata as md_
from raylog.actors.control.listeners import Listener
from raylog.actors.control.principal_mapping import PrincipalMapper
from raylog.gateway import routing, sasl
from raylog.gateway.authentication import Authenticator
from raylog.gateway.authorization import Authorization
from raylog.gateway.backend import AdminBackend, Broker, PartitionState, TopicState
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import OFFSETS_TOPIC, GroupCoordinator
from raylog.gateway.links.groups import LinkGroups
from raylog.gateway.links.mirrors import LinkMirrors
from raylog.gateway.quotas import ClientQuotas
from raylog.gateway.replica_backend import ReplicaBackend
from raylog.gateway.replica_calls import NoOutcome
from raylog.gateway.request_stats import RequestStats
from raylog.gateway.routing import MetadataView
from raylog.gateway.server import GatewayServer, ListenerSocket
from raylog.gateway.transactions.coordinator import (
    TRANSACTION_STATE_TOPIC,
    TransactionCoordinator,
)
from raylog.storage import pki
from raylog.storage.errors import RaylogError

log = logging.getLogger(__name__)

POLL_MS_DEFAULT = 200
CALL_TIMEOUT_MS = 2_000  # bound on one status()/metadata() call to a controller
CREATE_TIMEOUT_MS = 30_000  # bound on creating __consumer_offsets through the controller
LOOKUP_TIMEOUT_S = 5.0  # bound on ray.get_actor (a GCS round trip, run in a thread)
SECURITY_SETUP_TIMEOUT_S = 60.0  # a controller answers what TLS / SASL listeners need
TLS_REFRESH_S = 60.0  # how often the listeners' certificate is checked for renewal
MIRROR_APPEND_TIMEOUT_MS = 30_000  # bound on one mirrored append to the local leader replica
LATEST_OFFSET = -1  # ListOffsets' "latest": the high watermark (read_uncommitted)


# Topics Metadata marks is_internal: the group and transaction coordinators'.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


class GatewayStartError(Exception):
    """The listener could not be opened (e.g. the port is in use); the message says why."""


async def _set_topic_configs(backend: AdminBackend, name: str, configs: Mapping[str, str]) -> None:
    """Set ``configs`` among the topic's overrides, the others kept (DescribeConfigs, then
    AlterConfigs, as an admin client does); nothing is written when they are set already."""
    current = await backend.topic_configs(name)
    if current.error_code:
        raise RaylogError(f"configs of {name}: error {current.error_code} {current.message}")
    wanted = {**current.overrides, **configs}
    if wanted == dict(current.overrides):
        return
    done = await backend.alter_topic_configs(name, wanted, validate_only=False)
    if done.error_code:
        raise RaylogError(f"altering {name}: error {done.error_code} {done.message}")
    log.info("%s: configs %s set", name, ", ".join(f"{k}={v}" for k, v in configs.items()))


def client_view(md: md_.ClusterMetadata) -> tuple[list[Broker], dict[str, TopicState]]:
    """ClusterMetadata as Kafka's Metadata response shows it: live brokers and partitions.

    A broker is live unless fenced; replicas on brokers that are not live are offline, and so
    are those whose log failed.
    """
    live = {b: r for b, r in md.brokers.items() if r.state != "fenced"}
    brokers = [
        Broker(
            r.broker_id,
            r.host,
            r.port,
            r.rack,
            tuple((e.name, e.host, e.port) for e in r.endpoints),
        )
        for _, r in sorted(live.items())
    ]
    topics = {
        name: TopicState(
            name,
            [
                PartitionState(
                    p.partition,
                    p.leader,  # NO_LEADER (-1) when leaderless
                    p.leader_epoch,
                    list(p.replicas),
                    list(p.isr),
                    [r for r in p.replicas if r not in live or r in p.offline_replicas],
                )
                for p in t.partitions
            ],
            internal=name in INTERNAL_TOPICS,
        )
        for name, t in md.topics.items()
    }
    return brokers, topics


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1000, enable_task_events=False)
class GatewayActor:
    """The Kafka listener of broker ``broker_id`` on ``host:port``."""

    def __init__(
        self,
        broker_id: int,
        cluster_id: str,
        *,
        host: str = "127.0.0.1",
        port: int = 9092,
        controller_names: tuple[str, ...] = (),
        poll_ms: int = POLL_MS_DEFAULT,
        broker_configs: dict[str, str] | None = None,
        listeners: tuple[Listener, ...] = (),
    ) -> None:
        logs.configure()  # timestamped lines in this worker's log
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.host = host
        self.port = port
        self._controller_names = tuple(controller_names)
        self._poll_ms = max(10, poll_ms)
        self._view: MetadataView | None = None
        self._server: GatewayServer | None = None
        self._backend: ReplicaBackend | None = None
        self._has_certificate = False
        self._poller: asyncio.Task[None] | None = None
        self._controller: Any = None  # handle of the controller last found active
        self._metadata_epoch = -1
        self._groups: GroupCoordinator | None = None
        self._transactions: TransactionCoordinator | None = None
        self._peer_gateways: dict[int, Any] = {}  # other brokers' gateway actors, by broker id
        self._broker_configs = dict(broker_configs or {})
        self._config = config_keys.broker_config(self._broker_configs)
        # No listeners given: one PLAINTEXT listener on host:port.
        self._listeners = tuple(listeners) or (
            Listener("PLAINTEXT", "PLAINTEXT", host, port, host, port),
        )
        self._credentials: dict[str, tuple[md_.ScramCredentialRecord, ...]] = {}
        self._tls: dict[str, pki.ReloadingContext] = {}  # by ssl.client.auth mode
        self._tls_checked_s = 0.0
        self._authorization = Authorization.from_broker_configs(self._broker_configs)
        self._mirrors: LinkMirrors | None = None  # the link fetchers (gateway/links)
        self._link_groups: LinkGroups | None = None  # the links' group-offset sync

    async def start(self) -> int:
        """Open the listeners and start polling metadata; returns the first listener's bound
        port. Idempotent."""
        if self._server is not None:
            return self.port
        view = MetadataView(self.broker_id, self.cluster_id)
        backend = ReplicaBackend(view, controller=self, broker_configs=self._broker_configs)
        self._backend = backend
        groups = self._group_coordinator(backend)
        transactions = self._transaction_coordinator(backend)
        config = config_keys.broker_config(self._broker_configs)
        server = GatewayServer(
            backend,
            groups=groups,
            transactions=transactions,
            authenticator=await self._authenticator(),
            authorization=self._authorization,
            quotas=ClientQuotas(config.quota_window_num, config.quota_window_size_seconds),
        )
        ports = []
        for listener in self._listeners:
            try:
                listening = await self._listener_socket(listener)
                # Bound now (a port in use fails here); serving once the view is current.
                ports.append(
                    await server.start(listener.host, listener.port, listening, serve=False)
                )
            except OSError as exc:
                await server.stop()
                raise GatewayStartError(
                    f"gateway of broker {self.broker_id} cannot listen on {listener.describe()} "
                    f"({listener.host}:{listener.port}): {exc.strerror or exc}"
                ) from None
        self.port = ports[0]
        self._view, self._server = view, server
        self._poller = asyncio.get_running_loop().create_task(self._poll_loop())
        self._groups, self._transactions = groups, transactions
        self._mirrors = LinkMirrors(self.broker_id, self._mirror_append, self._report_mirrors)
        self._link_groups = LinkGroups(
            self.broker_id, groups, self._high_watermark, self._report_link_groups
        )
        groups.start()
        transactions.start()
        return self.port

    # --- listener security ------------------------------------------------------------------

    async def _authenticator(self) -> Authenticator | None:
        """SASL settings when a listener runs SASL: the enabled mechanisms, the credentials of
        the latest metadata, and the cluster's mask key (asked of the controller)."""
        if not any(listener.sasl for listener in self._listeners):
            return None
        mask_key = await self._ask_controller("sasl_mask_key")
        return Authenticator(
            self._scram_credential,
            mask_key,
            self._config.sasl_enabled_mechanisms.split(","),
            self._config.connection_failed_authentication_delay_ms,
        )

    def _scram_credential(self, user: str, mechanism: str) -> sasl.ScramCredential | None:
        for record in self._credentials.get(user, ()):
            if record.mechanism == mechanism:
                return sasl.ScramCredential(
                    record.mechanism,
                    record.salt,
                    record.iterations,
                    record.stored_key,
                    record.server_key,
                )
        return None

    async def _listener_socket(self, listener: Listener) -> ListenerSocket:
        if not listener.tls:
            return ListenerSocket(listener.name, listener.sasl)
        config = self._config
        # As Kafka: ssl.client.auth is an SSL listener's; SASL_SSL authenticates by SASL.
        client_auth = config.ssl_client_auth if not listener.sasl else "none"
        tls = self._tls.get(client_auth)
        if tls is None:
            # One certificate for every TLS listener: the first context's, once loaded.
            first = next(iter(self._tls.values()), None)
            source = first.source if first is not None else await self._listener_certificate()
            trusted = None
            if config.ssl_truststore_location:
                trusted = await asyncio.to_thread(
                    pki.load_truststore_pem, config.ssl_truststore_location
                )
            tls = self._tls[client_auth] = pki.ReloadingContext(
                source, client_auth=client_auth, trusted_ca_pem=trusted
            )
            self._tls_checked_s = time.monotonic()
        mapper = None
        if client_auth != "none":
            mapper = PrincipalMapper.from_rules(config.ssl_principal_mapping_rules)
        return ListenerSocket(listener.name, listener.sasl, tls.context, mapper)

    async def _listener_certificate(self) -> pki.ListenerCertificate:
        """``ssl.keystore.location``'s certificate, else a leaf of the cluster CA."""
        config = self._config
        if config.ssl_keystore_location:
            return await asyncio.to_thread(
                pki.load_keystore_pem,
                config.ssl_keystore_location,
                config.ssl_key_password or None,
            )
        return await self._issue_listener_certificate()

    async def _issue_listener_certificate(self) -> pki.LeafCertificate:
        """A leaf of the cluster CA naming every advertised host (as an IP or DNS SAN)."""
        hosts = {ray.util.get_node_ip_address()}
        hosts |= {listener.advertised_host for listener in self._listeners if listener.tls}
        ips, names = [], []
        for host in sorted(hosts):
            try:
                ipaddress.ip_address(host)
                ips.append(host)
            except ValueError:
                names.append(host)
        return await self._ask_controller(  # type: ignore[no-any-return]
            "issue_certificate",
            f"gateway:{self.broker_id}",
            ips,
            names,
            pki.LISTENER_LEAF_DAYS,
        )

    async def _refresh_tls(self) -> None:
        """Renew the listeners' certificates when due (bounded: once per TLS_REFRESH_S)."""
        if not self._tls or time.monotonic() - self._tls_checked_s < TLS_REFRESH_S:
            return
        self._tls_checked_s = time.monotonic()
        first, *others = self._tls.values()
        try:
            renewed = await first.refresh(time.time(), self._issue_listener_certificate)
        except RaylogError as exc:  # a bad keystore file: the old certificate serves on
            log.warning("gateway %d: listener certificate not renewed: %s", self.broker_id, exc)
            return
        if renewed:  # the other listeners present the same new certificate
            for tls in others:
                tls.install(first.source)
            log.info("gateway %d: listener certificate renewed", self.broker_id)

    async def _ask_controller(self, method: str, *args: Any) -> Any:
        """Ask the active controller, waiting (bounded) for one to be elected."""
        deadline = time.monotonic() + SECURITY_SETUP_TIMEOUT_S
        failure: Exception = RaylogError("no active controller")
        while time.monotonic() < deadline:
            controller = await self.active_controller()
            if controller is not None:
                try:
                    return await ray_call(
                        getattr(controller, method).remote(*args), CALL_TIMEOUT_MS
                    )
                except (RaylogError, ray.exceptions.RayError) as exc:
                    failure, self._controller = exc, None
            await asyncio.sleep(0.2)
        raise GatewayStartError(
            f"gateway of broker {self.broker_id}: {method} not answered within "
            f"{SECURITY_SETUP_TIMEOUT_S:.0f} s: {failure}"
        )

    def _group_coordinator(self, backend: ReplicaBackend) -> GroupCoordinator:
        """This broker's group coordinator; it creates ``__consumer_offsets`` through the
        active controller on the first FindCoordinator, and sets configs of an existing one
        through the admin path (AlterConfigs) as any client would."""
        config = config_keys.broker_config(self._broker_configs)
        return GroupCoordinator(
            backend,
            self.broker_id,
            offsets_topic_num_partitions=config.offsets_topic_num_partitions,
            offsets_topic_replication_factor=config.offsets_topic_replication_factor,
            create_topic=self._create_internal_topic,
            configure_topic=lambda name, configs: _set_topic_configs(backend, name, configs),
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
            commit_refusals=self._commit_refusals,
        )

    def _transaction_coordinator(self, backend: ReplicaBackend) -> TransactionCoordinator:
        """This broker's transaction coordinator; it creates ``__transaction_state`` as the
        group coordinator creates ``__consumer_offsets``, and tells the group coordinator
        leading a ``__consumer_offsets`` partition of each transaction's outcome there."""
        config = config_keys.broker_config(self._broker_configs)
        return TransactionCoordinator(
            backend,
            self.broker_id,
            new_producer_id=lambda: _new_producer_id(backend),
            complete_offsets=self._complete_offsets,
            verify_remote=self._verify_remote,
            num_partitions=config.transaction_state_log_num_partitions,
            replication_factor=config.transaction_state_log_replication_factor,
            min_insync_replicas=config.transaction_state_log_min_isr,
            max_timeout_ms=config.transaction_max_timeout_ms,
            expiration_ms=config.transactional_id_expiration_ms,
            abort_interval_ms=config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            expire_interval_ms=config.transaction_remove_expired_transaction_cleanup_interval_ms,
            create_topic=self._create_internal_topic,
            configure_topic=lambda name, configs: _set_topic_configs(backend, name, configs),
        )

    async def _complete_offsets(
        self, broker_id: int, partition: int, producer_id: int, commit: bool
    ) -> None:
        """A transaction's marker is in ``__consumer_offsets`` partition ``partition``: the
        group coordinator of broker ``broker_id`` (this one or another) applies it."""
        if broker_id == self.broker_id:
            await self.complete_transaction(partition, producer_id, commit)
            return
        await self._call_gateway(broker_id, "complete_transaction", partition, producer_id, commit)

    async def _verify_remote(
        self,
        broker_id: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> int:
        """:meth:`verify_transaction` on the gateway of broker ``broker_id``."""
        args = (transactional_id, producer_id, producer_epoch, topic, partition)
        return int(await self._call_gateway(broker_id, "verify_transaction", *args))

    async def _call_gateway(self, broker_id: int, method: str, *args: Any) -> Any:
        """``method(*args)`` on the gateway actor of broker ``broker_id``; its handle is looked
        up once and again only after the actor was lost (a restarted gateway is a new actor)."""
        handle = self._peer_gateways.get(broker_id)
        if handle is None:
            handle = await asyncio.wait_for(
                asyncio.to_thread(
                    ray.get_actor, gateway_actor_name(broker_id), namespace=NAMESPACE
                ),
                LOOKUP_TIMEOUT_S,
            )
            self._peer_gateways[broker_id] = handle
        try:
            return await ray_call(getattr(handle, method).remote(*args), CALL_TIMEOUT_MS)
        except RaylogError:
            self._peer_gateways.pop(broker_id, None)
            raise

    async def verify_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> int:
        """Whether the producer's ongoing transaction holds the partition (KIP-890), asked by a
        partition leader's gateway of the transactional id's coordinator: 0 or Kafka's error."""
        if self._transactions is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return await self._transactions.verify(
            transactional_id, producer_id, producer_epoch, topic, partition
        )

    async def complete_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """The COMMIT or ABORT marker of ``producer_id`` is written to ``__consumer_offsets``
        partition ``partition``: its pending transactional offsets become committed offsets
        (commit) or vanish (abort) in the groups this broker coordinates there."""
        if self._groups is not None:
            self._groups.complete_transaction(partition, producer_id, commit)

    async def _create_internal_topic(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> None:
        controller = self._controller or await self._find_active()
        if controller is None:
            raise RaylogError("no active controller")
        await ray_call(
            controller.create_topic.remote(name, partitions, replication_factor, configs),
            CREATE_TIMEOUT_MS,
        )

    async def stop(self) -> None:
        """Stop polling and close the listener (in-flight requests drain, bounded)."""
        if self._transactions is not None:
            await self._transactions.stop()
            self._transactions = None
        if self._groups is not None:
            await self._groups.stop()
            self._groups = None
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        if self._mirrors is not None:
            await self._mirrors.aclose()
            self._mirrors = None
        if self._link_groups is not None:
            await self._link_groups.aclose()
            self._link_groups = None
        if self._server is not None:
            await self._server.stop()
            if self._backend is not None:
                await self._backend.aclose()  # its channels to the replicas
                self._backend = None
            self._server = None

    async def wait_forever(self) -> None:
        """Never returns: the supervisor keeps one such call on every gateway, and its failure
        is the gateway's death (Ray has no push notification of an actor's death)."""
        await asyncio.Event().wait()

    async def status(self) -> dict[str, Any]:
        view = self._view
        return {
            "broker_id": self.broker_id,
            "port": self.port,
            "serving": self._server is not None and self._server.serving,
            "metadata_epoch": self._metadata_epoch,
            "brokers": sorted(b.node_id for b in view.cluster().brokers) if view else [],
            "topics": sorted(view.topics()) if view else [],
        }

    async def set_up_groups(self) -> None:
        """Create ``__consumer_offsets`` through the active controller if it does not exist
        (what the first FindCoordinator does otherwise; `raylog up` calls this once)."""
        if self._groups is None:
            raise RaylogError(f"gateway of broker {self.broker_id} is not started")
        await asyncio.wait_for(self._groups.set_up_topic(), CREATE_TIMEOUT_MS / 1000)

    async def loaded_group_partitions(self) -> list[int]:
        """The ``__consumer_offsets`` partitions this broker's coordinator has loaded (it serves
        their groups)."""
        return self._groups.loaded_partitions() if self._groups is not None else []

    async def metrics(self) -> dict[str, Any]:
        """Request counts, latency histograms and bytes since start (see ``request_stats``),
        how fetches were read: ``fetch_reads`` (bytes read from the segment files on this
        node, bytes the replicas sent, short-circuit reads that did not hold), and the use of
        the shared memory large produce requests are received into (``produce_arena``), and per
        client quota and (user, client id) its rate and throttle times (``client_quotas``)."""
        stats = self._server.request_stats if self._server is not None else RequestStats()
        backend = self._backend
        reads = dataclasses.asdict(backend.read_stats) if backend is not None else {}
        arena = backend.arenas.stats() if backend is not None and backend.arenas else {}
        return {
            "broker_id": self.broker_id,
            **stats.snapshot(),
            "fetch_reads": reads,
            "produce_arena": arena,
            "client_quotas": (
                self._server.quotas.metrics(int(time.monotonic() * 1000)) if self._server else {}
            ),
            "link_mirrors": self._mirrors.progress() if self._mirrors is not None else [],
        }

    # --- metadata -------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self._refresh()
            except (RaylogError, ray.exceptions.RayError) as exc:
                # Keep serving the last view: stale leaders get NOT_LEADER_OR_FOLLOWER from the
                # replicas themselves, and clients retry.
                log.debug("gateway %d: metadata not refreshed: %s", self.broker_id, exc)
                self._controller = None
            await asyncio.sleep(self._poll_ms / 1000)

    async def _refresh(self) -> None:
        if self._controller is None:
            self._controller = await self._find_active()
            if self._controller is None:
                return
        if not self._has_certificate and self._server is not None:
            # The gateway's certificate for the TLS channels to its local replicas.
            leaf = await ray_call(
                self._controller.issue_certificate.remote(
                    f"gateway:{self.broker_id}", [ray.util.get_node_ip_address()]
                ),
                CALL_TIMEOUT_MS,
            )
            self._server.backend.set_channel_tls(leaf)
            self._has_certificate = True
        await self._refresh_tls()
        md: md_.ClusterMetadata = await ray_call(
            self._controller.metadata.remote(), CALL_TIMEOUT_MS
        )
        if md.metadata_epoch == self._metadata_epoch:
            return
        self._credentials = md.scram_credentials
        brokers, topics = client_view(md)
        live = [b.node_id for b in brokers]
        assert self._view is not None and self._server is not None
        self._view.update(controller_id=min(live) if live else -1, brokers=brokers, topics=topics)
        self._authorization.update(md.acls)
        self._server.quotas.update(((q.user, q.client_id), q.values) for q in md.client_quotas)
        if self._mirrors is not None:
            self._mirrors.update(md)
        if self._link_groups is not None:
            self._link_groups.update(md)
        self._metadata_epoch = md.metadata_epoch
        if not self._server.serving:
            await self._server.start_serving()  # the view is current: clients may come
            log.info("gateway %d: serving at metadata epoch %d", self.broker_id, md.metadata_epoch)

    # --- cross-cluster links ----------------------------------------------------------------------

    async def _mirror_append(
        self, topic: str, partition: int, epoch: int, batches: bytes, source_log_start: int = -1
    ) -> Any:
        """The local leader replica's ``mirror_append`` (acks=1: the fetcher needs the new log
        end, and the replica's followers and HW carry on as for produced batches)."""
        assert self._backend is not None
        name = replica_actor_name(topic, partition, self.broker_id)
        try:
            return await self._backend.replicas.calls.call(
                name,
                "mirror_append",
                (epoch, batches, 1, MIRROR_APPEND_TIMEOUT_MS, source_log_start),
                timeout_s=MIRROR_APPEND_TIMEOUT_MS / 1000 + 5,
                retry=False,
            )
        except NoOutcome as exc:
            return MirrorOutcome(exc.error_code, -1, -1, -1, str(exc))
        except TimeoutError:
            return MirrorOutcome(ErrorCode.REQUEST_TIMED_OUT, -1, -1, -1, "mirror_append timed out")

    async def _report_mirrors(self, reports: list[dict[str, Any]]) -> None:
        controller = self._controller
        if controller is not None:
            await ray_call(controller.report_link_progress.remote(reports), CALL_TIMEOUT_MS)

    def _commit_refusals(self, group_id: str, topics: Sequence[str]) -> Mapping[str, str]:
        """The group coordinator's read-only rule: the links' (none before start)."""
        if self._link_groups is None:
            return {}
        return self._link_groups.commit_refusals(group_id, topics)

    async def _high_watermark(self, topic: str, partition: int) -> int:
        """A mirror partition's high watermark from its leader replica, on whichever broker
        (the group's coordinator need not lead it); -1 when unknown."""
        assert self._backend is not None and self._view is not None
        state = routing.find_partition(self._view.topics(), topic, partition)
        if state is None or state.leader < 0:
            return -1
        leader = replica_actor_name(topic, partition, state.leader)
        answer = await self._backend.replicas.list_offsets(leader, LATEST_OFFSET, -1, 0)
        return answer.offset if answer.error_code == ErrorCode.NONE else -1

    async def _report_link_groups(
        self, link: str, groups: list[dict[str, Any]], error: str
    ) -> None:
        controller = self._controller
        if controller is not None:
            await ray_call(
                controller.report_link_groups.remote(link, self.broker_id, groups, error),
                CALL_TIMEOUT_MS,
            )

    async def active_controller(self, refresh: bool = False) -> Any:
        """The active controller's handle for admin requests (ReplicaBackend's locator)."""
        if refresh or self._controller is None:
            self._controller = await self._find_active()
        return self._controller

    async def _find_active(self) -> Any:
        for name in self._controller_names:
            try:
                handle = await asyncio.wait_for(
                    asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE),
                    timeout=LOOKUP_TIMEOUT_S,
                )
                status = await ray_call(handle.status.remote(), CALL_TIMEOUT_MS)
            except (ValueError, TimeoutError, RaylogError, ray.exceptions.RayError):
                continue
            if status.active:
                return handle
        return None


__all__ = ["GatewayActor", "GatewayStartError", "client_view"]


async def _new_producer_id(backend: ReplicaBackend) -> int:
    """A fresh producer id from the gateway's block, for a new transactional id."""
    result = await backend.init_producer_id()
    if result.error_code:
        raise RaylogError(f"no producer id: error {result.error_code} {result.message}")
    return result.producer_id
