"""The one supervisor of every process the project starts: daemons, executors, ``flwr run``.

:class:`Supervisor` starts each process as the leader of a process group of its own (a
terminal's Ctrl-C reaches only the launcher, which then stops them), with its output in a log
file created 0600 in a 0700 folder, and stops them **in parallel**: SIGTERM to every group (and
to every process descended from a leader that left its group, such as Ray's), **one** shared
grace period, then SIGKILL to whatever is left, and the leaders reaped.  Stopping N daemons so
costs one grace period, not N.

Parent death.  Each supervisor has a *watcher*: a small process (no project imports, its own
session) that holds the read end of a pipe whose write end only this process has.  The
supervisor tells it every group it starts and stops; when the launcher dies in any way
(``kill -9`` included) the pipe reaches end-of-file and the watcher stops the groups it still
knows, with the same TERM, grace, KILL.  This covers the daemons' children and grandchildren
(they share the group) and works from any thread and on any POSIX system; Linux's
``PR_SET_PDEATHSIG`` reaches only the direct child, and fires when the *thread* that forked it
ends, so a deployment started from a worker thread would lose its daemons with that thread.
The one window left: a launcher killed after a process started and before :meth:`Supervisor.start`
returned (the watcher is told the new group then; milliseconds, more on a loaded machine).

Evidence: ``tests/test_supervisor.py`` (a child and a grandchild die when the supervisor stops
and when its process is killed with SIGKILL; N daemons that ignore SIGTERM all receive it while
every one of them still runs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fedsonmf._io import open_private, private_dir

__all__ = ["Supervisor", "GRACE", "proc_table", "descendants"]

#: seconds between the SIGTERM to every group and the SIGKILL to what is left (our choice: the
#: daemons exit in well under a second on TERM; a ServerApp writes its final status first)
GRACE = 10.0

# The watcher: reads "+PGID" / "-PGID" lines from stdin; at end-of-file (the supervising process is
# gone, or closed the pipe) it TERMs the groups it still knows, waits GRACE (argv[1]) for them, then
# KILLs what is left.  Standard library only: it starts in milliseconds and imports nothing of ours.
_WATCHER = r"""
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
grace = float(sys.argv[1])
groups = set()
for line in sys.stdin:
    line = line.strip()
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
def send(sig):
    left = set()
    for g in groups:
        try:
            os.killpg(g, sig)
            left.add(g)
        except (ProcessLookupError, PermissionError):
            pass
    return left
groups = send(signal.SIGTERM)
end = time.monotonic() + grace
while groups and time.monotonic() < end:
    time.sleep(0.05)
    groups = send(0)
