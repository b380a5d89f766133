"""Waits of the deployment tests: on events, with a generous ceiling that restarts on progress.

A deployment test waits for something to *happen* (a checkpoint written, a round
completed, a thread finished).  On a loaded machine it happens later, not never:
each wait here fails only after ``STALL`` seconds in which the run showed no
progress (its ``status.json`` or its checkpoint did not change), so a slow
machine makes the tests slower, not red.

``STALL`` is tens of seconds: with the project's node loop an exchange takes well under a
second on loopback (docs/flower.md, "The node loop"), and the slowest step without progress
is a deployment's start-up (the ServerApp's first status, ≈ 5-20 s on a loaded 2-core machine).
A broken run so fails a test within a minute instead of stalling it for ten.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

#: seconds without any progress before a wait fails
STALL = 60.0


def run_progress(*paths):
    """A progress probe: the modification stamps of ``paths`` (status.json, checkpoint files),
    which change whenever the ServerApp writes a phase or a round."""

    def probe():
        out = []
        for p in paths:
            try:
                out.append(Path(p).stat().st_mtime_ns)
            except OSError:
                out.append(None)
        return tuple(out)

    return probe


def status_progress(out_dir):
    """Progress probe of the run whose out-dir is ``out_dir``: its status.json and server checkpoint."""
    out_dir = Path(out_dir)
    return run_progress(out_dir / "status.json", out_dir / "checkpoint" / "server.npz")


def wait_until(pred, what: str, *, progress=None, alive=None, stall: float = STALL, poll: float = 0.05):
    """Wait until ``pred()`` is truthy and return its value.

    ``progress()`` returns anything that changes while the run advances; every change
    restarts the ``stall`` limit.  ``alive()`` false (the run's thread ended) stops the
    wait early: the value of ``pred()`` is returned, for the caller's assertion.
    Raises AssertionError naming ``what`` after ``stall`` seconds without progress.
    """
    last = progress() if progress is not None else None
    deadline = time.monotonic() + stall
    while True:
        value = pred()
        if value or (alive is not None and not alive()):
            return value
        if progress is not None:
            now = progress()
            if now != last:
                last, deadline = now, time.monotonic() + stall
        if time.monotonic() >= deadline:
            raise AssertionError(f"no progress for {stall:g} s while waiting for {what}")
        time.sleep(poll)


def join(thread, what: str = "the run to end", *, progress=None, stall: float = STALL) -> None:
    """Join ``thread`` (a run), failing only after ``stall`` seconds without progress."""
    wait_until(lambda: not thread.is_alive(), what, progress=progress, stall=stall, poll=0.1)
    thread.join()


def read_status(path) -> dict | None:
    """The status.json at ``path``, or None while it is absent or half-written."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
