"""`raylog users` in the caller's process: parsing, where the password comes from, and what
leaves the process.

Proves: `users create` defaults to both SCRAM mechanisms and 8192 iterations, takes repeated
--mechanism, refuses both password sources at once, an unknown mechanism and iterations out of
[4096, 16384]; the password comes from --password-file or --password-stdin (one trailing
newline dropped; empty, oversized or unreadable refused) or from a prompt typed twice on a
terminal (a mismatch refused); with no terminal and no source the command fails with one line
saying how to give it, before anything is sent. What travels to `raylog up`'s command endpoint
(a real loopback endpoint here) is the hidden --scram-credential values only: a fresh 32-byte
salt per mechanism and the salted password, from which the controller's keys check the password;
the password itself is in no argument, no output and no error. `raylog up` running a request
without those values refuses without reading anything; a malformed value is refused without
being shown.
"""

from __future__ import annotations

import argparse
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raylog.actors import raycluster
from raylog.actors.cli import main as cli_main
from raylog.actors.cli import server as cli_server
from raylog.actors.cli import users
from raylog.actors.cli.client import CliError
from raylog.actors.control import metadata as md_
from raylog.actors.control import scram
from raylog.gateway import sasl

PASSWORD = "s3cret pass phrase"


def parse(*argv: str) -> argparse.Namespace:
    return cli_main.build_parser().parse_args(["users", *argv])


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_create_defaults_and_flags() -> None:
    args = parse("create", "alice")
    assert (args.name, args.mechanism, args.iterations) == ("alice", None, 8192)
    assert (args.password_file, args.password_stdin, args.credentials) == (None, False, None)
    args = parse("create", "alice", "--mechanism", "SCRAM-SHA-512", "--mechanism", "SCRAM-SHA-256")
    assert args.mechanism == ["SCRAM-SHA-512", "SCRAM-SHA-256"]
    for bad in (
        ["--password-file", "f", "--password-stdin"],
        ["--mechanism", "PLAIN"],
        ["--iterations", "many"],
    ):
        with pytest.raises(SystemExit):
            parse("create", "alice", *bad)
    assert parse("delete", "alice", "--mechanism", "SCRAM-SHA-256").mechanism == ["SCRAM-SHA-256"]
    assert parse("list", "--json").json


