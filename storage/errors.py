"""The one table of raylog's expected failures, each mapped to its Kafka error code.

Every failure a caller is expected to handle (bad client input, a full disk, an offset outside
the log) is a subclass of :class:`RaylogError` whose class attribute ``error_code`` is the code
Kafka puts on the wire for it. The gateway turns any ``RaylogError`` into that code; anything
else that escapes is a bug and crashes the actor (the controller replaces it).

Other components (object store, replication, gateway) add their classes here, to this table,
rather than defining exceptions of their own.

| class                             | Kafka error                    | code |
|-----------------------------------|--------------------------------|------|
| OffsetOutOfRangeError             | OFFSET_OUT_OF_RANGE            |    1 |
| CorruptRecordError                | CORRUPT_MESSAGE                |    2 |
| RecordTooLargeError               | MESSAGE_TOO_LARGE              |   10 |
| InvalidConfigError                | INVALID_CONFIG                 |   40 |
| KafkaStorageError                 | KAFKA_STORAGE_ERROR            |   56 |
| FencedLeaderEpochError            | FENCED_LEADER_EPOCH            |   74 |
| UnsupportedCompressionTypeError   | UNSUPPORTED_COMPRESSION_TYPE   |   76 |
| InvalidRecordError                | INVALID_RECORD                 |   87 |
| ObjectStoreError                  | KAFKA_STORAGE_ERROR            |   56 |
| CorruptRemoteObjectError          | KAFKA_STORAGE_ERROR            |   56 |
| PreconditionFailedError           | UNKNOWN_SERVER_ERROR (internal)|   -1 |
| ObjectStoreUnsupportedError       | UNKNOWN_SERVER_ERROR (start-up)|   -1 |
| UnknownTopicOrPartitionError      | UNKNOWN_TOPIC_OR_PARTITION     |    3 |
| InvalidTopicError                 | INVALID_TOPIC_EXCEPTION        |   17 |
| TopicAlreadyExistsError           | TOPIC_ALREADY_EXISTS           |   36 |
| InvalidPartitionsError            | INVALID_PARTITIONS             |   37 |
| InvalidReplicationFactorError     | INVALID_REPLICATION_FACTOR     |   38 |
| InvalidReplicaAssignmentError     | INVALID_REPLICA_ASSIGNMENT     |   39 |
| NotControllerError                | NOT_CONTROLLER                 |   41 |
| InvalidRequestError               | INVALID_REQUEST                |   42 |
| PolicyViolationError              | POLICY_VIOLATION               |   44 |
| TooFewBrokersPendingError         | INVALID_REPLICATION_FACTOR     |   38 |
| TooLittleMemoryPendingError       | POLICY_VIOLATION               |   44 |
| StaleBrokerEpochError             | STALE_BROKER_EPOCH             |   77 |
| PreferredLeaderNotAvailableError  | PREFERRED_LEADER_NOT_AVAILABLE |   80 |
| EligibleLeadersNotAvailableError  | ELIGIBLE_LEADERS_NOT_AVAILABLE |   83 |
| ElectionNotNeededError            | ELECTION_NOT_NEEDED            |   84 |
| DuplicateBrokerRegistrationError  | DUPLICATE_BROKER_REGISTRATION  |  101 |
| BrokerIdNotRegisteredError        | BROKER_ID_NOT_REGISTERED       |  102 |
| IneligibleReplicaError            | INELIGIBLE_REPLICA             |  107 |
| InvalidUpdateVersionError         | INVALID_UPDATE_VERSION         |  108 |
| NotLeaderOrFollowerError          | NOT_LEADER_OR_FOLLOWER         |    6 |
| RequestTimedOutError              | REQUEST_TIMED_OUT              |    7 |
| NotEnoughReplicasError            | NOT_ENOUGH_REPLICAS            |   19 |
| NotEnoughReplicasAfterAppendError | NOT_ENOUGH_REPLICAS_AFTER_APPEND |   20 |
| InvalidRequiredAcksError          | INVALID_REQUIRED_ACKS          |   21 |
| UnknownLeaderEpochError           | UNKNOWN_LEADER_EPOCH           |   75 |
| BrokerNotAvailableError           | BROKER_NOT_AVAILABLE           |    8 |
| NoReassignmentInProgressError     | NO_REASSIGNMENT_IN_PROGRESS    |   85 |
| ReassignmentInProgressError       | REASSIGNMENT_IN_PROGRESS       |   60 |
| OutOfOrderSequenceError           | OUT_OF_ORDER_SEQUENCE_NUMBER   |   45 |
| InvalidProducerEpochError         | INVALID_PRODUCER_EPOCH         |   47 |
| UnsupportedSaslMechanismError     | UNSUPPORTED_SASL_MECHANISM     |   33 |
| SaslAuthenticationFailedError     | SASL_AUTHENTICATION_FAILED     |   58 |
| ResourceNotFoundError             | RESOURCE_NOT_FOUND             |   91 |
| DuplicateResourceError            | DUPLICATE_RESOURCE             |   92 |
| UnacceptableCredentialError       | UNACCEPTABLE_CREDENTIAL        |   93 |
"""

