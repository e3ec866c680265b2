"""Run a cleaning pass's rewrite in a child process: ``python -m raylog.storage.cleaner_process``.

The rewrite (:func:`raylog.storage.log.rewrite.rewrite_segments`) decodes every record of
the segments it cleans, which is Python work: in a thread of the replica's process it holds
the GIL for most of the pass, and the replica's event loop then waits for the interpreter's
switch interval every time it wants to run, for as long as the pass lasts. In a child process
it competes for a CPU only. It reads segment files and writes ``.cleaned`` files, nothing
else, so the parent keeps the log and does the swap.

Protocol: the parent writes the pickled :class:`~raylog.storage.log.rewrite.RewriteJob` to the
child's stdin; the child writes one pickled ``("ok", Rewritten)`` or ``("error", exception)``
to its stdout and exits. Both ends are this module, from the same installation.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import subprocess
import sys

from raylog.storage.log.rewrite import RewriteJob, Rewritten, rewrite_segments

# Bounds only a child that hangs: far above what a pass over a full segment group takes.
CHILD_TIMEOUT_S = 3600.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def run_in_child(job: RewriteJob) -> Rewritten:
    """:func:`rewrite_segments` in a child process; its exceptions are raised here. A child
    that dies or hangs is a failed pass (nothing to swap in), as a full disk is."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "raylog.storage.cleaner_process"],
            input=pickle.dumps(job),
            capture_output=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Rewritten(0, job.cut, [], 0, -1, failure=f"no answer in {CHILD_TIMEOUT_S} s")
    try:
        status, value = pickle.loads(done.stdout)
    except Exception:  # no answer: the child died (a signal, memory)
        stderr = done.stderr.decode(errors="replace").strip().splitlines()
        reason = stderr[-1] if stderr else "no output"
        return Rewritten(0, job.cut, [], 0, -1, failure=f"child exited {done.returncode}: {reason}")
    if status == "error":
        raise value
    return value


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (a replica killed mid-pass), so no
    orphan goes on rewriting segments; elsewhere, or if the parent is already gone, exit."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def main() -> int:
    _die_with_parent()
    job = pickle.loads(sys.stdin.buffer.read())
    try:
        answer: tuple[str, object] = ("ok", rewrite_segments(job))
    except Exception as exc:  # handed to the parent, which decides
        answer = ("error", exc)
    sys.stdout.buffer.write(pickle.dumps(answer))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
