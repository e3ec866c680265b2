"""The command endpoint of `raylog up` (actors/cli/server.py), over real loopback HTTP.

Proves: a request with the admin token runs the command and returns its exit code, stdout and
stderr; what the command writes to stderr reaches the client while it still runs; two commands
running at once each get only their own output, and what other threads print meanwhile goes to the
process's own streams; a usage error (SystemExit) and a crashing command come back as exit codes 2
and 1 and the server keeps serving; a wrong or missing token, a body that is not ``{"argv":
[strings]}``, an oversized body, `up` itself and another path are refused before anything runs; a
closed port is :class:`NotServed` (the CLI then joins Ray itself); the token file is private to its
owner. The commands here are small functions: the real commands are run through the endpoint by
tests/e2e/test_cli_commands.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raylog.actors.cli import server as cli_server

TOKEN = "t0ken"
PATH = cli_server.PATH


def _runner(argv: list[str]) -> int:
    """echo WORDS: prints them; wait NAME: prints, then waits for the test's event NAME;
    fail: raises; usage: exits 2 like argparse; code N: returns N."""
    match argv:
        case ["echo", *words]:
            print(" ".join(words))
            print("to stderr", file=sys.stderr)
            return 0
        case ["wait", name]:
            print(f"{name} started")
            entered[name].set()
            assert release[name].wait(10), "the test released the command"
            print(f"{name} done")
            return 0
        case ["progress"]:
            print("12/30 partitions ready", file=sys.stderr, flush=True)
            assert release["a"].wait(10), "the test released the command"
            print("done")
            return 0
        case ["fail"]:
            raise RuntimeError("boom")
        case ["usage"]:
            raise SystemExit(2)
        case ["code", n]:
            return int(n)
    return 99


entered = {name: threading.Event() for name in ("a", "b")}
release = {name: threading.Event() for name in ("a", "b")}


@pytest.fixture
def server() -> Iterator[cli_server.CommandServer]:
    for events in (entered, release):
        for event in events.values():
            event.clear()
    stdout, stderr = sys.stdout, sys.stderr
    served = cli_server.CommandServer(_runner, TOKEN)
    try:
        yield served
    finally:
        served.close()
        sys.stdout, sys.stderr = stdout, stderr


def _post(port: int, body: bytes, headers: dict[str, str], path: str = cli_server.PATH) -> tuple:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_command_returns_its_code_and_output(server: cli_server.CommandServer) -> None:
    answer = cli_server.request(server.port, TOKEN, ["echo", "hello", "world"])
    assert answer == {"code": 0, "stdout": "hello world\n", "stderr": "to stderr\n"}
    assert cli_server.request(server.port, TOKEN, ["code", "7"])["code"] == 7


def test_concurrent_commands_keep_their_own_output(
    server: cli_server.CommandServer, capsys: pytest.CaptureFixture[str]
) -> None:
    answers: dict[str, dict] = {}

    def run(name: str) -> None:
        answers[name] = cli_server.request(server.port, TOKEN, ["wait", name])

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    assert entered["a"].wait(10) and entered["b"].wait(10), "both commands run at once"
    print("the process's own line")  # another thread's output while both are capturing
    release["a"].set()
    release["b"].set()
    for t in threads:
        t.join(10)
    assert answers["a"]["stdout"] == "a started\na done\n"
    assert answers["b"]["stdout"] == "b started\nb done\n"
    assert "the process's own line" in capsys.readouterr().out


def test_stderr_reaches_the_client_while_the_command_runs(
    server: cli_server.CommandServer,
) -> None:
    seen = threading.Event()
    streamed: list[str] = []
    answers: list[dict] = []

    def on_stderr(text: str) -> None:
        streamed.append(text)
        seen.set()

    def run() -> None:
        answers.append(cli_server.request(server.port, TOKEN, ["progress"], on_stderr=on_stderr))

    thread = threading.Thread(target=run)
    thread.start()
    assert seen.wait(10), "the progress line arrived"
    assert answers == [], "while the command still runs"
    release["a"].set()
    thread.join(10)
    assert "".join(streamed) == "12/30 partitions ready\n"
    assert answers == [{"code": 0, "stdout": "done\n", "stderr": "12/30 partitions ready\n"}]


def test_failures_come_back_as_exit_codes(server: cli_server.CommandServer) -> None:
    crashed = cli_server.request(server.port, TOKEN, ["fail"])
    assert crashed["code"] == 1 and "RuntimeError: boom" in crashed["stderr"]
    assert cli_server.request(server.port, TOKEN, ["usage"])["code"] == 2
    assert cli_server.request(server.port, TOKEN, ["echo", "still"])["stdout"] == "still\n"


@pytest.mark.parametrize(
    ("body", "headers", "path", "status"),
    [
        (b'{"argv": ["echo", "x"]}', {}, cli_server.PATH, 401),
        (b'{"argv": ["echo", "x"]}', {cli_server.TOKEN_HEADER: "wrong"}, cli_server.PATH, 401),
        (b"garbage", {cli_server.TOKEN_HEADER: TOKEN}, cli_server.PATH, 400),
        (b'{"argv": ["echo", 1]}', {cli_server.TOKEN_HEADER: TOKEN}, cli_server.PATH, 400),
        (b'{"argv": ["up"]}', {cli_server.TOKEN_HEADER: TOKEN}, cli_server.PATH, 400),
        (b"x" * (cli_server.REQUEST_BYTES_MAX + 1), {cli_server.TOKEN_HEADER: TOKEN}, PATH, 413),
        (b'{"argv": ["echo", "x"]}', {cli_server.TOKEN_HEADER: TOKEN}, "/other", 404),
    ],
)
def test_bad_requests_are_refused_and_run_nothing(
    server: cli_server.CommandServer, body: bytes, headers: dict, path: str, status: int
) -> None:
    got, answer = _post(server.port, body, headers, path)
    assert got == status and "error" in answer
    with pytest.raises(ValueError, match="refused"):
        cli_server.request(server.port, "wrong", ["echo", "x"])
    assert cli_server.request(server.port, TOKEN, ["echo", "ok"])["stdout"] == "ok\n"


def test_a_closed_port_is_not_served() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(cli_server.NotServed):
            cli_server.request(port, TOKEN, ["echo", "x"])


def test_the_token_file_is_private(tmp_path: Path) -> None:
    first = cli_server.write_token(tmp_path)
    second = cli_server.write_token(tmp_path)
    path = tmp_path / cli_server.TOKEN_FILE
    assert first != second and path.read_text() == second
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