from __future__ import annotations


def remote_cause(exc: BaseException) -> BaseException:
    """The exception a remote method raised: Ray wraps it in a RayTaskError whose ``cause``
    it is (and whose own text is the remote traceback, starting ``ray::Actor.method()``)."""
    return getattr(exc, "cause", None) or exc


def one_line(exc: BaseException) -> str:
    """A one-line reason for ``exc``: the remote cause's first line, else its class name."""
    cause = remote_cause(exc)
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__


class RaylogError(Exception):
    """Base of every expected failure; ``error_code`` is Kafka's code for it."""

    error_code: int = -1  # UNKNOWN_SERVER_ERROR: subclasses always override


class OffsetOutOfRangeError(RaylogError):
    """A read below the log start offset or above the log end offset."""

    error_code = 1


class CorruptRecordError(RaylogError):
    """A record batch fails its CRC-32C or its length framing (CORRUPT_MESSAGE).

    Note: kafka-python and aiokafka treat this code as fatal, so it is only for input that
    really is corrupt, never a "please retry".
    """

    error_code = 2


class RecordTooLargeError(RaylogError):
    """A batch larger than ``max.message.bytes``."""

    error_code = 10


class InvalidConfigError(RaylogError):
    """A configuration value out of range; the message names the Kafka key."""

    error_code = 40


class KafkaStorageError(RaylogError):
    """The disk failed us: full disk, I/O error, or corrupt bytes found on disk.

    Clients retry this code and refresh metadata, so a replica whose disk fails is routed around.
    """

    error_code = 56


class FencedLeaderEpochError(RaylogError):
    """An append carrying a leader epoch older than one the log already holds."""

    error_code = 74


class UnsupportedCompressionTypeError(RaylogError):
    """A batch whose attributes name a codec Kafka does not define (5, 6 or 7)."""

    error_code = 76


class InvalidRecordError(RaylogError):
    """A batch whose header breaks a v2 rule (bad magic, counts, control batch, sequence), or
    a record without a key produced to a compacted topic."""

    error_code = 87


class ObjectStoreError(KafkaStorageError):
    """The object store (S3 or the local directory) failed or did not answer in time.

    A subclass of :class:`KafkaStorageError` (56) because it is the same kind of fault, storage
    that failed us, and clients that see it retry after refreshing metadata. The outcome of a
    write that raised this is unknown: it may or may not have been applied.
    """

    error_code = 56


class CorruptRemoteObjectError(KafkaStorageError):
    """A tiered-storage object whose bytes fail their CRC-32C (a record batch, an index, a
    manifest, the remote log metadata): reported, never served.

    KAFKA_STORAGE_ERROR (56), as a corrupt local segment is: corrupt stored bytes are a storage
    fault, not bad client input (CORRUPT_MESSAGE is fatal to some clients).
    """

    error_code = 56


