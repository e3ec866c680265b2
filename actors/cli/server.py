"""`raylog up` runs the other commands: the CLI's fast path, without joining Ray.

A command such as `raylog topics describe` needs the controllers' answers. Joining Ray as a
driver for each command (importing Ray, connecting, Ray's serializer set-up) is most of what a
command takes (benchmarks/cli.py measures both paths). `raylog up` is a Ray driver already: it
serves commands on a loopback HTTP endpoint and runs them with its own connection, so a command
is an HTTP call and never imports Ray. Kafka's tools work the same way: they ask a running
broker, not the cluster's internals.

- The endpoint listens on 127.0.0.1 at a port the OS picks, written to ``cluster.json``
  (``admin_port``). A request carries the command's arguments as JSON and the cluster's admin
  token (``admin-token`` in the data dir, mode 0600, made anew by every `raylog up`); without
  the token the answer is 401 and nothing runs.
- The answer is the command's exit code and what it wrote to stdout and stderr. Each request
  runs in its own thread; what a command prints is routed to that request by a per-thread
  stream (:class:`ThreadRoutedStream`), so concurrent commands and the cluster's own lines do
  not mix. The answer is a stream of JSON lines: what the command writes to stderr as it
  writes it (``{"stderr": text}``: progress of a long wait, such as `topics create`'s), then
  ``{"code", "stdout", "stderr"}`` once it returned.
- The CLI falls back to joining Ray itself when ``cluster.json`` names no endpoint or nothing
  listens on it (a connection refused before the request is sent). A request that was sent and
  then failed is reported, never retried: the command may have run.
"""

from __future__ import annotations

import contextlib
import hmac
import http.client
import io
import json
import os
import secrets
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

HOST = "127.0.0.1"
TOKEN_FILE = "admin-token"
PATH = "/v1/command"
TOKEN_HEADER = "X-Raylog-Token"
REQUEST_BYTES_MAX = 64 << 10  # a command line, as JSON
# A command's own waits are bounded (reassignments by their --timeout, at most an hour); the
# client waits a little longer than the longest of them.
CLIENT_TIMEOUT_S = 3900.0
CONNECT_TIMEOUT_S = 5.0
ANSWER_LINE_BYTES_MAX = 64 << 20  # one line of the answer (the last carries all of stdout)
STREAM_TYPE = "application/x-ndjson"

Runner = Callable[[list[str]], int]


class ThreadRoutedStream(io.TextIOBase):
    """A ``sys.stdout``/``sys.stderr`` stand-in: a thread that set a target (:meth:`capture`)
    writes there, every other thread to the stream this replaced."""

    def __init__(self, default: TextIO) -> None:
        self.default = default
        self._local = threading.local()

    def writable(self) -> bool:
        return True

    def _target(self) -> TextIO:
        return getattr(self._local, "target", None) or self.default

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    @contextlib.contextmanager
    def capture(self, target: TextIO) -> Any:
        self._local.target = target
        try:
            yield
        finally:
            self._local.target = None


_ROUTING_LOCK = threading.Lock()


def _routed(name: str) -> ThreadRoutedStream:
    """``sys.stdout`` or ``sys.stderr`` as it is now, made a :class:`ThreadRoutedStream`."""
    with _ROUTING_LOCK:
        current = getattr(sys, name)
        if not isinstance(current, ThreadRoutedStream):
            current = ThreadRoutedStream(current)
            setattr(sys, name, current)
        return current


