"""Cluster metadata transitions are pure, bump the right epochs, and keep the invariants.

Proves: the document round-trips through JSON and msgpack; every transition returns a new object
and leaves its input untouched; metadata_epoch bumps once per changing transition and not at all
for a no-op; leader_epoch bumps only on leader change and partition_epoch on every partition
change; topic creation validates names, assignments and configs with Kafka's error codes;
CreateTopics and CreatePartitions as requests ask them (``new_topic``, ``new_partitions``) place
replicas unless assigned, and grow a topic with its target replication factor while one of its
partitions is being reassigned.
"""

from __future__ import annotations

import copy

import msgspec
import pytest

from raylog.actors.control import metadata as m
from raylog.actors.control import reassignment
from raylog.actors.control.metadata import ClusterMetadata, PartitionChange, PartitionState
from raylog.storage.errors import (
    BrokerIdNotRegisteredError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)


def cluster(n: int = 3, racks: str = "abc") -> ClusterMetadata:
    md = ClusterMetadata(cluster_id="c1")
    for b in range(1, n + 1):
        md = m.register_broker(md, b, f"inc{b}", racks[(b - 1) % len(racks)], "127.0.0.1", 9091 + b)
    return md


def with_topic(md: ClusterMetadata, name: str = "t", assignment=((1, 2, 3), (2, 3, 1))):
    return m.create_topic(md, name, f"id-{name}", [list(r) for r in assignment])


def test_round_trips_json_and_msgpack() -> None:
    md = with_topic(cluster())
    md = m.alter_configs(md, "t", {"retention.ms": "-1"})
    assert m.decode_json(m.encode_json(md)) == md
    assert m.decode_msgpack(m.encode_msgpack(md)) == md
    assert b'"leader_epoch"' in m.encode_json(md)


def test_decode_refuses_a_document_that_breaks_an_invariant() -> None:
    md = with_topic(cluster())
    bad = msgspec.json.encode(md).replace(b'"isr":[1,2,3]', b'"isr":[]', 1)
    with pytest.raises(AssertionError, match="ISR empty"):
        m.decode_json(bad)


def test_register_assigns_growing_broker_epochs() -> None:
    md = cluster(2)
    assert md.metadata_epoch == 2
    assert md.brokers[1].broker_epoch == 1 and md.brokers[2].broker_epoch == 2
    assert m.register_broker(md, 1, "inc1", "a", "127.0.0.1", 9092) is md  # a retry
    assert m.active_brokers(md) == [md.brokers[1], md.brokers[2]]


def test_create_topic_starts_isr_from_active_replicas() -> None:
    md = m.set_broker_state(cluster(), 1, "fenced")
    md2 = with_topic(md)
    p0, p1 = md2.topics["t"].partitions
    assert p0.isr == (2, 3) and p0.leader == 2  # broker 1 is fenced: not in the ISR
    assert p1.isr == (2, 3) and p1.leader == 2
    assert (p0.leader_epoch, p0.partition_epoch) == (0, 0)
    assert md2.metadata_epoch == md.metadata_epoch + 1
    assert "t" not in md.topics  # the input is untouched


def test_create_topic_with_observers() -> None:
    md = m.create_topic(cluster(), "t", "id", [[1, 2, 3]], observers=[[3]])
    p = md.topics["t"].partitions[0]
    assert p.observers == (3,) and p.isr == (1, 2) and p.leader == 1


def test_create_topic_refusals() -> None:
    md = cluster()
    for bad in ["", ".", "..", "a" * 250, "has space", "ümlaut"]:
        with pytest.raises(InvalidTopicError):
            with_topic(md, bad)
    md = with_topic(md)
    with pytest.raises(TopicAlreadyExistsError) as exists:
        with_topic(md)
    assert exists.value.error_code == 36
    with pytest.raises(InvalidTopicError, match="collides"):
        with_topic(with_topic(md, "a.b"), "a_b")
    with pytest.raises(InvalidReplicaAssignmentError):
        m.create_topic(md, "u", "u", [[1, 1]])
    with pytest.raises(InvalidReplicaAssignmentError):
        m.create_topic(md, "u", "u", [[1, 9]])
    with pytest.raises(InvalidReplicaAssignmentError):
        m.create_topic(md, "u", "u", [[1, 2], [1]])
    with pytest.raises(InvalidPartitionsError):
        m.create_topic(md, "u", "u", [])
    with pytest.raises(InvalidConfigError):
        m.create_topic(md, "u", "u", [[1]], {"bogus": "1"})
    all_fenced = m.set_broker_state(m.set_broker_state(md, 1, "fenced"), 2, "fenced")
    with pytest.raises(InvalidReplicationFactorError, match="none of its voting replicas"):
        m.create_topic(all_fenced, "u", "u", [[1, 2]])


def test_delete_topic_and_unknown_topics() -> None:
    md = with_topic(cluster())
    md2 = m.delete_topic(md, "t")
    assert "t" not in md2.topics and "t" in md.topics
    with pytest.raises(UnknownTopicOrPartitionError) as e:
        m.delete_topic(md2, "t")
    assert e.value.error_code == 3
    with pytest.raises(UnknownTopicOrPartitionError):
        m.get_partition(md, "t", 2)


def test_add_partitions_appends() -> None:
    md = with_topic(cluster())
    md2 = m.add_partitions(md, "t", [[3, 1, 2]])
    parts = md2.topics["t"].partitions
    assert [p.partition for p in parts] == [0, 1, 2]
    assert parts[2].leader == 3 and parts[2].isr == (3, 1, 2)
    with pytest.raises(InvalidPartitionsError):
        m.add_partitions(md, "t", [])
    with pytest.raises(InvalidReplicaAssignmentError):
        m.add_partitions(md, "t", [[1, 2]])  # the topic's replication factor is 3


