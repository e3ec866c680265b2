"""`raylog certs`: parsing, and what it refuses before it asks the cluster.

Proves: ``certs ca [--out FILE]`` and ``certs issue NAME --out-dir DIR [--days N]`` parse to
their commands, marked to run in the caller's process (they write files where the caller runs
them, so `raylog up`'s command endpoint must not run them); ``issue`` needs ``--out-dir`` and
defaults to CLIENT_DAYS_DEFAULT days; a name that is no file name or CN, a life out of range and
an existing certificate or key in the directory fail with one line and exit 1 before any cluster
is asked (the data dir here holds none, so asking would fail differently).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raylog.actors.cli import certs
from raylog.actors.cli.main import build_parser, main
from raylog.storage import pki


def test_commands_parse_and_run_here() -> None:
    parser = build_parser()
    ca = parser.parse_args(["certs", "ca"])
    assert (ca.func, ca.out, ca.runs_here) == (certs.cmd_ca, None, True)
    assert parser.parse_args(["certs", "ca", "--out", "ca.pem"]).out == "ca.pem"
    issue = parser.parse_args(["certs", "issue", "alice", "--out-dir", "d", "--days", "7"])
    assert (issue.func, issue.name, issue.out_dir, issue.days) == (certs.cmd_issue, "alice", "d", 7)
    assert issue.runs_here
    assert parser.parse_args(["certs", "issue", "bob", "--out-dir", "d"]).days == (
        pki.CLIENT_DAYS_DEFAULT
    )


@pytest.mark.parametrize(
    "argv",
    [["certs", "issue", "alice"], ["certs"], ["certs", "issue", "--out-dir", "d"]],
)
def test_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2


@pytest.mark.parametrize(
    ("name", "days", "says"),
    [
        ("../alice", "30", "a client certificate name is"),
        (".hidden", "30", "a client certificate name is"),
        ("a" * 65, "30", "a client certificate name is"),
        ("alice bob", "30", "a client certificate name is"),
        ("alice", "0", "lives 1 to 3650 days, not 0"),
        ("alice", "4000", "lives 1 to 3650 days, not 4000"),
    ],
)
def test_bad_names_and_lives_fail_before_the_cluster_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, days: str, says: str
) -> None:
    argv = ["certs", "issue", name, "--out-dir", str(tmp_path / "out"), "--days", days]
    assert main([*argv, "--data-dir", str(tmp_path / "no-cluster")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("raylog: ") and says in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("existing", ["alice.pem", "alice.key"])
def test_existing_files_are_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], existing: str
) -> None:
    (tmp_path / existing).write_text("mine")
    argv = ["certs", "issue", "alice", "--out-dir", str(tmp_path)]
    assert main([*argv, "--data-dir", str(tmp_path / "no-cluster")]) == 1
    assert f"{tmp_path / existing} exists" in capsys.readouterr().err
    assert (tmp_path / existing).read_text() == "mine"