send(signal.SIGKILL)
"""


def proc_table() -> dict[int, tuple[int, int, int]]:
    """{pid: (ppid, pgid, start time)} of the live (not zombie) processes, from Linux's /proc
    (empty elsewhere)."""
    table: dict[int, tuple[int, int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # fields after the parenthesised command: state(0) ppid(1) pgrp(2) ... starttime(19)
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def descendants(roots, table=None) -> dict[int, int]:
    """{pid: start time} of the live processes among ``roots`` (pids), the members of their process
    groups, and all their descendants."""
    table = proc_table() if table is None else table
    roots = set(roots)
    found = {pid: row[2] for pid, row in table.items() if pid in roots or row[1] in roots}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _pgid, st) in table.items():
            if ppid in found and pid not in found:
                found[pid] = st
                grew = True
    return found


def _same(pid: int, start: int, table) -> bool:
    row = table.get(pid)
    return row is not None and row[2] == start


class Supervisor:
    """Starts processes in process groups of their own and stops them together.

    Parameters
    ----------
    grace : float, default=GRACE
        Seconds between SIGTERM and SIGKILL in :meth:`stop` and in the watcher.
    watch : bool, default=True
        Start the watcher (see the module's text) with the first process, so that the processes
        are stopped when this process dies.

    Every process :meth:`start` returns is a :class:`subprocess.Popen` whose pid is also its
    process group id.  :meth:`close` stops them all and ends the watcher.
    """

    def __init__(self, *, grace: float = GRACE, watch: bool = True):
        self.grace = float(grace)
        self.watch = bool(watch)
        self.procs: list[subprocess.Popen] = []
        self._watcher: subprocess.Popen | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ starting
    def start(self, argv, *, log=None, env=None, cwd=None, stdin=subprocess.DEVNULL, stdout=None,
              log_mode: str = "ab", **popen) -> subprocess.Popen:
        """Start ``argv`` in a new session (its own process group), watched.

        ``log``: a file that receives its stdout and stderr, created 0600 (its folder 0700);
        without one, ``stdout`` (and stderr) are passed to :class:`subprocess.Popen` as given.
        ``umask`` is 0o077 unless ``popen`` says otherwise.  Raises FileNotFoundError when
        ``argv[0]`` cannot be run.
        """
        popen.setdefault("umask", 0o077)
        if log is not None:
            private_dir(Path(log).parent)
            with open_private(log, log_mode) as fh:
                proc = self._popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=fh, stderr=subprocess.STDOUT,
                                   **popen)
        else:
            proc = self._popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout, **popen)
        return proc

    def _popen(self, argv, **kw) -> subprocess.Popen:
        with self._lock:
            if self.watch:
                self._ensure_watcher()
            proc = subprocess.Popen(list(map(str, argv)), start_new_session=True, **kw)
            self.procs.append(proc)
            self._tell(f"+{proc.pid}")
        return proc

    def _ensure_watcher(self) -> None:
        if self._watcher is not None and self._watcher.poll() is None:
            return
        # its stdin is a pipe whose write end is this process's alone (Popen's fds are not inherited)
        self._watcher = subprocess.Popen([sys.executable, "-S", "-c", _WATCHER, str(self.grace)],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True, text=True)

    def _tell(self, line: str) -> None:
        w = self._watcher
        if w is None or w.stdin is None or w.poll() is not None:
            return
        try:
            w.stdin.write(line + "\n")
            w.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    # ------------------------------------------------------------------ signals
    def signal(self, proc: subprocess.Popen, sig: int) -> None:
        """Send ``sig`` to ``proc``'s process group (nothing when it is gone)."""
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL ``proc``'s group and its descendants, reap it, and wait until none of them runs."""
        self.stop([proc], grace=0.0)

    def descendants(self, procs=None) -> dict[int, int]:
        """{pid: start time} of the live processes of ``procs`` (default: all started): leaders,
        group members and descendants."""
        procs = self.procs if procs is None else procs
        return descendants([p.pid for p in procs if p is not None])

    # ------------------------------------------------------------------ stopping
    def stop(self, procs=None, *, grace: float | None = None) -> None:
        """Stop ``procs`` (default: every process started and not yet stopped) in parallel.

        SIGTERM to every group and to every descendant that left its group, one shared
        ``grace`` (default :attr:`grace`) while anything of them runs, then SIGKILL to what is
        left; the leaders are reaped and the groups are gone (at most 10 s more) on return.
        ``grace=0`` sends SIGKILL at once.
        """
        grace = self.grace if grace is None else float(grace)
        with self._lock:
            procs = [p for p in (self.procs if procs is None else procs) if p is not None]
        if not procs:
            return
        pgids = {p.pid for p in procs}
        tree = descendants(pgids)  # read before the leaders go: orphans leave the tree
        first = signal.SIGTERM if grace > 0 else signal.SIGKILL
        self._send(first, pgids, tree)
        deadline = time.monotonic() + grace
        while grace > 0 and time.monotonic() < deadline:
            for p in procs:
                p.poll()  # reap the leaders that exited
            table = proc_table()
            tree.update(descendants(pgids, table))  # children started meanwhile
            if all(p.returncode is not None for p in procs) and not any(_same(pid, st, table)
                                                                        for pid, st in tree.items()):
                break
            time.sleep(0.05)
        else:
            if grace > 0:
                self._send(signal.SIGKILL, pgids, tree)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
                pass
        end = time.monotonic() + 10.0
        while time.monotonic() < end:  # the leaders are reaped: what is left are group members and the tree
            table = proc_table()
            left = {pid: st for pid, st in tree.items() if _same(pid, st, table)}
            if not left and not any(row[1] in pgids for row in table.values()):
                break
            self._send(signal.SIGKILL, pgids, left)
            time.sleep(0.05)
        with self._lock:
            for p in procs:
                if p in self.procs:
                    self.procs.remove(p)
                self._tell(f"-{p.pid}")

    @staticmethod
    def _send(sig: int, pgids, tree) -> None:
        for g in pgids:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        table = proc_table()
        for pid, st in tree.items():  # those that left the groups (the groups got it once already)
            if _same(pid, st, table) and table[pid][1] not in pgids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def close(self) -> None:
        """Stop every process started (:meth:`stop`) and end the watcher."""
        self.stop()
        with self._lock:
            w, self._watcher = self._watcher, None
        if w is not None:
            if w.stdin is not None:
                try:
                    w.stdin.close()
                except OSError:
                    pass
            try:
                w.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                w.kill()
                w.wait()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
