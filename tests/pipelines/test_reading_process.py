"""A reading process keeps megabyte fetch answers on the heap (keep_large_buffers_on_the_heap).

Checked through glibc itself: after the call, an 8 MiB buffer (one fetch answer) is carved
from the heap instead of getting its own fresh mapping (mallinfo2's ``hblks``), in a fresh
Python process each time; a process started with raylog's malloc variables keeps its own.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from raylog.actors.raycluster import MALLOC_ENV

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's"
)

PROBE = """
import ctypes, json, sys
from raylog.pipelines import reading

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
applied = reading.keep_large_buffers_on_the_heap() if sys.argv[1] == "apply" else None
before = libc.mallinfo2().hblks
answer = bytearray(8 << 20)
print(json.dumps({"applied": applied, "new_mappings": libc.mallinfo2().hblks - before}))
"""


def probe(mode: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_joining_keeps_an_8_mib_answer_on_the_heap() -> None:
    assert probe("default") == {"applied": None, "new_mappings": 1}  # glibc maps it alone
    assert probe("apply") == {"applied": True, "new_mappings": 0}


def test_a_process_started_with_the_variables_keeps_its_own() -> None:
    threshold = str(64 << 10)
    assert probe("apply", MALLOC_MMAP_THRESHOLD_=threshold) == {
        "applied": False,
        "new_mappings": 1,
    }
