"""The cluster metadata and the pure transitions that change it.

This module owns the shape of raylog's cluster metadata — broker registrations, topics with their
config overrides, per partition its replicas, leader, epochs and ISR, the SASL/SCRAM users'
credentials (KIP-554, keys only: ``actors/control/scram.py``), the ACLs
(``actors/control/acls.py``) and the client quotas (``actors/control/client_quotas.py``) — as
msgspec Structs that
encode to JSON or msgpack for the controller's compare-and-swap writes to the object store, and
the mechanical transitions on it. Every transition takes a :class:`ClusterMetadata` and returns a
new one (never mutating), bumping ``metadata_epoch`` once, or returns the very same object when
nothing changed (so the caller can skip the write).

Decisions (who becomes leader, which ISR a leader may propose) live in
``raylog.actors.control.election``; where replicas go lives in ``raylog.actors.control.placement``.
This module only applies what those decided and checks that the result still holds the invariants
below; :func:`new_topic` and :func:`new_partitions` carry out CreateTopics and CreatePartitions
as a request asks them (placement's choice, then the transition), for the controller and for a
gateway checking a ``validate_only`` request alike.

Epochs (Kafka's rules):

- ``leader_epoch`` bumps whenever the leader changes, including to and from "no leader" (-1);
- ``partition_epoch`` bumps on every change of a partition's state: leader, ISR, replicas or
  observers;
- ``broker_epoch`` is assigned at registration (the ``metadata_epoch`` that records it) and so
  grows with every new incarnation of a broker;
- ``metadata_epoch`` bumps once per transition that changes anything: it is the version of the
  document that compare-and-swap protects.

Invariants of every partition (:func:`check_partition`):

- ``replicas`` are distinct; ``observers`` ⊆ ``replicas``; the ISR is a non-empty subset of the
  non-observer replicas with no duplicates, kept in assignment order (so equal ISRs compare
  equal);
- ``leader`` is -1 or a member of the ISR (hence never an observer);
- ``offline_replicas`` (replicas whose log failed) are replicas, kept in assignment order, and
  never the leader (a replica going offline leaves the ISR unless it is its last member);
- the ISR is never empty: when its last member fails the partition goes offline (leader -1) and
  keeps that member as the ISR, so that the replica holding every committed record is the one
  elected when it returns (Kafka does the same).

Session liveness is not in the metadata: the controller judges sessions by its own monotonic
clock and records only the outcome (a broker's ``state``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import msgspec

from raylog.actors.control import acls as acls_
from raylog.actors.control import config_keys, placement, scram
from raylog.actors.control.links import ClusterLink, MirrorInfo
from raylog.actors.control.listeners import Endpoint
from raylog.storage.errors import (
    BrokerIdNotRegisteredError,
    DuplicateResourceError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    RaylogError,
    ResourceNotFoundError,
    TopicAlreadyExistsError,
    UnacceptableCredentialError,
    UnknownTopicOrPartitionError,
    UnsupportedSaslMechanismError,
)

NO_LEADER = -1
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's block size for InitProducerId allocation

BrokerState = Literal["registered", "fenced", "controlled_shutdown"]
# registered: unfenced, may lead and be in ISRs. fenced: session expired or died (or a new
#   incarnation has not caught up). controlled_shutdown: going away on purpose; it keeps serving
#   until the controller has moved its leaders, but is not eligible for leadership or the ISR.
BROKER_STATES: tuple[BrokerState, ...] = ("registered", "fenced", "controlled_shutdown")

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_NAME_LENGTH = 249


class TopicPartition(msgspec.Struct, frozen=True, order=True):
    """A partition's address; hashable and ordered so it can key dicts and sort."""

    topic: str
    partition: int


class BrokerRegistration(msgspec.Struct, frozen=True, kw_only=True):
    """One broker as the controller knows it. ``port`` is its Kafka gateway's port."""

    broker_id: int
    incarnation_id: str  # uuid hex, new every time the broker process starts
    broker_epoch: int  # the metadata_epoch that recorded this incarnation's registration
    rack: str | None
    host: str
    port: int
    state: BrokerState = "registered"
    # Every client listener, as clients reach it (host/port above: the first one's).
    endpoints: tuple[Endpoint, ...] = ()
    # Being decommissioned: takes no new replica (placement, balancing and the other brokers'
    # decommissions pass it over) while it still serves and leads what it holds. Kept across
    # restarts; cleared when its decommission is cancelled (`raylog brokers start` does that).
    draining: bool = False


