"""Client security on a real `raylog up`: SASL_SSL and SSL listeners beside PLAINTEXT, used by
every client of the compatibility suite without changes.

On the session's security cluster (tests/support/secure_cluster.py; shared with
test_acls_matrix_live.py): two brokers with PLAINTEXT on loopback for raylog's own tools,
SASL_SSL, and SSL with ``ssl.client.auth=required`` (and SASL_PLAINTEXT, the ACL matrix's), the
super user ``admin`` made with `raylog users create`, the CA exported with `raylog certs ca` and
a client certificate issued with `raylog certs issue`. Proves:

- confluent-kafka, kafka-python, aiokafka, kcat (librdkafka 2.0, whose SCRAM repeats its nonce)
  and kafkajs produce and consume over SASL_SSL with SCRAM-SHA-512 and with PLAIN (most with
  SCRAM-SHA-256 too), and Metadata sends each client to the brokers' SASL_SSL addresses, never
  to another listener's;
- each of them produces and consumes over SSL with a client certificate of the cluster CA;
- a wrong password, an unknown user, a client without a certificate or with one from another
  CA, and a plaintext client on a TLS port are each refused, and the cluster keeps serving the
  others; the gateways log the refused user and address, and no log holds the password;
- with the StandardAuthorizer on, ACLs decide for the authenticated principals (a SCRAM user,
  a certificate's subject): a prefixed READ lets a user consume, a literal DENY on WRITE beats a
  prefixed ALLOW (TOPIC_AUTHORIZATION_FAILED, nothing written), and removing the DENY with
  `raylog acls remove` lets the same producer write within the gateways' refresh.

The cluster also runs with ``auto.create.topics.enable=true`` (``num.partitions=2``,
``default.replication.factor=2``), so it proves Metadata auto-creation too: a producer (the
super user's) writing to an unknown topic creates it with those defaults, while a producer with
``allow.auto.create.topics=false`` gets UNKNOWN_TOPIC_OR_PART and creates nothing. (The default,
off, is proven in ``test_admin_clients.py``.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.cluster import UpProcess
from support.secure_cluster import (
    BROKERS,
    SUPER_PASSWORD,
    SUPER_USER,
    SecureCluster,
    create_user,
)
from support.waiting import wait_until

from raylog.actors import raycluster
from raylog.storage import pki

pytestmark = pytest.mark.slow

PASSWORD = SUPER_PASSWORD
TOPIC = "secure"
TIMEOUT_S = 60.0
KAFKAJS_DIR = Path(__file__).resolve().parent / "kafkajs"


@dataclass
class Secure:
    up: UpProcess
    sasl_ssl: str  # bootstrap servers of each listener
    ssl: str
    plaintext: str
    ca: Path
    certs: Path  # bob.pem, bob.key (the cluster CA's) and stranger.pem/.key (another CA's)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def secure(
    secure_cluster: SecureCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secure]:
    up = secure_cluster.up
    before = up.topics()
    work = tmp_path_factory.mktemp("secure-client")
    _ok(up.raylog("certs", "ca", "--out", str(work / "ca.pem")))
    _ok(up.raylog("certs", "issue", "bob", "--out-dir", str(work / "certs")))
    stranger = pki.CertificateAuthority.generate("another cluster").issue("bob", server=False)
    (work / "certs" / "stranger.pem").write_bytes(stranger.cert_pem)
    (work / "certs" / "stranger.key").write_bytes(stranger.key_pem)
    _ok(up.raylog("topics", "create", TOPIC, "--partitions", "2", "--replication-factor", "2"))
    # bob (his certificate's principal) may do anything with the topic; admin is a super
    # user; nobody else may do anything (no allow.everyone.if.no.acl.found).
    _ok(up.raylog("acls", "add", "--principal", "User:CN=bob", "--operation", "ALL",
                  "--topic", TOPIC))  # fmt: skip
    _ok(up.raylog("acls", "add", "--principal", "User:CN=bob", "--operation", "READ",
                  "--group", "g-", "--prefixed"))  # fmt: skip
    yield Secure(
        up,
        sasl_ssl=secure_cluster.sasl_ssl,
        ssl=secure_cluster.ssl,
        plaintext=secure_cluster.plaintext,
        ca=work / "ca.pem",
        certs=work / "certs",
    )
    # The next module on the cluster does not hold this one's replicas (a process each).
    created = sorted(up.topics() - before - {"__consumer_offsets", "__transaction_state"})
    if created:
        _ok(up.raylog("topics", "delete", *created))


def _confluent(secure: Secure, protocol: str, **extra: str) -> dict[str, str]:
    config = {"security.protocol": protocol, "ssl.ca.location": str(secure.ca), **extra}
    config["bootstrap.servers"] = secure.sasl_ssl if protocol == "SASL_SSL" else secure.ssl
    return config


def _sasl(secure: Secure, mechanism: str, user: str = SUPER_USER, password: str = PASSWORD) -> Any:
    return _confluent(
        secure,
        "SASL_SSL",
        **{"sasl.mechanisms": mechanism, "sasl.username": user, "sasl.password": password},
    )


def _bob(secure: Secure, name: str = "bob") -> dict[str, str]:
    return _confluent(
        secure,
        "SSL",
        **{
            "ssl.certificate.location": str(secure.certs / f"{name}.pem"),
            "ssl.key.location": str(secure.certs / f"{name}.key"),
        },
    )


def confluent_roundtrip(config: dict[str, str], tag: str, count: int = 30) -> list[str]:
    """Produce ``count`` values tagged ``tag`` (acks=all), then read back those with the tag."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    producer = Producer({**config, "acks": "all"})
    sent = [f"{tag}-{i}" for i in range(count)]
    for value in sent:
        producer.produce(TOPIC, value=value.encode())
    assert producer.flush(TIMEOUT_S) == 0
    # Assigned, not subscribed: no group rebalance to wait for (the groups' own tests cover it).
    consumer = Consumer({**config, "group.id": f"g-{tag}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(2)])
    received: list[str] = []

    def all_read() -> bool:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            value = message.value().decode()
            if value.startswith(f"{tag}-"):
                received.append(value)
        return len(received) >= count

    try:
        wait_until(all_read, timeout_s=TIMEOUT_S, interval_s=0, message=f"{tag}: every record")
    finally:
        consumer.close()
    return received


def confluent_roundtrip_read(config: dict[str, str], prefix: str) -> list[str]:
    """Every value starting with ``prefix`` in the topic, read with assign from the start
    until both partitions' ends."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({**config, "group.id": "readers", "enable.auto.commit": False})
    partitions = [TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(2)]
    ends = {
        p.partition: consumer.get_watermark_offsets(p, timeout=TIMEOUT_S)[1] for p in partitions
    }
    consumer.assign(partitions)
    read: list[str] = []
    positions = dict.fromkeys(ends, 0)

    def at_ends() -> bool:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            positions[message.partition()] = message.offset() + 1
            if message.value().decode().startswith(prefix):
                read.append(message.value().decode())
        return all(positions[p] >= end for p, end in ends.items())

    try:
        wait_until(at_ends, timeout_s=TIMEOUT_S, interval_s=0, message="both partitions read")
    finally:
        consumer.close()
    return read


def brokers_seen(config: dict[str, str]) -> set[str]:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient(config).list_topics(timeout=TIMEOUT_S)
    return {f"{b.host}:{b.port}" for b in metadata.brokers.values()}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_confluent_kafka_over_sasl_ssl(secure: Secure, mechanism: str) -> None:
    config = _sasl(secure, mechanism)
    tag = f"ck-{mechanism}"
    assert sorted(confluent_roundtrip(config, tag)) == sorted(f"{tag}-{i}" for i in range(30))
    assert brokers_seen(config) == set(secure.sasl_ssl.split(","))


def test_confluent_kafka_over_ssl_with_a_client_certificate(secure: Secure) -> None:
    config = _bob(secure)
    assert len(confluent_roundtrip(config, "ck-ssl")) == 30
    assert brokers_seen(config) == set(secure.ssl.split(","))


def _kafka_python(secure: Secure, **security: Any) -> list[str]:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaTopicPartition

    tag = f"kp-{security.get('sasl_mechanism', 'ssl')}"
    producer = KafkaProducer(acks="all", **security)
    for i in range(20):
        producer.send(TOPIC, f"{tag}-{i}".encode())
    producer.flush(TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(consumer_timeout_ms=10_000, **security)
    consumer.assign([KafkaTopicPartition(TOPIC, p) for p in range(2)])
    consumer.seek_to_beginning()
    got: list[str] = []
    try:
        for message in consumer:  # ends when every tagged record is read, or after 10 s idle
            if message.value.decode().startswith(f"{tag}-"):
                got.append(message.value.decode())
                if len(got) == 20:
                    break
        assert {b.port for b in consumer._client.cluster.brokers()} <= {
            int(a.split(":")[1]) for a in security["bootstrap_servers"].split(",")
        }
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_kafka_python_over_sasl_ssl(secure: Secure, mechanism: str) -> None:
    got = _kafka_python(
        secure,
        bootstrap_servers=secure.sasl_ssl,
        security_protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_plain_username=SUPER_USER,
        sasl_plain_password=PASSWORD,
        ssl_cafile=str(secure.ca),
    )
    assert len(got) == 20


def test_kafka_python_over_ssl_with_a_client_certificate(secure: Secure) -> None:
    got = _kafka_python(
        secure,
        bootstrap_servers=secure.ssl,
        security_protocol="SSL",
        ssl_cafile=str(secure.ca),
        ssl_certfile=str(secure.certs / "bob.pem"),
        ssl_keyfile=str(secure.certs / "bob.key"),
    )
    assert len(got) == 20


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "SSL"])
def test_aiokafka_over_tls(secure: Secure, mechanism: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AioTopicPartition
    from aiokafka.helpers import create_ssl_context

    tag = f"aio-{mechanism}"
    common: dict[str, Any] = {
        "bootstrap_servers": secure.sasl_ssl,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": SUPER_USER,
        "sasl_plain_password": PASSWORD,
    }
    certificate: dict[str, str] = {}
    if mechanism == "SSL":  # a client certificate on the SSL listener
        common = {"bootstrap_servers": secure.ssl, "security_protocol": "SSL"}
        certificate = {
            "certfile": str(secure.certs / "bob.pem"),
            "keyfile": str(secure.certs / "bob.key"),
        }

    def tls() -> Any:
        return create_ssl_context(cafile=str(secure.ca), **certificate)

    async def roundtrip() -> list[str]:
        producer = AIOKafkaProducer(ssl_context=tls(), **common)
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait(TOPIC, f"{tag}-{i}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(ssl_context=tls(), **common)
        await consumer.start()
        consumer.assign([AioTopicPartition(TOPIC, p) for p in range(2)])
        await consumer.seek_to_beginning()
        got: list[str] = []
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while len(got) < 20:
                    batches = await consumer.getmany(timeout_ms=1000)
                    got += [
                        m.value.decode()
                        for records in batches.values()
                        for m in records
                        if m.value.decode().startswith(f"{tag}-")
                    ]
        finally:
            await consumer.stop()
        return got

    assert len(asyncio.run(roundtrip())) == 20


def _kcat(secure: Secure, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kcat", "-X", f"ssl.ca.location={secure.ca}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize(
    "security",
    [
        ("SASL_SSL", "sasl.mechanisms=SCRAM-SHA-256"),
        ("SASL_SSL", "sasl.mechanisms=SCRAM-SHA-512"),
        ("SASL_SSL", "sasl.mechanisms=PLAIN"),
        ("SSL", "ssl.certificate.location={certs}/bob.pem", "ssl.key.location={certs}/bob.key"),
    ],
    ids=["scram-sha-256", "scram-sha-512", "plain", "ssl-certificate"],
)
def test_kcat_over_tls(secure: Secure, security: tuple[str, ...]) -> None:
    protocol, *settings = security
    args = ["-b", secure.sasl_ssl if protocol == "SASL_SSL" else secure.ssl]
    args += ["-X", f"security.protocol={protocol}"]
    for setting in settings:
        args += ["-X", setting.format(certs=secure.certs)]
    if protocol == "SASL_SSL":
        args += ["-X", f"sasl.username={SUPER_USER}", "-X", f"sasl.password={PASSWORD}"]
    tag = f"kcat-{uuid.uuid4().hex[:8]}"
    values = [f"{tag}-{i}" for i in range(10)]
    produced = _kcat(secure, *args, "-P", "-t", TOPIC, "-p", "0", stdin="\n".join(values) + "\n")
    assert produced.returncode == 0, produced.stderr[-2000:]
    consumed = _kcat(secure, *args, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning", "-e", "-q")
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    assert [v for v in consumed.stdout.split() if v.startswith(tag)] == values


@pytest.mark.parametrize("mechanism", ["scram-sha-512", "plain", "ssl"])
def test_kafkajs_over_tls(secure: Secure, kafkajs: Path, mechanism: str) -> None:
    if mechanism == "ssl":  # a client certificate on the SSL listener
        who = [
            secure.ssl,
            TOPIC,
            "ssl",
            str(secure.certs / "bob.pem"),
            str(secure.certs / "bob.key"),
        ]
    else:
        who = [secure.sasl_ssl, TOPIC, mechanism, SUPER_USER, PASSWORD]
    run = subprocess.run(
        [str(kafkajs), "secure.mjs", *who, str(secure.ca)],
        cwd=KAFKAJS_DIR, capture_output=True, text=True, timeout=TIMEOUT_S * 2,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    assert sorted(out["received"]) == sorted(out["sent"])


REFUSED = {
    "wrong password": lambda s: _sasl(s, "SCRAM-SHA-512", password="not-" + PASSWORD),
    "unknown user": lambda s: _sasl(s, "PLAIN", user="mallory"),
    "no certificate": lambda s: _confluent(s, "SSL"),
    "another CA's certificate": lambda s: _bob(s, "stranger"),
    "plaintext on a TLS port": lambda s: {
        "bootstrap.servers": s.sasl_ssl,
        "security.protocol": "PLAINTEXT",
    },
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_clients_and_the_others_still_served(secure: Secure, case: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    with pytest.raises(KafkaException):
        AdminClient(REFUSED[case](secure)).list_topics(timeout=3)
    assert brokers_seen(_sasl(secure, "SCRAM-SHA-512")) == set(secure.sasl_ssl.split(","))
    assert brokers_seen({"bootstrap.servers": secure.plaintext}) == set(secure.plaintext.split(","))


def test_gateways_log_refusals_without_the_password(secure: Secure) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    with pytest.raises(KafkaException):
        AdminClient(_sasl(secure, "PLAIN", user="eve", password="eve-" + PASSWORD)).list_topics(
            timeout=5
        )
    ray_dir = raycluster.ray_temp_dir(secure.up.data_dir)  # where the gateways' logs are
    line = "authentication of user 'eve' (PLAIN) from 127.0.0.1"

    def refusal_logged() -> bool:
        return any(line in p.read_text(errors="replace") for p in ray_dir.rglob("*.err"))

    wait_until(refusal_logged, timeout_s=TIMEOUT_S, interval_s=0.2, message="the refusal logged")
    for path in ray_dir.rglob("*"):
        if path.is_file() and path.suffix in (".err", ".out", ".log"):
            assert PASSWORD not in path.read_text(errors="replace"), path


def _visible_topics(config: dict[str, str]) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient(config).list_topics(timeout=TIMEOUT_S).topics)


def _produce_one(config: dict[str, str], value: str) -> Any:
    """Produce one value (acks=all, no retries); the delivery error, None when written."""
    from confluent_kafka import Producer

    producer = Producer({**config, "acks": "all", "retries": 0})
    outcome: list[Any] = []
    producer.produce(TOPIC, value=value.encode(), on_delivery=lambda e, _m: outcome.append(e))
    assert producer.flush(TIMEOUT_S) == 0
    return outcome[0]


def test_acls_decide_for_authenticated_principals(secure: Secure) -> None:
    from confluent_kafka import KafkaError

    create_user(secure.up, "carol", "carol-" + PASSWORD)
    carol = _sasl(secure, "SCRAM-SHA-512", user="carol", password="carol-" + PASSWORD)
    acl = ("--principal", "User:carol")
    # The DENY first: a gateway that has seen the ALLOW has seen it too (one metadata history).
    _ok(secure.up.raylog("acls", "add", *acl, "--operation", "WRITE", "--deny", "--topic", TOPIC))
    _ok(secure.up.raylog("acls", "add", *acl, "--operation", "READ", "--operation", "WRITE",
                         "--topic", "sec", "--prefixed"))  # fmt: skip
    wait_until(
        lambda: TOPIC in _visible_topics(carol),  # READ implies DESCRIBE: the ALLOW arrived
        timeout_s=TIMEOUT_S,
        interval_s=0.2,
        message="carol's prefixed READ seen by the gateways",
    )
    error = _produce_one(carol, "carol-denied")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    # The prefixed READ holds: carol reads admin's records, and hers was not written.
    tag = "by-admin"
    confluent_roundtrip(_sasl(secure, "SCRAM-SHA-512"), tag, count=5)
    read = confluent_roundtrip_read(carol, "")
    assert {f"{tag}-{i}" for i in range(5)} <= set(read)
    assert "carol-denied" not in read
    _ok(secure.up.raylog("acls", "remove", *acl, "--operation", "WRITE", "--deny",
                         "--topic", TOPIC))  # fmt: skip
    wait_until(
        lambda: _produce_one(carol, "carol-allowed") is None,
        timeout_s=TIMEOUT_S,
        interval_s=0.2,
        message="carol's WRITE allowed once the DENY is gone",
    )
    assert "carol-allowed" in confluent_roundtrip_read(carol, "carol-allowed")


def _produce_to(config: dict[str, str], topic: str, **extra: Any) -> list[Any]:
    """Produce one record to ``topic``; the delivery errors."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **config,
            "acks": "all",
            "message.timeout.ms": 120000,  # a new topic's replicas may be slow to start
            "topic.metadata.propagation.max.ms": 1000,
            **extra,
        }
    )
    errors: list[Any] = []
    producer.produce(topic, b"v", on_delivery=lambda err, _m: errors.append(err))
    assert producer.flush(180) == 0
    return [e for e in errors if e is not None]


def test_metadata_auto_creation(secure: Secure) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    super_user = _sasl(secure, "SCRAM-SHA-512")  # CREATE on the cluster
    admin = AdminClient(super_user)
    resource = ConfigResource(ResourceType.BROKER, "1")
    entries = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    assert entries["auto.create.topics.enable"].value == "true"
    refused = _produce_to(super_user, "not-made", **{"allow.auto.create.topics": False})
    assert [e.code() for e in refused] == [KafkaError.UNKNOWN_TOPIC_OR_PART]
    assert _produce_to(super_user, "auto-made") == []
    topics = admin.list_topics(timeout=TIMEOUT_S).topics
    assert "not-made" not in topics
    assert sorted(topics["auto-made"].partitions) == [0, 1]
    assert all(len(p.replicas) == BROKERS for p in topics["auto-made"].partitions.values())