def test_new_topic_places_replicas_unless_the_request_assigns_them() -> None:
    md = cluster(3)
    placed = m.new_topic(md, "t", "id-t", 3, 2)
    assert [len(p.replicas) for p in placed.topics["t"].partitions] == [2, 2, 2]
    given = m.new_topic(md, "t", "id-t", 0, 0, {"retention.ms": "1000"}, [[3, 1]])
    assert given.topics["t"].partitions[0].replicas == (3, 1)
    assert given.topics["t"].configs == {"retention.ms": "1000"}
    with pytest.raises(InvalidTopicError):  # the name first: placement cannot fail it
        m.new_topic(md, "bad name", "id", 1, 99)
    with pytest.raises(InvalidReplicationFactorError):
        m.new_topic(md, "t", "id-t", 1, 4)


def test_new_partitions_keep_the_target_replication_factor_during_a_reassignment() -> None:
    """A reassignment in progress lists target and original replicas together; the new
    partitions take the topic's replication factor from the target (the controller's rule,
    which a gateway's validate_only CreatePartitions runs too)."""
    md = with_topic(cluster(4), assignment=((1, 2), (2, 3)))
    moving = reassignment.start(md, {m.TopicPartition("t", 0): [3, 4]}).metadata
    assert moving.topics["t"].partitions[0].replicas == (3, 4, 1, 2)
    grown = m.new_partitions(moving, "t", 3)
    assert len(grown.topics["t"].partitions[2].replicas) == 2
    with pytest.raises(InvalidPartitionsError, match="3 is not more"):
        m.new_partitions(grown, "t", 3)


def test_alter_configs_replaces_overrides_and_is_a_no_op_when_equal() -> None:
    md = with_topic(cluster())
    md2 = m.alter_configs(md, "t", {"min.insync.replicas": "2"})
    assert md2.topics["t"].configs == {"min.insync.replicas": "2"}
    assert m.alter_configs(md2, "t", {"min.insync.replicas": " 2"}) is md2
    md3 = m.alter_configs(md2, "t", {})
    assert md3.topics["t"].configs == {}


def test_epoch_rules_of_partition_changes() -> None:
    md = with_topic(cluster())
    before = copy.deepcopy(md)
    shrink = m.apply_alter_partition(md, "t", 0, (1, 2))
    p = shrink.topics["t"].partitions[0]
    assert (p.leader, p.leader_epoch, p.partition_epoch) == (1, 0, 1)  # ISR change only
    moved = m.apply_election(shrink, [PartitionChange(topic="t", partition=0, leader=2)])
    p = moved.topics["t"].partitions[0]
    assert (p.leader, p.leader_epoch, p.partition_epoch) == (2, 1, 2)
    offline = m.apply_election(moved, [PartitionChange(topic="t", partition=0, leader=-1)])
    p = offline.topics["t"].partitions[0]
    assert (p.leader, p.leader_epoch, p.partition_epoch) == (-1, 2, 3)
    assert offline.metadata_epoch == md.metadata_epoch + 3
    # No-op changes return the same object and bump nothing.
    same = m.apply_partition_changes(offline, [PartitionChange(topic="t", partition=0)])
    assert same is offline
    assert md == before  # inputs never mutate


def test_partition_changes_that_break_invariants_are_refused() -> None:
    md = with_topic(cluster())
    with pytest.raises(AssertionError, match="leader not in the ISR"):
        m.apply_partition_changes(md, [PartitionChange(topic="t", partition=0, isr=(2, 3))])
    with pytest.raises(AssertionError, match="ISR empty"):
        m.apply_partition_changes(md, [PartitionChange(topic="t", partition=0, isr=())])
    with pytest.raises(UnknownTopicOrPartitionError):
        m.apply_partition_changes(md, [PartitionChange(topic="t", partition=5, leader=1)])


def test_check_partition_invariants() -> None:
    ok = PartitionState(partition=0, replicas=(1, 2, 3), isr=(1, 2), observers=(3,), leader=1)
    m.check_partition(ok)
    bad = [
        msgspec.structs.replace(ok, replicas=(1, 1, 3)),
        msgspec.structs.replace(ok, isr=(1, 3)),  # observer in the ISR
        msgspec.structs.replace(ok, isr=(2, 1)),  # not in assignment order
        msgspec.structs.replace(ok, leader=3),
        msgspec.structs.replace(ok, observers=(4,)),
    ]
    for p in bad:
        with pytest.raises(AssertionError):
            m.check_partition(p)


def test_broker_state_and_unregister() -> None:
    md = with_topic(cluster(4), assignment=((1, 2, 3),))
    assert m.set_broker_state(md, 4, "registered") is md
    with pytest.raises(BrokerIdNotRegisteredError):
        m.set_broker_state(md, 9, "fenced")
    assert 4 not in m.unregister_broker(md, 4).brokers
    with pytest.raises(InvalidReplicaAssignmentError, match="still holds 1 replicas"):
        m.unregister_broker(md, 1)


def test_producer_id_blocks_and_controller_epoch() -> None:
    md = cluster(1)
    md, first = m.allocate_producer_ids(md)
    md, second = m.allocate_producer_ids(md)
    assert first == range(0, 1000) and second == range(1000, 2000)
    md = m.take_controllership(md, 3)
    assert md.controller_epoch == 3
    with pytest.raises(AssertionError):
        m.take_controllership(md, 3)