class PartitionState(msgspec.Struct, frozen=True, kw_only=True):
    """A partition's assignment, leadership and ISR (Kafka's PartitionRecord)."""

    partition: int
    replicas: tuple[int, ...]  # assignment order; replicas[0] is the preferred leader
    isr: tuple[int, ...]
    observers: tuple[int, ...] = ()  # ⊆ replicas; replicate but never join the ISR nor lead
    leader: int = NO_LEADER
    leader_epoch: int = 0
    partition_epoch: int = 0
    # A reassignment in progress (KIP-455; see raylog.actors.control.reassignment): ``replicas`` is
    # then target + original, ``adding_replicas`` = target - original and ``removing_replicas`` =
    # original - target, both ⊆ replicas and disjoint.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    # Replicas whose log failed (a full disk, an I/O error), as their broker reports them: they
    # neither lead nor join the ISR until their broker reports them back (Kafka's offline log
    # directories, per replica here since each replica has a log directory of its own).
    offline_replicas: tuple[int, ...] = ()

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0]

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """The replica list once the reassignment in progress (if any) completes."""
        return tuple(b for b in self.replicas if b not in self.removing_replicas)

    @property
    def original_replicas(self) -> tuple[int, ...]:
        """The replica list before the reassignment in progress (if any) started."""
        return tuple(b for b in self.replicas if b not in self.adding_replicas)


class TopicMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """A topic: its id, its config overrides (validated, normalised) and its partitions."""

    name: str
    topic_id: str  # uuid hex; a re-created topic gets a new id
    configs: dict[str, str] = {}  # overrides only; defaults come from config_keys
    partitions: tuple[PartitionState, ...] = ()  # partitions[i].partition == i
    # A mirror of a cross-cluster link's source topic (``links``), read-only while it is set.
    mirror: MirrorInfo | None = None


class ScramCredentialRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One user's SCRAM credential for one mechanism (Kafka's UserScramCredentialRecord): the
    keys of RFC 5802 section 3, enough to check a client's proof, not enough to log in. Its
    repr hides the salt and keys, as Kafka's does."""

    mechanism: str  # scram.SCRAM_SHA_256 or scram.SCRAM_SHA_512
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def __repr__(self) -> str:
        return f"ScramCredentialRecord({self.mechanism}, iterations={self.iterations}, [hidden])"


class ClientQuotaRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One client quota entity's values (KIP-546's ClientQuotaEntity): ``user`` and
    ``client_id`` are each a name, ``client_quotas.DEFAULT`` (Kafka's ``<default>``) or None
    (not part of the entity); ``values`` maps Kafka's quota keys (``producer_byte_rate``,
    ``consumer_byte_rate``, ``request_percentage``) to their values. Transitions:
    ``actors/control/client_quotas.py``."""

    user: str | None = None
    client_id: str | None = None
    values: dict[str, float] = {}


class ClusterMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """The root document the controller reads and compare-and-swaps in the object store."""

    cluster_id: str
    metadata_epoch: int = 0
    controller_epoch: int = 0  # the lease epoch of the controller that wrote this version
    next_producer_id: int = 0  # first id of the next producer-id block to hand out
    brokers: dict[int, BrokerRegistration] = {}
    topics: dict[str, TopicMetadata] = {}
    # Cluster-wide dynamic broker configs (validated by config_keys.BROKER_CONFIGS), over the
    # static ones the controller was started with; e.g. the reassignment throttle.
    dynamic_broker_configs: dict[str, str] = {}
    # SASL/SCRAM users (KIP-554): user name -> its credentials, at most one per mechanism, in
    # mechanism order; a user without credentials is not stored.
    scram_credentials: dict[str, tuple[ScramCredentialRecord, ...]] = {}
    # Kafka's ACLs, sorted, each once (acls.create_acls / delete_acls).
    acls: tuple[acls_.AclBinding, ...] = ()
    # Client quotas (KIP-55, KIP-546): one record per entity with values, sorted by entity.
    client_quotas: tuple[ClientQuotaRecord, ...] = ()
    # Cross-cluster links (KIP-986) this cluster is the destination of, by name.
    links: dict[str, ClusterLink] = {}


class PartitionChange(msgspec.Struct, frozen=True, kw_only=True):
    """A decided change to one partition; None fields stay as they are.

    ``unclean`` marks a leader chosen outside the ISR, so the caller can count it in a metric.
    """

    topic: str
    partition: int
    leader: int | None = None
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    observers: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None
    offline_replicas: tuple[int, ...] | None = None
    unclean: bool = False
    bump_partition_epoch: bool = False  # even if nothing else changes (a fencing AlterPartition)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


# --- encoding ---------------------------------------------------------------------------------

_json_decoder = msgspec.json.Decoder(ClusterMetadata)
_msgpack_decoder = msgspec.msgpack.Decoder(ClusterMetadata)


def encode_json(md: ClusterMetadata) -> bytes:
    return msgspec.json.encode(md)


def decode_json(data: bytes) -> ClusterMetadata:
    md = _json_decoder.decode(data)
    check(md)
    return md


def encode_msgpack(md: ClusterMetadata) -> bytes:
    return msgspec.msgpack.encode(md)


def decode_msgpack(data: bytes) -> ClusterMetadata:
    md = _msgpack_decoder.decode(data)
    check(md)
    return md


# --- queries ----------------------------------------------------------------------------------


def is_active(md: ClusterMetadata, broker_id: int) -> bool:
    """Whether the broker may lead and be in an ISR: registered, neither fenced nor leaving."""
    reg = md.brokers.get(broker_id)
    return reg is not None and reg.state == "registered"


def active_brokers(md: ClusterMetadata) -> list[BrokerRegistration]:
    """Brokers that can take new replicas (registered, not draining), by broker id."""
    return [
        reg
        for _, reg in sorted(md.brokers.items())
        if reg.state == "registered" and not reg.draining
    ]


def set_draining(md: ClusterMetadata, broker_id: int, draining: bool) -> ClusterMetadata:
    """Mark a broker as being decommissioned (or no longer)."""
    return _replace_broker(md, broker_id, draining=draining)


def get_topic(md: ClusterMetadata, topic: str) -> TopicMetadata:
    t = md.topics.get(topic)
    if t is None:
        raise UnknownTopicOrPartitionError(f"Unknown topic {topic!r}")
    return t


def get_partition(md: ClusterMetadata, topic: str, partition: int) -> PartitionState:
    t = get_topic(md, topic)
    if not 0 <= partition < len(t.partitions):
        raise UnknownTopicOrPartitionError(f"Unknown partition {topic}-{partition}")
    return t.partitions[partition]


def partitions(md: ClusterMetadata) -> Iterable[tuple[TopicPartition, PartitionState]]:
    """Every partition, topics in name order."""
    for name in sorted(md.topics):
        for p in md.topics[name].partitions:
            yield TopicPartition(name, p.partition), p


# --- invariants -------------------------------------------------------------------------------


def check_partition(p: PartitionState, where: str = "") -> None:
    """Raise AssertionError naming the partition when one of the module's invariants breaks.

    Raises rather than ``assert`` so that the check stays on under ``python -O``.
    """
    where = where or f"partition {p.partition}"

    def fail(why: str) -> None:
        raise AssertionError(f"{where}: {why} ({p})")

    if not p.replicas or len(set(p.replicas)) != len(p.replicas):
        fail("replicas empty or not distinct")
    if not set(p.observers) <= set(p.replicas) or len(set(p.observers)) != len(p.observers):
        fail("observers not distinct replicas")
    if not p.isr or len(set(p.isr)) != len(p.isr):
        fail("ISR empty or not distinct")
    if not set(p.isr) <= set(p.replicas) - set(p.observers):
        fail("ISR holds a non-replica or an observer")
    if list(p.isr) != [b for b in p.replicas if b in p.isr]:
        fail("ISR not in assignment order")
    if p.leader != NO_LEADER and p.leader not in p.isr:
        fail("leader not in the ISR")
    if p.leader_epoch < 0 or p.partition_epoch < 0:
        fail("negative epoch")
    adding, removing = set(p.adding_replicas), set(p.removing_replicas)
    if not (adding | removing) <= set(p.replicas) or adding & removing:
        fail("adding/removing replicas not disjoint subsets of the replicas")
    if len(adding) != len(p.adding_replicas) or len(removing) != len(p.removing_replicas):
        fail("adding/removing replicas not distinct")
    if removing == set(p.replicas):
        fail("a reassignment removes every replica")
    if list(p.offline_replicas) != [b for b in p.replicas if b in p.offline_replicas]:
        fail("offline replicas not distinct replicas in assignment order")
    if p.leader in p.offline_replicas:
        fail("the leader is offline")


def check(md: ClusterMetadata) -> None:
    """Check every invariant of the document (raises AssertionError)."""
    for b, reg in md.brokers.items():
        if b != reg.broker_id or reg.state not in BROKER_STATES:
            raise AssertionError(f"broker {b}: bad registration {reg}")
    for name, t in md.topics.items():
        if name != t.name:
            raise AssertionError(f"topic {name!r} stored under another name {t.name!r}")
        if not t.partitions:
            raise AssertionError(f"topic {name!r} has no partitions")
        # The replication factor may differ between partitions: a reassignment changes it for
        # the partitions it moves, as in Kafka.
        for i, p in enumerate(t.partitions):
            if p.partition != i:
                raise AssertionError(f"{name}-{i}: stored as partition {p.partition}")
            check_partition(p, f"{name}-{i}")
    for user, records in md.scram_credentials.items():
        mechanisms = [r.mechanism for r in records]
        if (
            not user
            or not records
            or mechanisms != sorted(set(mechanisms) & set(scram.SCRAM_HASHES))
        ):
            raise AssertionError(f"SCRAM user {user!r}: credentials {mechanisms}")
    if list(md.acls) != sorted(set(md.acls)):
        raise AssertionError("ACLs not sorted and distinct")
    for acl in md.acls:
        try:
            acls_.check_new(acl)
        except RaylogError as exc:
            raise AssertionError(f"ACL {acl}: {exc}") from None


# --- transitions ------------------------------------------------------------------------------


def _bump(md: ClusterMetadata, **changes: object) -> ClusterMetadata:
    return msgspec.structs.replace(md, metadata_epoch=md.metadata_epoch + 1, **changes)


def validate_topic_name(name: str) -> None:
    """Kafka's topic name rule (raises InvalidTopicError)."""
    if name in ("", ".", ".."):
        raise InvalidTopicError(f"Topic name {name!r} is illegal")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name {name[:20]!r}... is {len(name)} characters, above the "
            f"{MAX_TOPIC_NAME_LENGTH} maximum"
        )
    if not _TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"Topic name {name!r} is illegal: only ASCII letters, digits, '.', '_' and '-' are "
            f"allowed"
        )


