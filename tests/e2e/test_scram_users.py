"""SCRAM users on a live `raylog up`: `raylog users` and the clients' admin classes manage the
same credentials, kept in the cluster metadata as keys only.

On the session's shared embedded cluster. Proves:

- `raylog users create --password-stdin` (through `raylog up`'s command endpoint) creates a
  user with both SCRAM mechanisms at 8192 iterations; confluent-kafka's AdminClient
  (``alter_user_scram_credentials``) and kafka-python's KafkaAdminClient create users through
  a broker's gateway (AlterUserScramCredentials v0, forwarded to the controller);
- every one of them is listed alike by ``describe_user_scram_credentials`` (both clients; an
  unknown user is RESOURCE_NOT_FOUND) and by `raylog users list` (table and ``--json``);
- `raylog users delete --mechanism` removes one credential, a client's deletion another, and
  `raylog users delete` (all mechanisms) a user; deleting what is gone fails with one line;
- the metadata document in the object store holds the users' salts and keys, and neither the
  password nor its base64 appears in it, in any file of the data dir, nor in what `raylog up`
  and the commands printed.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka.admin import KafkaAdminClient
from kafka.admin._users import UserScramCredentialUpsertion as KpUpsertion
from support.cluster import RAYLOG, UpProcess, cli_env

from raylog.actors.control.metadata_store import MetadataStore
from raylog.storage.objectstore import open_object_store

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0
PASSWORD = "e2e-Pa55-phrase-never-stored"
SHA_256, SHA_512 = "SCRAM-SHA-256", "SCRAM-SHA-512"
DATA_FILE_BYTES_MAX = 64 << 20  # larger files (none expected) are not scanned


@pytest.fixture(scope="module")
def up(shared_up: UpProcess) -> UpProcess:
    return shared_up


def raylog(up: UpProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RAYLOG, *args, "--data-dir", str(up.data_dir)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=cli_env(),
    )


def ok(proc: subprocess.CompletedProcess[str], printed: list[str]) -> str:
    printed.extend((proc.stdout, proc.stderr))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def listed(up: UpProcess, printed: list[str]) -> dict[str, dict[str, int]]:
    return json.loads(ok(raylog(up, "users", "list", "--json"), printed))


def described_by_both(up: UpProcess, admin: AdminClient, kp: KafkaAdminClient) -> dict[str, Any]:
    ck = admin.describe_user_scram_credentials().result(timeout=TIMEOUT_S)
    from_ck = {
        user: {i.mechanism.name.replace("_", "-"): i.iterations for i in d.scram_credential_infos}
        for user, d in ck.items()
    }
    from_kp = {
        user: {
            i["mechanism"].name.replace("_", "-"): i["iterations"] for i in d["credential_infos"]
        }
        for user, d in kp.describe_user_scram_credentials().items()
    }
    assert from_ck == from_kp
    return from_ck


def test_users_from_the_cli_and_both_admin_clients(up: UpProcess) -> None:
    printed: list[str] = []
    admin = AdminClient({"bootstrap.servers": up.bootstrap})
    kp = KafkaAdminClient(bootstrap_servers=up.bootstrap, request_timeout_ms=30_000)
    try:
        ok(raylog(up, "users", "create", "cli-user", "--password-stdin", stdin=PASSWORD), printed)
        upsert = UserScramCredentialUpsertion(
            "ck-user", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), PASSWORD.encode()
        )
        admin.alter_user_scram_credentials([upsert])["ck-user"].result(timeout=TIMEOUT_S)
        kp_upsert = KpUpsertion("kp-user", SHA_256, PASSWORD, iterations=16384)
        assert kp.alter_user_scram_credentials([kp_upsert]) == {"kp-user": None}

        everyone = {
            "cli-user": {SHA_256: 8192, SHA_512: 8192},
            "ck-user": {SHA_512: 4096},
            "kp-user": {SHA_256: 16384},
        }
        assert described_by_both(up, admin, kp) == everyone
        assert listed(up, printed) == everyone
        table = ok(raylog(up, "users", "list"), printed).splitlines()
        assert table[0].split() == ["USER", "MECHANISM", "ITERATIONS"]
        assert sorted(line.split() for line in table[1:]) == sorted(
            [u, m, str(i)] for u, creds in everyone.items() for m, i in creds.items()
        )
        nobody = admin.describe_user_scram_credentials(["nobody"])["nobody"]
        with pytest.raises(KafkaException) as caught:
            nobody.result(timeout=TIMEOUT_S)
        assert caught.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND

        ok(raylog(up, "users", "delete", "cli-user", "--mechanism", SHA_512), printed)
        gone = UserScramCredentialDeletion("ck-user", ScramMechanism.SCRAM_SHA_512)
        admin.alter_user_scram_credentials([gone])["ck-user"].result(timeout=TIMEOUT_S)
        ok(raylog(up, "users", "delete", "kp-user"), printed)
        assert described_by_both(up, admin, kp) == {"cli-user": {SHA_256: 8192}}
        again = raylog(up, "users", "delete", "kp-user")
        assert again.returncode == 1
        assert again.stderr.strip().splitlines()[-1] == (
            "raylog: user 'kp-user' has no SCRAM credentials"
        )
        assert_no_password(up, printed)
    finally:
        kp.close()


def assert_no_password(up: UpProcess, printed: list[str]) -> None:
    store = open_object_store(f"file://{up.data_dir / 'metadata'}")
    stored = MetadataStore(store).load()
    assert stored is not None
    (record,) = stored.metadata.scram_credentials["cli-user"]
    assert (record.mechanism, len(record.salt), len(record.stored_key)) == (SHA_256, 32, 32)
    secrets = [PASSWORD.encode(), base64.b64encode(PASSWORD.encode())]
    for path in Path(up.data_dir).rglob("*"):
        if path.is_file() and path.stat().st_size <= DATA_FILE_BYTES_MAX:
            data = path.read_bytes()
            assert not any(s in data for s in secrets), path
    assert up.lines is not None
    for text in [*printed, *up.lines.seen]:
        assert PASSWORD not in text
