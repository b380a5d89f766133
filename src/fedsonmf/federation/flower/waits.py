"""When to pull: the waits of the node loop and of the ServerApp.

Flower's Fleet and Runtime APIs have no push: a node learns of a message, and the ServerApp of a
reply, only by pulling the SuperLink, and every pull is an HTTPS request that costs the SuperLink
milliseconds of CPU.  On loopback the SuperLink's one process is the busiest of a deployment
(≈ 80 % of a core during a run of trivial exchanges), so a pull that finds nothing delays the
requests that carry messages.  Two rules decide when to pull:

* **After a send, the expected answer time** (:class:`ArrivalEstimate`).  The first pull after a
  node has pushed its reply, or after the ServerApp has pushed an exchange, waits
  :data:`EXPECT_FRACTION` of the shortest of the last :data:`EXPECT_MEMORY` times an answer took
  (the ServerApp keeps them per kind of exchange: a fit round and a clustering stage take
  different times).  The fraction is below 1, so a round that is quicker than the recent ones is
  seen late by at most that fraction of their time, and its own time enters the memory.
* **Then a fraction of the time waited** (:class:`IdleWait`, :func:`reply_wait`): each later wait is
  a quarter of the time since the send, between milliseconds and a ceiling, so an answer is seen
  within a quarter of its own time and an idle node pulls twice a second.

Measured (``benchmarks/bench_flower.py``, a trivial exchange between two nodes with the secure
defaults): the expected-time rule halves the empty pulls of the nodes and the ServerApp's pulls of
an exchange fall to about one; docs/flower.md, "The node loop", gives the table.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable

__all__ = ["MIN_IDLE_WAIT", "MAX_IDLE_WAIT", "IDLE_FRACTION", "IdleWait", "FIRST_REPLY_POLL", "MAX_REPLY_POLL",
           "REPLY_POLL_FRACTION", "reply_wait", "fraction_wait", "EXPECT_FRACTION", "EXPECT_MEMORY", "ArrivalEstimate"]

#: seconds between a node's pulls right after a message (the next one usually follows within milliseconds)
MIN_IDLE_WAIT = 0.002
#: the longest wait between two pulls of an idle node, seconds
MAX_IDLE_WAIT = 0.5
#: a node's wait is this fraction of the time since its last reply (bounded by the two above)
IDLE_FRACTION = 0.25
#: the longest wait between two pulls of an exchange's replies, seconds (:func:`reply_wait`)
MAX_REPLY_POLL = 0.25
#: the shortest wait between two pulls of an exchange's replies, seconds: a node of the project's
#: loop answers a trivial message within hundredths of a second (docs/flower.md, "The node loop")
FIRST_REPLY_POLL = 0.002
#: each later wait is this fraction of the time the exchange has taken so far (bounded by the two above)
REPLY_POLL_FRACTION = 0.25
#: the first pull after a send waits this fraction of the shortest recent answer time (of 0.3, 0.5
#: and 0.75, 0.5 gave the shortest trivial rounds: docs/flower.md, "The node loop")
EXPECT_FRACTION = 0.5
#: how many recent answer times an estimate keeps (per kind of exchange)
EXPECT_MEMORY = 3


def fraction_wait(elapsed: float, fraction: float, lo: float, hi: float) -> float:
    """``fraction`` of the ``elapsed`` seconds, at least ``lo`` and at most ``hi``: a pull's wait
    once the expected time has passed, for the nodes (:class:`IdleWait`) and the ServerApp
    (:func:`reply_wait`) alike."""
    return min(hi, max(lo, fraction * elapsed))


class ArrivalEstimate:
    """The first wait after a send: :data:`EXPECT_FRACTION` of the shortest of the last
    :data:`EXPECT_MEMORY` answer times of the same ``kind`` (0 until that many are known).

    An answer that the first pull already finds says only that it took at most the time waited: the
    estimate of its kind is then forgotten, and the next send of that kind pulls from the start
    again and measures afresh.  A too-long estimate thus costs one exchange, never a series of them.
    """

    def __init__(self, fraction: float = EXPECT_FRACTION, memory: int = EXPECT_MEMORY):
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"need 0 <= fraction < 1, got {fraction}")
        if memory < 1:
            raise ValueError(f"need memory >= 1, got {memory}")
        self.fraction, self.memory = float(fraction), int(memory)
        self._recent: dict[Hashable, deque] = {}

    def first_wait(self, kind: Hashable = None) -> float:
        """Seconds before the first pull after a send of ``kind``: 0 until :data:`EXPECT_MEMORY`
        answers of that kind have been timed (a run's first exchanges include its start-up)."""
        recent = self._recent.get(kind)
        return self.fraction * min(recent) if recent is not None and len(recent) == self.memory else 0.0

    def observe(self, seconds: float, kind: Hashable = None, *, first_pull: bool = False) -> None:
        """An answer to a send of ``kind`` was seen ``seconds`` after it; ``first_pull``: by the first
        pull after a wait of :meth:`first_wait` > 0 (the time is then only an upper bound)."""
        if first_pull and self.first_wait(kind) > 0:
            self._recent.pop(kind, None)
            return
        self._recent.setdefault(kind, deque(maxlen=self.memory)).append(max(0.0, float(seconds)))


class IdleWait:
    """A node's wait between two pulls: first the expected answer time after its reply
    (:class:`ArrivalEstimate`), then a fraction of the time since the reply; bounded; ``stop`` ends it."""

    def __init__(self, stop: threading.Event, *, min_wait: float = MIN_IDLE_WAIT, max_wait: float = MAX_IDLE_WAIT,
                 fraction: float = IDLE_FRACTION, expect: ArrivalEstimate | None = None, clock=time.monotonic):
        if not 0.0 < min_wait <= max_wait:
            raise ValueError(f"need 0 < min_wait <= max_wait, got {min_wait}, {max_wait}")
        self.stop, self.min_wait, self.max_wait, self.fraction, self.clock = stop, min_wait, max_wait, fraction, clock
        self.expect = ArrivalEstimate() if expect is None else expect
        self.last = clock()
        self._first = False  # the next pull is the first since a reply
        self._replied = False  # a message's wait counts from the node's last reply, once there is one

    def activity(self) -> None:
        """The node has replied: the next message is expected (:meth:`next_wait`)."""
        self.last = self.clock()
        self._first = self._replied = True

    def arrived(self, first_pull: bool = False) -> None:
        """A message came (call before handling it; ``first_pull``: the first pull since the reply
        found it): its time since the last reply is recorded (:meth:`ArrivalEstimate.observe`)."""
        if self._replied:
            self.expect.observe(self.clock() - self.last, first_pull=first_pull)
        self._first = False

    def next_wait(self) -> float:
        """Seconds until the next pull."""
        if self._first:
            self._first = False
            return min(self.max_wait, max(self.min_wait, self.expect.first_wait()))
        return fraction_wait(self.clock() - self.last, self.fraction, self.min_wait, self.max_wait)

    def wait(self) -> bool:
        """Wait before the next pull; False when the loop is to stop."""
        return not self.stop.wait(self.next_wait())


def reply_wait(elapsed: float, poll: float = MAX_REPLY_POLL) -> float:
    """Seconds before the next pull of an exchange that has waited ``elapsed`` seconds.

    A quarter of the elapsed time, at least :data:`FIRST_REPLY_POLL` and at most
    ``max(poll, MAX_REPLY_POLL)``: a reply that arrives is seen within a quarter of the
    exchange's own time, and a slow exchange (a node's long
    local step, Flower's own node loop) costs a pull every quarter second at most."""
    return fraction_wait(elapsed, REPLY_POLL_FRACTION, FIRST_REPLY_POLL, max(poll, MAX_REPLY_POLL))