def _check_assignment(
    md: ClusterMetadata, topic: str, assignment: Sequence[Sequence[int]], rf: int | None
) -> None:
    for i, replicas in enumerate(assignment):
        if not replicas:
            raise InvalidReplicationFactorError(f"{topic}: partition {i} has no replicas")
        if len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignmentError(
                f"{topic}: partition {i} lists a broker twice: {list(replicas)}"
            )
        unknown = [b for b in replicas if b not in md.brokers]
        if unknown:
            raise InvalidReplicaAssignmentError(
                f"{topic}: partition {i} names unregistered brokers {unknown}"
            )
        if rf is not None and len(replicas) != rf:
            raise InvalidReplicaAssignmentError(
                f"{topic}: partition {i} has {len(replicas)} replicas, the topic has {rf}"
            )


def _new_partition(
    md: ClusterMetadata,
    topic: str,
    index: int,
    replicas: Sequence[int],
    observers: Sequence[int],
) -> PartitionState:
    # Kafka: the ISR starts as the active replicas, and the leader is the first of them in
    # assignment order. Observers never join the ISR.
    obs = tuple(b for b in replicas if b in set(observers))
    isr = tuple(b for b in replicas if b not in obs and is_active(md, b))
    if not isr:
        raise InvalidReplicationFactorError(
            f"Unable to start partition {topic}-{index}: none of its voting replicas "
            f"{[b for b in replicas if b not in obs]} is on an active broker"
        )
    return PartitionState(
        partition=index, replicas=tuple(replicas), isr=isr, observers=obs, leader=isr[0]
    )


def create_topic(
    md: ClusterMetadata,
    name: str,
    topic_id: str,
    assignment: Sequence[Sequence[int]],
    configs: Mapping[str, str] | None = None,
    observers: Sequence[Sequence[int]] | None = None,
) -> ClusterMetadata:
    """CreateTopics: a topic whose partition ``i`` has replicas ``assignment[i]``.

    ``assignment`` comes from ``placement.place_replicas`` or from the client (manual
    assignment); ``observers[i]`` (optional) names which of partition ``i``'s replicas observe.
    ``configs`` are validated here, so nothing unvalidated is ever stored.
    """
    validate_topic_name(name)
    if name in md.topics:
        raise TopicAlreadyExistsError(f"Topic {name!r} already exists")
    # Kafka refuses names that differ from an existing one only by '.' versus '_', because
    # both map to the same metric names.
    clash = [t for t in md.topics if t.replace(".", "_") == name.replace(".", "_")]
    if clash:
        raise InvalidTopicError(f"Topic {name!r} collides with existing topic {clash[0]!r}")
    if any(t.topic_id == topic_id for t in md.topics.values()):
        raise AssertionError(f"topic id {topic_id} already in use")
    if not assignment:
        raise InvalidPartitionsError(f"{name}: the number of partitions must be at least 1")
    _check_assignment(md, name, assignment, len(assignment[0]))
    if observers is not None and len(observers) != len(assignment):
        raise InvalidReplicaAssignmentError(f"{name}: observers given for some partitions only")
    normalised = config_keys.validate(configs or {})
    parts = tuple(
        _new_partition(md, name, i, r, observers[i] if observers else ())
        for i, r in enumerate(assignment)
    )
    topic = TopicMetadata(name=name, topic_id=topic_id, configs=normalised, partitions=parts)
    return _bump(md, topics={**md.topics, name: topic})


