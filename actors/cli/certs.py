"""`raylog certs ca|issue`: the cluster CA's certificate, and client certificates from it, for
Kafka clients of the gateways' SSL listeners.

``ca`` prints (or writes, ``--out``) the CA certificate that clients trust (librdkafka's
``ssl.ca.location``, Java's truststore). ``issue NAME`` has the controller issue a client
certificate (``CN=NAME``, clientAuth only; the principal ``User:CN=NAME`` under the DEFAULT
``ssl.principal.mapping.rules``) and writes ``NAME.pem``, ``NAME.key`` (mode 0600) and
``ca.pem`` into ``--out-dir``. These commands run in this process (they write files where the
caller runs them), never on `raylog up`'s command endpoint; the private key goes to its file
only, never to the output or the logs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect


def _write(path: Path, data: bytes, mode: int, replace: bool) -> None:
    """Writes ``data`` to ``path`` with ``mode`` (through a temp file, renamed into place);
    refuses an existing file unless ``replace``."""
    if path.exists() and not replace:
        raise CliError(f"{path} exists: remove it or choose another --out-dir")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CliError(f"cannot write {path}: {e.strerror}") from None


def cmd_ca(args: argparse.Namespace) -> int:
    pem: bytes = call(connect(args), "ca_certificate")
    if args.out is None:
        print(pem.decode(), end="", flush=True)
        return 0
    out = Path(args.out).expanduser().absolute()
    _write(out, pem, 0o644, replace=True)
    print(f"Wrote the cluster CA certificate to {out}", flush=True)
    return 0


def cmd_issue(args: argparse.Namespace) -> int:
    from raylog.storage.pki import check_client_certificate

    try:
        check_client_certificate(args.name, args.days)
    except ValueError as e:
        raise CliError(str(e)) from None
    out_dir = Path(args.out_dir).expanduser().absolute()
    cert_path, key_path = out_dir / f"{args.name}.pem", out_dir / f"{args.name}.key"
    for path in (cert_path, key_path):
        if path.exists():
            raise CliError(f"{path} exists: remove it or choose another --out-dir")
    try:
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise CliError(f"cannot create {out_dir}: {e.strerror}") from None
    leaf = call(connect(args), "issue_client_certificate", args.name, args.days)
    _write(key_path, leaf.key_pem, 0o600, replace=False)
    _write(cert_path, leaf.cert_pem, 0o644, replace=False)
    _write(out_dir / "ca.pem", leaf.ca_pem, 0o644, replace=True)
    print(
        f"Issued a client certificate for CN={args.name}, valid {args.days} days:\n"
        f"  certificate  {cert_path}\n  private key  {key_path} (mode 0600)\n"
        f"  cluster CA   {out_dir / 'ca.pem'}",
        flush=True,
    )
    return 0


def add_subcommands(sub: Any) -> None:
    """Adds ``certs`` to ``raylog``'s subparsers."""
    from raylog.storage.pki import CLIENT_DAYS_DEFAULT

    certs = sub.add_parser("certs", help="the cluster CA and client certificates for TLS")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True)
    ca = certs_sub.add_parser("ca", help="the cluster CA certificate (PEM), for ssl.ca.location")
    ca.add_argument("--out", metavar="FILE", help="write it to FILE instead of printing it")
    ca.set_defaults(func=cmd_ca, runs_here=True)
    add_cluster_args(ca)
    issue = certs_sub.add_parser("issue", help="a client certificate from the cluster CA")
    issue.add_argument("name", metavar="NAME", help="the certificate's CN and file names")
    issue.add_argument("--out-dir", required=True, metavar="DIR", help="where the files go")
    issue.add_argument(
        "--days", type=int, default=CLIENT_DAYS_DEFAULT, help="its life (default %(default)s)"
    )
    issue.set_defaults(func=cmd_issue, runs_here=True)
    add_cluster_args(issue)