class PreconditionFailedError(RaylogError):
    """A conditional write or delete lost: ``If-None-Match: *`` on an existing key, or
    ``If-Match`` on a missing key or a changed ETag (HTTP 412).

    Not a Kafka error and not a storage fault (deliberately not an ``ObjectStoreError``): it is a
    lost compare-and-swap, which its caller (the lease, the metadata writer) handles by re-reading.
    It should never reach a client; if one escapes it goes out as UNKNOWN_SERVER_ERROR (-1).
    """

    error_code = -1


class ObjectStoreUnsupportedError(RaylogError):
    """The object store's start-up probe found that it does not enforce conditional writes.

    raylog refuses to run on such a store: its lease and metadata depend on compare-and-swap.
    Raised at start-up only, never sent to a client (hence UNKNOWN_SERVER_ERROR, -1).
    """

    error_code = -1


class UnknownTopicOrPartitionError(RaylogError):
    """A topic or partition the cluster metadata does not hold."""

    error_code = 3


class InvalidTopicError(RaylogError):
    """A topic name Kafka would refuse: empty, ``.``/``..``, over 249 characters, or
    a character outside ``[a-zA-Z0-9._-]``."""

    error_code = 17


class TopicAlreadyExistsError(RaylogError):
    """CreateTopics for a name the cluster metadata already holds."""

    error_code = 36


class InvalidPartitionsError(RaylogError):
    """A partition count <= 0, or CreatePartitions not above the current count."""

    error_code = 37


class InvalidReplicationFactorError(RaylogError):
    """A replication factor <= 0 or above the number of brokers that can take
    replicas, or a partition none of whose replicas is on an active broker."""

    error_code = 38


class InvalidReplicaAssignmentError(RaylogError):
    """A manual assignment with an unknown broker, a broker twice in one
    replica list, or replica lists of different lengths within a topic."""

    error_code = 39


class NotControllerError(RaylogError):
    """A request carrying epochs newer than this controller's metadata: another
    controller has written since, so the caller should find the active one."""

    error_code = 41


class InvalidRequestError(RaylogError):
    """A well-formed request that breaks a protocol rule (e.g. AlterPartition from a
    broker that is not the leader, or a proposed ISR without the leader)."""

    error_code = 42


class PolicyViolationError(RaylogError):
    """A request the cluster refuses by policy, e.g. topic creation whose replicas
    (one Ray actor each) would not fit the memory the brokers' nodes have free."""

    error_code = 44


class CapacityPendingError(RaylogError):
    """A topic that does not fit the brokers present while Ray's autoscaler has been asked for
    the nodes it needs; the caller may ask again until they have joined. Raised as one of the
    two subclasses below, which keep the refusal's own Kafka code."""


class TooFewBrokersPendingError(CapacityPendingError, InvalidReplicationFactorError):
    """A replication factor above the brokers present, more asked for."""


class TooLittleMemoryPendingError(CapacityPendingError, PolicyViolationError):
    """Replicas that do not fit their nodes' free memory, more nodes asked for."""


def capacity_pending(refusal: RaylogError, message: str) -> CapacityPendingError:
    """The pending form of ``refusal`` (INVALID_REPLICATION_FACTOR or POLICY_VIOLATION)."""
    if isinstance(refusal, InvalidReplicationFactorError):
        return TooFewBrokersPendingError(message)
    return TooLittleMemoryPendingError(message)


class StaleBrokerEpochError(RaylogError):
    """A broker request carrying a broker epoch from an earlier registration."""

    error_code = 77


class PreferredLeaderNotAvailableError(RaylogError):
    """ElectLeaders (preferred) for a partition whose preferred
    replica is not alive or not in the ISR."""

    error_code = 80


class EligibleLeadersNotAvailableError(RaylogError):
    """ElectLeaders (unclean) for a partition none of whose replicas is alive."""

    error_code = 83


class ElectionNotNeededError(RaylogError):
    """ElectLeaders for a partition already led by the replica it would elect."""

    error_code = 84