def new_topic(
    md: ClusterMetadata,
    name: str,
    topic_id: str,
    num_partitions: int,
    replication_factor: int,
    configs: Mapping[str, str] | None = None,
    assignment: Sequence[Sequence[int]] | None = None,
) -> ClusterMetadata:
    """CreateTopics as a request asks it: the name checked, then ``assignment`` as given or
    else replicas placed rack-aware over the active brokers (``placement.place_replicas``),
    then :func:`create_topic`'s checks."""
    validate_topic_name(name)
    chosen = assignment or placement.place_replicas(
        active_brokers(md), num_partitions, replication_factor
    )
    return create_topic(md, name, topic_id, chosen, configs)


def new_partitions(md: ClusterMetadata, name: str, total_count: int) -> ClusterMetadata:
    """CreatePartitions as a request asks it: the topic grown to ``total_count`` partitions,
    placed where the topic's rotation continues (``placement.place_new_partitions``);
    INVALID_PARTITIONS (37) when ``total_count`` is not more than it has."""
    t = get_topic(md, name)
    if total_count <= len(t.partitions):
        raise InvalidPartitionsError(
            f"Topic {name!r} has {len(t.partitions)} partitions; {total_count} is not more"
        )
    new = placement.place_new_partitions(
        active_brokers(md),
        [p.target_replicas for p in t.partitions],
        total_count - len(t.partitions),
    )
    return add_partitions(md, name, new)


def delete_topic(md: ClusterMetadata, name: str) -> ClusterMetadata:
    """DeleteTopics: drop the topic; its replicas are stopped by the controller's reconcile."""
    get_topic(md, name)
    return _bump(md, topics={k: v for k, v in md.topics.items() if k != name})


def add_partitions(
    md: ClusterMetadata, name: str, new_assignment: Sequence[Sequence[int]]
) -> ClusterMetadata:
    """CreatePartitions: append partitions with replicas ``new_assignment`` (one per new one)."""
    t = get_topic(md, name)
    if not new_assignment:
        raise InvalidPartitionsError(
            f"Topic {name!r} already has {len(t.partitions)} partitions; a new count must be higher"
        )
    _check_assignment(md, name, new_assignment, len(t.partitions[0].target_replicas))
    start = len(t.partitions)
    added = tuple(_new_partition(md, name, start + i, r, ()) for i, r in enumerate(new_assignment))
    topic = msgspec.structs.replace(t, partitions=t.partitions + added)
    return _bump(md, topics={**md.topics, name: topic})


def alter_configs(md: ClusterMetadata, name: str, overrides: Mapping[str, str]) -> ClusterMetadata:
    """AlterConfigs: replace the topic's whole set of overrides (validated here).

    IncrementalAlterConfigs computes the new set with ``config_keys.apply_incremental`` first.
    Enabling unclean.leader.election.enable does not elect anything by itself: the controller
    follows up with ``election.elect_leaders(..., "unclean")`` for offline partitions.
    """
    t = get_topic(md, name)
    normalised = config_keys.validate(overrides)
    if normalised == t.configs:
        return md
    topic = msgspec.structs.replace(t, configs=normalised)
    return _bump(md, topics={**md.topics, name: topic})


def register_broker(
    md: ClusterMetadata,
    broker_id: int,
    incarnation_id: str,
    rack: str | None,
    host: str,
    port: int,
    endpoints: tuple[Endpoint, ...] = (),
    draining: bool = False,
) -> ClusterMetadata:
    """BrokerRegistration of a new incarnation: the broker is active at once (``draining``:
    its decommission goes on, see :class:`BrokerRegistration`).

    A re-registration of the same incarnation is a retry and changes nothing. A new incarnation
    of a known broker must first be fenced by ``election.fence_broker`` (which takes it out of
    ISRs and moves its leaders: the new process has none of the old one's in-memory state), and
    ``election.register_broker`` does that and refuses while the old session is live.
    """
    old = md.brokers.get(broker_id)
    if old is not None and old.incarnation_id == incarnation_id:
        return md
    if old is not None and old.state != "fenced":
        raise AssertionError(f"broker {broker_id}: new incarnation while the old is not fenced")
    reg = BrokerRegistration(
        broker_id=broker_id,
        incarnation_id=incarnation_id,
        broker_epoch=md.metadata_epoch + 1,
        rack=rack,
        host=host,
        port=port,
        endpoints=tuple(endpoints),
        draining=draining,
    )
    return _bump(md, brokers={**md.brokers, broker_id: reg})


