"""`raylog links` in the caller's process: parsing, and where a link's secrets come from.

Proves: `links create` parses its bootstrap, mode, regexes and configs; a secret config
(`sasl.password`, `sasl.jaas.config`) given with --config is refused with a message saying to
use --config-file, before anything is sent; --config-file is read in the caller's process as a
properties file (comments and blank lines skipped; a line without `=` and an unreadable file
refused with the path) and its entries travel on as the hidden --file-config arguments, which
a user cannot give directly; --config values win over the file's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raylog.actors.cli import links
from raylog.actors.cli import main as cli_main
from raylog.actors.cli.client import CliError


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return cli_main.build_parser().parse_args(list(argv))


def test_create_parses_and_refuses_secrets_on_the_command_line() -> None:
    args = parse(
        "links", "create", "east", "--bootstrap", "h:1,h:2", "--topics", "o.*",
        "--config", "sasl.username=alice",
    )  # fmt: skip
    assert args.mode == "async" and args.topics == "o.*" and args.func is links.cmd_create
    args.file_configs = []
    assert links._configs(args) == {"sasl.username": "alice"}
    bad = parse("links", "create", "east", "--bootstrap", "h:1", "--config", "sasl.password=x")
    bad.file_configs = []
    with pytest.raises(CliError, match="--config-file"):
        links._configs(bad)


def test_config_file_is_read_here_and_travels_hidden(tmp_path: Path) -> None:
    secret = "pa=ss word"
    path = tmp_path / "link.properties"
    path.write_text(
        f"# the source\n\nsecurity.protocol=SASL_SSL\nsasl.password={secret}\nsasl.username = bob\n"
    )
    argv = ["links", "create", "east", "--bootstrap", "h:1", "--config-file", str(path),
            "--config", "sasl.username=alice"]  # fmt: skip
    args = parse(*argv)
    out = links.prepare_configs(args, argv)
    assert out[: len(argv)] == argv and out.count(links.FILE_CONFIG_FLAG) == 3
    # What `raylog up` parses from the forwarded argv: the file's entries, under --config.
    served = parse(*out)
    assert links._configs(served) == {
        "security.protocol": "SASL_SSL",
        "sasl.password": secret,
        "sasl.username": "alice",
    }
    with pytest.raises(CliError, match="internal"):
        links.prepare_configs(served, out)


def test_bad_config_files_are_refused_with_their_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol\n")
    with pytest.raises(CliError, match=r"bad.properties:1"):
        links.read_properties(bad)
    with pytest.raises(CliError, match="cannot read"):
        links.read_properties(tmp_path / "missing.properties")