class DuplicateBrokerRegistrationError(RaylogError):
    """A registration for a broker id whose session, held by another
    incarnation, is still live."""

    error_code = 101


class BrokerIdNotRegisteredError(RaylogError):
    """A heartbeat or request from a broker id the metadata does not hold."""

    error_code = 102


class IneligibleReplicaError(RaylogError):
    """A proposed ISR naming a fenced or shutting-down broker, or an observer."""

    error_code = 107


class InvalidUpdateVersionError(RaylogError):
    """AlterPartition whose partition epoch is not the current one: the
    leader proposed from a stale view of the ISR and must re-read it."""

    error_code = 108


class NotLeaderOrFollowerError(RaylogError):
    """The request went to a replica that is not (or no longer) the leader; pending produce
    requests fail with it when leadership is lost."""

    error_code = 6


class RequestTimedOutError(RaylogError):
    """An acks=all produce not replicated within its timeout, or refused because the bound on
    pending requests was reached (the message says which). Every client retries it."""

    error_code = 7


class NotEnoughReplicasError(RaylogError):
    """acks=all while the committed ISR is below ``min.insync.replicas``: refused before append."""

    error_code = 19


class NotEnoughReplicasAfterAppendError(RaylogError):
    """The ISR shrank below ``min.insync.replicas`` after an acks=all batch was appended."""

    error_code = 20


class InvalidRequiredAcksError(RaylogError):
    """A produce request with acks other than 0, 1 or -1."""

    error_code = 21


class UnknownLeaderEpochError(RaylogError):
    """A request names a leader epoch newer than the replica knows (its metadata is ahead)."""

    error_code = 75


class BrokerNotAvailableError(RaylogError):
    """The actor a call went to (a broker, a replica, a controller) is dead or restarting, as
    Ray reported it (RayActorError); callers look the peer up again or treat it as gone."""

    error_code = 8


class NoReassignmentInProgressError(RaylogError):
    """A reassignment cancelled (or asked about) for a partition that is not being reassigned."""

    error_code = 85


class OutOfOrderSequenceError(RaylogError):
    """An idempotent producer's batch does not continue its sequence (nor repeats a recent
    batch), or a new producer epoch does not start at sequence 0."""

    error_code = 45


class InvalidProducerEpochError(RaylogError):
    """An idempotent producer's batch carries an epoch older than the partition has seen."""

    error_code = 47


class InvalidTxnStateError(RaylogError):
    """A producer's batch does not fit the state of its transaction on the partition (e.g. a
    non-transactional batch from a producer whose transaction is open)."""

    error_code = 48


class TransactionCoordinatorFencedError(RaylogError):
    """A transaction marker from a coordinator epoch older than one the partition has seen
    for that producer: a newer transaction coordinator took over."""

    error_code = 52


class ReassignmentInProgressError(RaylogError):
    """A request that cannot run while partitions are being reassigned (e.g. a rebalance plan)."""

    error_code = 60


class UnsupportedSaslMechanismError(RaylogError):
    """A client asked for a SASL mechanism this listener does not enable."""

    error_code = 33


class SslAuthenticationFailedError(RaylogError):
    """A TLS client's certificate names no principal (no ``ssl.principal.mapping.rules`` rule
    applies, or it does not parse): the gateway closes the connection, as Kafka's brokers do
    (Kafka's SslAuthenticationException has no error code of its own)."""

    error_code = -1


class SaslAuthenticationFailedError(RaylogError):
    """A SASL exchange failed: wrong credentials, or a malformed or out-of-order message. The
    message says which, never a secret; the gateway closes the connection after answering."""

    error_code = 58


class ResourceNotFoundError(RaylogError):
    """A request names a resource that does not exist (e.g. a SCRAM credential to delete)."""

    error_code = 91


class DuplicateResourceError(RaylogError):
    """A request names the same resource twice (e.g. one user in AlterUserScramCredentials)."""

    error_code = 92


class UnacceptableCredentialError(RaylogError):
    """A SCRAM credential Kafka's rules refuse (an empty user name, iterations out of range)."""

    error_code = 93