def set_broker_state(md: ClusterMetadata, broker_id: int, state: BrokerState) -> ClusterMetadata:
    """Record a broker's new state only. Use ``election.fence_broker`` /
    ``election.controlled_shutdown`` / ``election.unfence_broker``, which also apply the
    partition changes that must be written in the same version."""
    return _replace_broker(md, broker_id, state=state)


def _replace_broker(md: ClusterMetadata, broker_id: int, **changes: Any) -> ClusterMetadata:
    """The broker's registration with ``changes``; the same metadata if they change nothing."""
    reg = md.brokers.get(broker_id)
    if reg is None:
        raise BrokerIdNotRegisteredError(f"Broker {broker_id} is not registered")
    changed = msgspec.structs.replace(reg, **changes)
    if changed == reg:
        return md
    return _bump(md, brokers={**md.brokers, broker_id: changed})


def unregister_broker(md: ClusterMetadata, broker_id: int) -> ClusterMetadata:
    """Forget a broker (decommissioned). It must hold no replicas: reassign them first."""
    if broker_id not in md.brokers:
        raise BrokerIdNotRegisteredError(f"Broker {broker_id} is not registered")
    holding = [str(tp) for tp, p in partitions(md) if broker_id in p.replicas]
    if holding:
        raise InvalidReplicaAssignmentError(
            f"Broker {broker_id} still holds {len(holding)} replicas; reassign them first"
        )
    return _bump(md, brokers={k: v for k, v in md.brokers.items() if k != broker_id})


def apply_partition_changes(
    md: ClusterMetadata, changes: Iterable[PartitionChange]
) -> ClusterMetadata:
    """Apply decided partition changes in one version, bumping epochs by Kafka's rules.

    A change that changes nothing is skipped; when none changes anything the same object is
    returned. Every changed partition is checked against the invariants.
    """
    topics = dict(md.topics)
    changed = False
    for c in changes:
        t = topics.get(c.topic)
        if t is None or not 0 <= c.partition < len(t.partitions):
            raise UnknownTopicOrPartitionError(f"Unknown partition {c.topic}-{c.partition}")
        old = t.partitions[c.partition]
        new = _changed_partition(old, c)
        if new is old:
            continue
        check_partition(new, f"{c.topic}-{c.partition}")
        parts = list(t.partitions)
        parts[c.partition] = new
        topics[c.topic] = msgspec.structs.replace(t, partitions=tuple(parts))
        changed = True
    return _bump(md, topics=topics) if changed else md


def _changed_partition(old: PartitionState, c: PartitionChange) -> PartitionState:
    leader = old.leader if c.leader is None else c.leader
    isr = old.isr if c.isr is None else tuple(c.isr)
    replicas = old.replicas if c.replicas is None else tuple(c.replicas)
    observers = old.observers if c.observers is None else tuple(c.observers)
    adding = old.adding_replicas if c.adding_replicas is None else tuple(c.adding_replicas)
    removing = old.removing_replicas if c.removing_replicas is None else tuple(c.removing_replicas)
    offline = old.offline_replicas if c.offline_replicas is None else set(c.offline_replicas)
    # Kept in assignment order; a replica that leaves the assignment leaves this list too.
    offline = tuple(b for b in replicas if b in offline)
    new = (leader, isr, replicas, observers, adding, removing, offline)
    if not c.bump_partition_epoch and new == (
        old.leader,
        old.isr,
        old.replicas,
        old.observers,
        old.adding_replicas,
        old.removing_replicas,
        old.offline_replicas,
    ):
        return old
    # The leader epoch also bumps when the replica set changes under the same leader: a leader
    # learns its followers only from a BecomeLeader of a new epoch (Kafka KRaft bumps it when
    # replicas are removed; raylog's replicas need it for additions too).
    bump = leader != old.leader or replicas != old.replicas or observers != old.observers
    return PartitionState(
        partition=old.partition,
        replicas=replicas,
        isr=isr,
        observers=observers,
        leader=leader,
        leader_epoch=old.leader_epoch + (1 if bump else 0),
        partition_epoch=old.partition_epoch + 1,
        adding_replicas=adding,
        removing_replicas=removing,
        offline_replicas=offline,
    )


