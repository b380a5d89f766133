"""The Flower internals the project relies on (``federation/flower/compat.py``) exist with the
parameters it calls them with: a Flower upgrade that moves or re-signs one fails here, by name."""

import inspect
import threading

import pytest

pytest.importorskip("flwr")

from fedsonmf.federation.flower import compat  # noqa: E402
from fedsonmf.federation.flower.nodeloop import IdleWait  # noqa: E402
from fedsonmf.federation.flower.transport import FIRST_REPLY_POLL, MAX_REPLY_POLL, reply_wait  # noqa: E402


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
    assert own == {"pull_messages", "_pull_one"}  # Flower's Grid has no _pull_one: nothing else is overridden
    assert not hasattr(compat.HttpGrid, "_pull_one")
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
    assert idle.next_wait() == 0.002  # right after a message
    clock.t = 0.4
    assert idle.next_wait() == pytest.approx(0.1)
    clock.t = 100.0
    assert idle.next_wait() == 0.5  # an idle node: two pulls a second
    idle.activity()
    assert idle.next_wait() == 0.002
    stop.set()
    assert idle.wait() is False  # a stop ends the wait at once


def test_the_server_pulls_replies_quickly_first_then_backs_off_to_its_ceiling():
    assert reply_wait(0.0) == FIRST_REPLY_POLL
    assert reply_wait(0.2) == pytest.approx(0.05)
    assert reply_wait(60.0) == MAX_REPLY_POLL
    assert reply_wait(60.0, poll=1.0) == 1.0  # a larger configured poll is the ceiling