def test_password_from_a_file_or_stdin(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text(PASSWORD + "\n")
    assert users.read_password(parse("create", "a", "--password-file", str(path))) == PASSWORD
    path.write_text(PASSWORD + "\r\n")
    assert users.read_password(parse("create", "a", "--password-file", str(path))) == PASSWORD
    stdin = io.StringIO(PASSWORD + "\n\n")  # only one newline is dropped
    assert users.read_password(parse("create", "a", "--password-stdin"), stdin) == PASSWORD + "\n"
    refusals = {
        "": "empty",
        "\n": "empty",
        "x" * (users.PASSWORD_BYTES_MAX + 1): "over 4096",
    }
    for text, says in refusals.items():
        with pytest.raises(CliError, match=says):
            users.read_password(parse("create", "a", "--password-stdin"), io.StringIO(text))
    with pytest.raises(CliError, match=r"cannot read the password from .*missing"):
        users.read_password(parse("create", "a", "--password-file", str(tmp_path / "missing")))


def test_password_typed_twice_on_a_terminal() -> None:
    typed = iter([PASSWORD, PASSWORD])
    prompts: list[str] = []

    def prompt(text: str) -> str:
        prompts.append(text)
        return next(typed)

    assert users.read_password(parse("create", "alice"), Tty(), prompt) == PASSWORD
    assert prompts == ["Password for alice: ", "Password for alice again: "]
    typed = iter([PASSWORD, PASSWORD + "x"])
    with pytest.raises(CliError, match="differ"):
        users.read_password(parse("create", "alice"), Tty(), lambda _: next(typed))


def test_no_terminal_and_no_source_fails_with_one_clear_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD))  # not a terminal, not asked for
    assert cli_main.main(["users", "create", "alice", "--data-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "raylog: users create needs a password: --password-file PATH, --password-stdin, or a "
        "terminal to type it at\n"
    )


def test_prepare_refuses_bad_iterations_and_a_given_credential() -> None:
    for iterations in ("4095", "16385"):
        with pytest.raises(CliError, match=r"\[4096, 16384\]"):
            users.prepare_create(parse("create", "a", "--iterations", iterations), [])
    given = parse("create", "a", users.CREDENTIAL_FLAG, "x:1:AA==:AA==")
    with pytest.raises(CliError, match="internal"):
        users.prepare_create(given, [])


def _keys_check_the_password(user: str, values: list[str]) -> list[tuple[str, int, bytes]]:
    """Each value stored as the controller stores it (one request each: Kafka refuses a user
    named twice); the stored keys verify PASSWORD and nothing else."""
    stored = []
    for value in values:
        upsertion = md_.ScramUpsertion(*users.parse_credential(user, value))
        empty = md_.ClusterMetadata(cluster_id="c")
        md, results = md_.alter_scram_credentials(empty, [upsertion], [])
        assert results == [(user, 0, "")]
        (record,) = md.scram_credentials[user]
        assert sasl.password_matches(record, PASSWORD)  # type: ignore[arg-type]
        assert not sasl.password_matches(record, PASSWORD[:-1])  # type: ignore[arg-type]
        stored.append((record.mechanism, record.iterations, record.salt))
    return stored


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[Path, list[list[str]]]]:
    """A data dir whose `raylog up` command endpoint (real, loopback) records what it is sent."""
    received: list[list[str]] = []
    lock = threading.Lock()

    def run(argv: list[str]) -> int:
        with lock:
            received.append(argv)
        print("ran")
        return 0

    server = cli_server.CommandServer(run, cli_server.write_token(tmp_path))
    info = raycluster.ClusterInfo("127.0.0.1:1", "", "", os.getpid(), admin_port=server.port)
    raycluster.write_cluster_info(tmp_path, info)
    try:
        yield tmp_path, received
    finally:
        server.close()


def test_only_salted_credentials_reach_the_command_endpoint(
    endpoint: tuple[Path, list[list[str]]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir, received = endpoint
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    argv = ["users", "create", "alice", "--password-stdin", "--data-dir", str(data_dir)]
    assert cli_main.main(argv) == 0
    assert capsys.readouterr().out == "ran\n"
    (sent,) = received
    assert PASSWORD not in " ".join(sent)
    args = cli_main.build_parser().parse_args(sent)  # as `raylog up` parses it
    assert args.name == "alice" and len(args.credentials) == 2
    stored = _keys_check_the_password("alice", args.credentials)
    assert [(m, i) for m, i, _ in stored] == [
        (scram.SCRAM_SHA_256, 8192),
        (scram.SCRAM_SHA_512, 8192),
    ]
    salts = [salt for _, _, salt in stored]
    assert all(len(s) == users.SALT_BYTES for s in salts) and salts[0] != salts[1]


def test_up_runs_no_create_without_the_salted_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_reading(*_: Any) -> str:
        raise AssertionError("`raylog up` read a password")

    monkeypatch.setattr(users, "read_password", no_reading)
    args = parse("create", "alice", "--password-stdin")
    with pytest.raises(CliError, match="own process"):
        users.cmd_create(args)
    for value in ("SCRAM-SHA-256:8192:AA==", "SCRAM-SHA-256:many:AA==:AA==", "a:1:!!:AA=="):
        with pytest.raises(CliError) as refused:
            users.parse_credential("alice", value)
        assert value not in str(refused.value)


def test_credential_args_salt_each_mechanism_afresh() -> None:
    salts = iter([b"a" * 32, b"b" * 32])
    values = users.credential_args(
        [scram.SCRAM_SHA_512, scram.SCRAM_SHA_256], 4096, PASSWORD, lambda n: next(salts)
    )
    stored = _keys_check_the_password("bob", values)
    assert stored == [
        (scram.SCRAM_SHA_512, 4096, b"a" * 32),
        (scram.SCRAM_SHA_256, 4096, b"b" * 32),
    ]