def apply_election(md: ClusterMetadata, changes: Iterable[PartitionChange]) -> ClusterMetadata:
    """Apply the outcome of an election decided by ``raylog.actors.control.election``."""
    return apply_partition_changes(md, changes)


def apply_alter_partition(
    md: ClusterMetadata, topic: str, partition: int, isr: Sequence[int], fence: bool = False
) -> ClusterMetadata:
    """Apply an ISR proposal already accepted by ``election.validate_alter_partition``."""
    change = PartitionChange(
        topic=topic, partition=partition, isr=tuple(isr), bump_partition_epoch=fence
    )
    return apply_partition_changes(md, [change])


def allocate_producer_ids(md: ClusterMetadata) -> tuple[ClusterMetadata, range]:
    """AllocateProducerIds: hand out the next block of producer ids."""
    start = md.next_producer_id
    block = range(start, start + PRODUCER_ID_BLOCK_SIZE)
    return _bump(md, next_producer_id=block.stop), block


def set_dynamic_broker_configs(md: ClusterMetadata, configs: Mapping[str, str]) -> ClusterMetadata:
    """Replace the cluster-wide dynamic broker configs (validated here)."""
    normalised = config_keys.BROKER_CONFIGS.validate(configs)
    if normalised == md.dynamic_broker_configs:
        return md
    return _bump(md, dynamic_broker_configs=normalised)


def take_controllership(md: ClusterMetadata, controller_epoch: int) -> ClusterMetadata:
    """Record the lease epoch of the controller that now writes (it only grows)."""
    if controller_epoch <= md.controller_epoch:
        raise AssertionError(
            f"controller epoch {controller_epoch} is not above {md.controller_epoch}"
        )
    return _bump(md, controller_epoch=controller_epoch)


# --- SCRAM credentials (KIP-554) ----------------------------------------------------------------


class ScramUpsertion(NamedTuple):
    """One upsertion of AlterUserScramCredentials: the client salted the password."""

    user: str
    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes


class ScramDeletion(NamedTuple):
    """One deletion of AlterUserScramCredentials."""

    user: str
    mechanism: str


# Per user of a request, in the order first named: (user, Kafka error code, message); (user, 0,
# "") when done.
UserResult = tuple[str, int, str]
# Kafka's messages.
CREDENTIAL_NAMED_TWICE = "A user credential cannot be altered twice in the same request"
DESCRIBED_TWICE = "Cannot describe SCRAM credentials for the same user twice in a single request: "
NO_SUCH_USER = "Attempt to describe a user credential that does not exist: "


def _check_user_and_mechanism(user: str, mechanism: str) -> None:
    if not user:
        raise UnacceptableCredentialError("Username must not be empty")
    if not scram.valid_user_name(user):
        raise UnacceptableCredentialError(
            f"Username must be at most {scram.USER_NAME_CHARS_MAX} characters without control "
            f"characters"
        )
    if scram.hash_name(mechanism) is None:
        raise UnsupportedSaslMechanismError(
            f"Unknown SCRAM mechanism {mechanism!r}: {' or '.join(scram.SCRAM_HASHES)}"
        )


def _check_upsertion(u: ScramUpsertion) -> None:
    _check_user_and_mechanism(u.user, u.mechanism)
    if u.iterations < scram.ITERATIONS_MIN:
        raise UnacceptableCredentialError(
            f"Too few iterations: {u.iterations}, at least {scram.ITERATIONS_MIN}"
        )
    if u.iterations > scram.ITERATIONS_MAX:
        raise UnacceptableCredentialError(
            f"Too many iterations: {u.iterations}, at most {scram.ITERATIONS_MAX}"
        )
    # Not Kafka's checks, which take any bytes: an empty salt or a salted password that is not
    # a digest of the mechanism's hash is a client's bug, and would store a useless credential.
    if not u.salt:
        raise UnacceptableCredentialError("Salt must not be empty")
    if len(u.salted_password) != scram.digest_size(u.mechanism):
        raise UnacceptableCredentialError(
            f"A {u.mechanism} salted password is {scram.digest_size(u.mechanism)} bytes"
        )


def _check_deletion(md: ClusterMetadata, d: ScramDeletion) -> None:
    _check_user_and_mechanism(d.user, d.mechanism)
    if all(r.mechanism != d.mechanism for r in md.scram_credentials.get(d.user, ())):
        raise ResourceNotFoundError("Attempt to delete a user credential that does not exist")