def write_token(data_dir: Path) -> str:
    """A new admin token for this `raylog up`, readable by the data dir's owner only."""
    token = secrets.token_hex(32)
    path = data_dir / TOKEN_FILE
    tmp = data_dir / (TOKEN_FILE + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.replace(tmp, path)
    return token


class CommandServer:
    """The endpoint of one `raylog up`; :meth:`close` stops it (commands running finish)."""

    def __init__(self, run: Runner, token: str, host: str = HOST, port: int = 0) -> None:
        self._run = run
        self._token = token.encode()
        self._closed = threading.Event()
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        threading.Thread(
            target=self._httpd.serve_forever, name="raylog-cli-server", daemon=True
        ).start()

    def close(self) -> None:
        self._closed.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def execute(
        self, argv: list[str], on_stderr: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """Runs one command in this thread, its output captured; ``on_stderr`` is handed
        each write to stderr as it happens."""
        out, err = io.StringIO(), _Forwarding(on_stderr)
        # Routed at each command: whoever replaced sys.stdout since (a test's capture) is kept.
        with _routed("stdout").capture(out), _routed("stderr").capture(err):
            try:
                code = int(self._run(argv))
            except SystemExit as e:  # argparse: usage errors exit 2 after printing why
                code = e.code if isinstance(e.code, int) else 2
            except Exception as e:  # a bug in a command: reported, the cluster stays up
                print(f"raylog: {type(e).__name__}: {e}", file=err)
                code = 1
        return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # requests are not the cluster's news

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                if self.path != PATH:
                    return self._answer(404, {"error": f"no such endpoint {self.path}"})
                given = self.headers.get(TOKEN_HEADER, "").encode()
                if not hmac.compare_digest(given, server._token):
                    return self._answer(401, {"error": "wrong or missing admin token"})
                try:
                    length = int(self.headers.get("Content-Length", "-1"))
                except ValueError:
                    length = -1
                if not 0 <= length <= REQUEST_BYTES_MAX:
                    return self._answer(413, {"error": f"a request is 0..{REQUEST_BYTES_MAX} B"})
                try:
                    argv = json.loads(self.rfile.read(length))["argv"]
                except (ValueError, KeyError, TypeError):
                    argv = None
                if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                    return self._answer(400, {"error": 'the body is {"argv": [strings]}'})
                if argv[:1] == ["up"]:
                    return self._answer(400, {"error": "up is not run by a running cluster"})
                if server._closed.is_set():
                    return self._answer(503, {"error": "the cluster is stopping"})
                # The body ends when the connection closes (HTTP/1.0), one JSON line at a time.
                self.send_response(200)
                self.send_header("Content-Type", STREAM_TYPE)
                self.end_headers()
                gone = threading.Event()  # the client went away: the command still finishes

                def line(body: dict[str, Any]) -> None:
                    if gone.is_set():
                        return
                    try:
                        self.wfile.write(json.dumps(body).encode() + b"\n")
                        self.wfile.flush()
                    except OSError:
                        gone.set()

                line(server.execute(argv, lambda text: line({"stderr": text})))

        return Handler


class _Forwarding(io.StringIO):
    """A captured stream that also hands every write to ``forward`` (when given)."""

    def __init__(self, forward: Callable[[str], None] | None) -> None:
        super().__init__()
        self._forward = forward

    def write(self, text: str) -> int:
        written = super().write(text)
        if self._forward is not None and text:
            self._forward(text)
        return written


class NotServed(Exception):
    """Nothing took the request: the caller may run the command some other way."""


def request(
    port: int,
    token: str,
    argv: list[str],
    host: str = HOST,
    on_stderr: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Has the `raylog up` listening on ``port`` run ``argv``; its code, stdout and stderr
    (all of it); ``on_stderr`` is handed what the command writes to stderr as it comes.

    Raises :class:`NotServed` when nothing listens (the request never left), ``OSError`` or
    ``ValueError`` when it failed after it was sent.
    """
    body = json.dumps({"argv": argv}).encode()
    conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
    try:
        try:
            conn.connect()
        except OSError as e:
            raise NotServed(str(e)) from e
        assert conn.sock is not None
        conn.sock.settimeout(CLIENT_TIMEOUT_S)
        conn.request("POST", PATH, body, {TOKEN_HEADER: token, "Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise ValueError(
                f"the cluster refused the command ({response.status}): "
                f"{response.read(REQUEST_BYTES_MAX).decode(errors='replace')}"
            )
        while True:  # one line per write to stderr; bounded by the command's own waits
            raw = response.readline(ANSWER_LINE_BYTES_MAX)
            if not raw.endswith(b"\n"):
                raise ValueError("the answer ended early or has a line over the limit")
            event = json.loads(raw)
            if "code" in event:
                return dict(event)
            if on_stderr is not None:
                on_stderr(str(event["stderr"]))
    finally:
        conn.close()
