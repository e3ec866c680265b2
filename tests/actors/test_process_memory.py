"""A process's private memory (USS) as the brokers measure their replicas'."""

from __future__ import annotations

import subprocess
import sys

from raylog.actors.process_memory import private_mib


def test_private_memory_counts_what_only_this_process_holds() -> None:
    before = private_mib()
    assert before is not None and before > 1
    held = b"\x01" * (64 << 20)  # written: 64 MiB of private pages
    after = private_mib()
    assert after is not None and after - before > 48
    del held


def test_a_process_that_is_gone_has_no_figure() -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True, text=True)  # fmt: skip
    assert private_mib(int(child.stdout)) is None