def alter_scram_credentials(
    md: ClusterMetadata,
    upsertions: Iterable[ScramUpsertion],
    deletions: Iterable[ScramDeletion],
) -> tuple[ClusterMetadata, list[UserResult]]:
    """AlterUserScramCredentials as Kafka's controller carries it out (ScramControlManager): a
    user may be named once per request (else DUPLICATE_RESOURCE for that user, nothing done for
    it); each other user's change is checked on its own (UNSUPPORTED_SASL_MECHANISM,
    UNACCEPTABLE_CREDENTIAL, RESOURCE_NOT_FOUND for deleting what is not there) and the valid
    ones are applied together. The keys are derived here from the salted password
    (``scram.scram_keys``); a user whose last credential is deleted is removed."""
    named: dict[str, None] = {}
    errors: dict[str, RaylogError] = {}
    deletes: dict[str, ScramDeletion] = {}
    upserts: dict[str, ScramUpsertion] = {}
    for change in (*deletions, *upsertions):
        user = change.user
        named.setdefault(user)
        if user in errors:
            continue
        if deletes.pop(user, None) is not None or upserts.pop(user, None) is not None:
            errors[user] = DuplicateResourceError(CREDENTIAL_NAMED_TWICE)
            continue
        try:
            if isinstance(change, ScramDeletion):
                _check_deletion(md, change)
                deletes[user] = change
            else:
                _check_upsertion(change)
                upserts[user] = change
        except RaylogError as exc:
            errors[user] = exc
    results = [
        (user, errors[user].error_code, str(errors[user])) if user in errors else (user, 0, "")
        for user in named
    ]
    if not deletes and not upserts:
        return md, results
    table = dict(md.scram_credentials)
    for d in deletes.values():
        left = tuple(r for r in table[d.user] if r.mechanism != d.mechanism)
        if left:
            table[d.user] = left
        else:
            del table[d.user]
    for u in upserts.values():
        stored_key, server_key = scram.scram_keys(u.mechanism, u.salted_password)
        record = ScramCredentialRecord(
            mechanism=u.mechanism,
            salt=u.salt,
            iterations=u.iterations,
            stored_key=stored_key,
            server_key=server_key,
        )
        others = [r for r in table.get(u.user, ()) if r.mechanism != u.mechanism]
        table[u.user] = tuple(sorted([*others, record], key=lambda r: r.mechanism))
    return _bump(md, scram_credentials=table), results


class ScramUserDescription(NamedTuple):
    """DescribeUserScramCredentials for one user: each mechanism with its iterations (never a
    salt or a key), or Kafka's error code and message."""

    user: str
    error_code: int
    message: str
    credentials: tuple[tuple[str, int], ...]  # (mechanism, iterations)


def describe_scram_credentials(
    md: ClusterMetadata, users: Sequence[str] | None
) -> list[ScramUserDescription]:
    """DescribeUserScramCredentials as Kafka answers it (ScramImage.describe): every user with
    credentials when ``users`` is None or empty, else each user asked for once, in the order
    asked: RESOURCE_NOT_FOUND for one without credentials, DUPLICATE_RESOURCE for one asked
    twice."""
    asked = Counter(users or sorted(md.scram_credentials))  # in the order first named
    out = []
    for user, times in asked.items():
        found = tuple((r.mechanism, r.iterations) for r in md.scram_credentials.get(user, ()))
        if times > 1:
            out.append(
                ScramUserDescription(
                    user, DuplicateResourceError.error_code, DESCRIBED_TWICE + user, ()
                )
            )
        elif not found:
            out.append(
                ScramUserDescription(
                    user, ResourceNotFoundError.error_code, NO_SUCH_USER + user, ()
                )
            )
        else:
            out.append(ScramUserDescription(user, 0, "", found))
    return out


# --- ACLs -----------------------------------------------------------------------------------------


def create_acls(
    md: ClusterMetadata, creations: Sequence[acls_.AclBinding]
) -> tuple[ClusterMetadata, list[acls_.CreationResult]]:
    """CreateAcls (``acls.create_acls``): one (error code, message) per creation."""
    table, results = acls_.create_acls(md.acls, creations)
    return (md if table is md.acls else _bump(md, acls=table)), results


def delete_acls(
    md: ClusterMetadata, filters: Sequence[acls_.AclBindingFilter]
) -> tuple[ClusterMetadata, list[acls_.DeletionResult]]:
    """DeleteAcls (``acls.delete_acls``): per filter its error or the ACLs it deleted."""
    table, results = acls_.delete_acls(md.acls, filters)
    return (md if table is md.acls else _bump(md, acls=table)), results
