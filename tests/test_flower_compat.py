"""The Flower internals the project relies on (``federation/flower/compat.py``) exist with the
parameters it calls them with: a Flower upgrade that moves or re-signs one fails here, by name."""

import inspect
import threading

import pytest

pytest.importorskip("flwr")

from fedsonmf.federation.flower import compat  # noqa: E402
from fedsonmf.federation.flower.waits import (  # noqa: E402
    FIRST_REPLY_POLL,
    MAX_REPLY_POLL,
    ArrivalEstimate,
    IdleWait,
    reply_wait,
)


def test_every_flower_internal_in_the_contract_exists_with_its_parameters():
    assert compat.check_contract() == []


def test_the_fleet_connection_yields_the_callbacks_in_the_order_the_node_loop_reads():
    """``http_request_response`` is a generator context manager: its yield annotation lists the
    eight callbacks the node loop unpacks by position (:data:`compat.FLEET_CALLBACKS`)."""
    ann = inspect.signature(getattr(compat.fleet_connection, "__wrapped__", compat.fleet_connection)).return_annotation
    args = getattr(ann, "__args__", None) or ()
    assert args, ann
    assert len(args[0].__args__) == len(compat.FLEET_CALLBACKS)


def test_the_contract_check_names_a_missing_symbol_and_a_changed_signature(monkeypatch):
    monkeypatch.setitem(compat.CONTRACT, "flwr.common.config:no_such_function", ())
    monkeypatch.setitem(compat.CONTRACT, "flwr.common.config:parse_config_args", ("renamed",))
    problems = compat.check_contract()
    assert any("no_such_function: missing" in p for p in problems)
    assert any("parse_config_args: parameters ('config',), expected ('renamed',)" in p for p in problems)


def test_the_reply_grid_is_flowers_http_grid_with_only_the_pull_replaced():
    assert issubclass(compat.ReplyGrid, compat.HttpGrid)
    own = {k for k, v in vars(compat.ReplyGrid).items() if callable(v)}
    # Flower's Grid has neither _pull_one nor _confirm: nothing else is overridden
    assert own == {"pull_messages", "_pull_one", "_confirm"}
    assert not hasattr(compat.HttpGrid, "_pull_one") and not hasattr(compat.HttpGrid, "_confirm")
    assert list(inspect.signature(compat.ReplyGrid.pull_messages).parameters) == \
        list(inspect.signature(compat.HttpGrid.pull_messages).parameters)


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_node_waits_a_quarter_of_its_idle_time_between_pulls_bounded():
    clock, stop = _Clock(), threading.Event()
    idle = IdleWait(stop, min_wait=0.002, max_wait=0.5, fraction=0.25, clock=clock)
    idle.activity()
    assert idle.next_wait() == 0.002  # right after its first reply: nothing expected yet
    clock.t = 0.4
    assert idle.next_wait() == pytest.approx(0.1)
    clock.t = 100.0
    assert idle.next_wait() == 0.5  # an idle node: two pulls a second
    stop.set()
    assert idle.wait() is False  # a stop ends the wait at once


def test_a_node_first_pulls_at_half_the_shortest_recent_time_to_a_message():
    clock, stop = _Clock(), threading.Event()
    idle = IdleWait(stop, min_wait=0.002, max_wait=0.5, fraction=0.25, clock=clock)
    clock.t = 50.0
    idle.arrived()  # the run's first message, after the node's start-up: no reply to time it from
    for gap in (0.08, 0.06):  # the node replies; the next message comes gap seconds later
        idle.activity()
        clock.t += gap
        idle.arrived()
    idle.activity()
    assert idle.next_wait() == 0.002  # two times known: not yet an estimate
    clock.t += 0.1
    idle.arrived()
    idle.activity()
    assert idle.next_wait() == pytest.approx(0.03)  # half of min(0.08, 0.06, 0.1)
    clock.t += 0.04
    assert idle.next_wait() == pytest.approx(0.01)  # then a quarter of the time since the reply
    clock.t += 30.0  # a long pause (between runs) enters the memory; the shortest still decides
    idle.arrived()
    idle.activity()
    assert idle.next_wait() == pytest.approx(0.03)
    clock.t += 0.031
    idle.arrived(first_pull=True)  # found by the first pull: only an upper bound, the estimate is dropped
    idle.activity()
    assert idle.next_wait() == 0.002


def test_an_arrival_estimate_is_kept_per_kind_and_shrinks_when_answers_come_sooner():
    est = ArrivalEstimate(fraction=0.5, memory=3)
    assert est.first_wait("round") == 0.0  # nothing seen: pull at once
    for t in (2.0, 1.0, 4.0):
        est.observe(t, "round")
    est.observe(0.01, "graph")
    assert est.first_wait("round") == pytest.approx(0.5)
    assert est.first_wait("graph") == 0.0  # one stage exchange timed: no estimate, not the rounds' one
    est.observe(0.2, "round")  # a quicker round: the next first wait follows it at once
    assert est.first_wait("round") == pytest.approx(0.1)
    est.observe(0.1, "round", first_pull=True)  # an upper bound only: forgotten, measured afresh
    assert est.first_wait("round") == 0.0
    with pytest.raises(ValueError):
        ArrivalEstimate(fraction=1.0)


def test_the_server_pulls_replies_quickly_first_then_backs_off_to_its_ceiling():
    assert reply_wait(0.0) == FIRST_REPLY_POLL
    assert reply_wait(0.2) == pytest.approx(0.05)
    assert reply_wait(60.0) == MAX_REPLY_POLL
    assert reply_wait(60.0, poll=1.0) == 1.0  # a larger configured poll is the ceiling


def test_confirmations_run_in_order_in_the_background_and_log_failures():
    done, logged, gate = [], [], threading.Event()
    confirms = compat.Confirmations(logged.append)

    def confirm(i):
        gate.wait(5.0)  # the caller goes on while the first confirmation is held
        if i == 1:
            raise RuntimeError("run finished")
        done.append(i)

    for i in range(3):
        confirms.submit(lambda i=i: confirm(i), f"message {i}")
    assert done == [] and logged == []
    gate.set()
    confirms._pool.shutdown(wait=True)
    assert done == [0, 2]
    assert logged == ["confirming message 1 failed: RuntimeError: run finished"]
