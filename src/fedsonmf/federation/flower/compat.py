"""The Flower internals fedsonmf relies on, in one place.

Flower's public API (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``) covers the apps.
Running a node of our own (:mod:`.nodeloop`) and the gate's executor (:mod:`.gate`) also
needs pieces below it: the SuperNode's Fleet connection, the object (de)inflation helpers,
the config fusion, the task identity, the Runtime API client and its messages.  They are
imported here and nowhere else (the gate's simulation task imports ``flwr.simulation`` on use,
as it needs the ``simulation`` extra; ``client_app``/``server_app`` use two constants of Flower's),
so that a Flower upgrade that renames or re-signs one of them fails in one place:
``tests/test_flower_compat.py`` checks that every name of :data:`CONTRACT` exists with the
parameters listed (``.venv/bin/python -m pytest tests/test_flower_compat.py -q``).

The pinned range is ``flwr>=1.42,<1.43`` (pyproject's ``flower`` extra); the contract was
read from flwr 1.42.0's sources.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor

from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.app import Message, Metadata
from flwr.app.error import Error
from flwr.app.message import make_message
from flwr.cli.build import build_fab_from_disk
from flwr.common.config import get_fused_config_from_fab, parse_config_args
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, context_to_proto, fab_from_proto, run_from_proto
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import (
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
    PullTaskInputResponse,
    PushTaskOutputRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.constant import SYSTEM_MESSAGE_TYPE, TaskType
from flwr.supercore.date import now
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_tree,
    iterate_object_tree,
    no_object_id_recompute,
)
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import (
    ObjectPullError,
    inflate_object_from_contents,
    pull_and_inflate_object_from_tree,
    pull_objects,
    push_objects,
)
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
    SuperExecAuthHttpInterceptor,
)
from flwr.supercore.logger import mirror_output_to_queue, restore_output
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.run import RunNotRunningException
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.superlink.grid import HttpGrid
from flwr.supernode.fleet_http_connection import http_request_response as fleet_connection
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

__all__ = [
    "CONTRACT", "check_contract", "resolve", "FLOWER_RANGE", "FLEET_CALLBACKS", "OBJECT_BACKOFF",
    "OBJECT_BACKOFF_CAP", "MAX_PARALLEL_REPLIES", "OBJECT_PUSH_WORKERS", "ReplyGrid", "Confirmations",
    # the node loop's
    "fleet_connection", "parse_config_args", "get_fused_config_from_fab", "pull_and_inflate_object_from_tree",
    "pull_objects", "inflate_object_from_contents", "push_objects", "get_object_tree", "get_all_nested_objects",
    "iterate_object_tree", "no_object_id_recompute",
    "TaskIdentity", "RunNotRunningException", "ErrorCode", "load_ssh_private_key",
    # the gate's
    "build_fab_from_disk", "SubStatus", "context_from_proto", "context_to_proto", "fab_from_proto", "run_from_proto",
    "Node", "AcquireTaskRequest", "PullAppMessagesRequest", "PullTaskInputRequest", "PullTaskInputResponse",
    "PushTaskOutputRequest", "SendTaskHeartbeatRequest", "TaskType", "HeartbeatSender",
    "make_confirm_message_received_fn_protobuf", "make_pull_object_fn_protobuf", "RuntimeTokenHttpInterceptor",
    "RuntimeVersionHttpInterceptor", "SuperExecAuthHttpInterceptor", "mirror_output_to_queue", "restore_output",
    "make_simple_http_retry_invoker", "RuntimeHttpClient", "validate_and_resolve_root_certificates", "HttpGrid",
    "push_message", "push_task_output",
]

_log = logging.getLogger(__name__)

#: seconds before a second pull of an object that is not there yet (Flower's default: 1 s).  A
#: message is listed as soon as its sender has pushed its head, before its objects: on loopback
#: they follow within milliseconds, and Flower's 1 s first retry cost ~0.9 s in a third of the
#: exchanges measured (``benchmarks/bench_flower.py``)
OBJECT_BACKOFF = 0.002
#: the longest wait between two pulls of an object that is not there yet, seconds (Flower: 10 s)
OBJECT_BACKOFF_CAP = 0.25
#: replies whose objects the ServerApp pulls at once (:class:`ReplyGrid`), and objects a node pushes at once
#: (Flower's own helpers move at most as many objects at a time as the host has cores)
MAX_PARALLEL_REPLIES = 8
OBJECT_PUSH_WORKERS = 8

#: the Flower versions this module was checked against
FLOWER_RANGE = ">=1.42,<1.43"

#: ``module:attribute`` -> the leading parameters it must accept (in this order; an empty tuple:
#: only its existence is checked).  Every internal the node loop and the gate use is listed.
CONTRACT: dict[str, tuple[str, ...]] = {
    # the SuperNode's connection to the SuperLink's Fleet API (TLS, node authentication, heartbeat)
    "flwr.supernode.fleet_http_connection:http_request_response": (
        "server_address", "insecure", "root_certificates", "authentication_keys", "max_retries", "max_wait_time"),
    "flwr.common.config:parse_config_args": ("config",),
    "flwr.common.config:get_fused_config_from_fab": ("fab_file", "run"),
    "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree": (
        "object_tree", "pull_object_fn", "confirm_object_received_fn", "return_type", "max_concurrent_pulls",
        "max_time", "max_tries_per_object", "initial_backoff", "backoff_cap"),
    "flwr.supercore.inflatable.inflatable_utils:push_objects": ("objects", "push_object_fn"),
    "flwr.supercore.inflatable.inflatable_object:get_object_tree": ("obj",),
    "flwr.supercore.inflatable.inflatable_object:get_all_nested_objects": ("obj",),
    "flwr.supercore.inflatable.inflatable_object:no_object_id_recompute": (),
    "flwr.supercore.task_identity:TaskIdentity": (),
    "flwr.supercore.run:RunNotRunningException": (),
    "flwr.common.constant:ErrorCode": (),
    # used by the gate's executor (gate.py)
    "flwr.cli.build:build_fab_from_disk": ("app",),
    "flwr.supercore.runtime:RuntimeHttpClient": (),
    "flwr.supercore.retry:make_simple_http_retry_invoker": (),
    "flwr.supercore.tls:validate_and_resolve_root_certificates": (),
    "flwr.supercore.interceptors:RuntimeTokenHttpInterceptor": (),
    "flwr.supercore.interceptors:RuntimeVersionHttpInterceptor": (),
    "flwr.supercore.interceptors:SuperExecAuthHttpInterceptor": (),
    "flwr.supercore.heartbeat:HeartbeatSender": (),
    "flwr.supernode.runtime.run_clientapp:push_message": ("client", "message", "context"),
    "flwr.supernode.runtime.run_clientapp:push_task_output": ("client", "context", "sub_status", "details"),
    "flwr.superlink.grid:HttpGrid": (),
    "flwr.superlink.grid:HttpGrid.pull_messages": ("self", "message_ids"),
    "flwr.supercore.inflatable.inflatable_utils:pull_objects": (
        "object_ids", "pull_object_fn", "max_concurrent_pulls", "max_time", "max_tries_per_object", "initial_backoff",
        "backoff_cap"),
    "flwr.supercore.inflatable.inflatable_utils:inflate_object_from_contents": ("object_id", "object_contents"),
    "flwr.supercore.inflatable.inflatable_utils:ObjectPullError": (),
    "flwr.supercore.inflatable.inflatable_object:iterate_object_tree": (),
    "flwr.supercore.inflatable.inflatable_protobuf_utils:make_pull_object_fn_protobuf": (
        "pull_object_protobuf", "node", "run_id"),
    "flwr.app.message:make_message": ("metadata", "content", "error"),
    "flwr.proto.message_pb2:ConfirmMessageReceivedRequest": (),
    "flwr.proto.runtime_pb2:PullAppMessagesRequest": (),
    "flwr.supercore.constant:SYSTEM_MESSAGE_TYPE": (),
    "flwr.supercore.date:now": (),
    "flwr.common.constant:SubStatus": (),
    "flwr.common.serde:context_from_proto": (),
    "flwr.common.serde:context_to_proto": (),
    "flwr.common.serde:fab_from_proto": (),
    "flwr.common.serde:run_from_proto": (),
    "flwr.proto.node_pb2:Node": (),
    "flwr.proto.runtime_pb2:AcquireTaskRequest": (),
    "flwr.proto.runtime_pb2:PullTaskInputRequest": (),
    "flwr.proto.runtime_pb2:PullTaskInputResponse": (),
    "flwr.proto.runtime_pb2:PushTaskOutputRequest": (),
    "flwr.proto.runtime_pb2:SendTaskHeartbeatRequest": (),
    "flwr.supercore.constant:TaskType": (),
    "flwr.supercore.inflatable.inflatable_protobuf_utils:make_confirm_message_received_fn_protobuf": (),
    "flwr.supercore.logger:mirror_output_to_queue": (),
    "flwr.supercore.logger:restore_output": (),
    "flwr.simulation.app:run_simulation_process": (
        "runtime_api_address", "log_queue", "token", "insecure", "certificates", "parent_pid",
        "runtime_dependency_install"),
    "flwr.simulation.app:SimulationIoConnection": (),
}

#: the Fleet connection's callbacks, in the order ``http_request_response`` yields them
FLEET_CALLBACKS = ("node_id", "receive", "send", "get_run", "get_fab", "pull_object", "push_object",
                   "confirm_message_received")


def resolve(ref: str):
    """The object named ``module:attribute``."""
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def check_contract() -> list[str]:
    """The contract's breaches under the installed Flower (empty when it holds): a missing
    module or attribute, or a callable whose leading parameters differ."""
    problems = []
    for ref, params in CONTRACT.items():
        try:
            obj = resolve(ref)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{ref}: missing ({type(exc).__name__}: {exc})")
            continue
        if not params:
            continue
        target = getattr(obj, "__wrapped__", obj)
        try:
            names = tuple(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            problems.append(f"{ref}: no inspectable signature")
            continue
        if names[:len(params)] != params:
            problems.append(f"{ref}: parameters {names[:len(params)]}, expected {params}")
    return problems


class Confirmations:
    """Receipts confirmed to the SuperLink (which may then drop a message's objects) beside the work
    that follows rather than before it: one at a time, in order, on one background thread.  A failed
    confirmation is logged through ``log(text)``; the message is in hand and its objects expire with
    its TTL.  Used by the node loop for messages and by :class:`ReplyGrid` for replies."""

    def __init__(self, log):
        self._log = log
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, confirm, what: str) -> None:
        """Run ``confirm()`` in the background; ``what`` names the message in a failure's log line."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1)

        def run():
            try:
                confirm()
            except Exception as exc:  # noqa: BLE001 - logged; the objects expire with the message's TTL
                self._log(f"confirming {what} failed: {type(exc).__name__}: {exc}")

        self._pool.submit(run)


class ReplyGrid(HttpGrid):
    """Flower's ``HttpGrid`` (the ServerApp's connection to the SuperLink), whose pulls retry an
    object that is not there yet after :data:`OBJECT_BACKOFF` rather than Flower's 1 s.

    A subclass, not a patch: ``pull_messages`` is the same sequence as Flower 1.42's (pull the
    replies' heads, pull each reply's objects, confirm it, inflate it; a reply whose objects
    stay unavailable becomes a ``MESSAGE_UNAVAILABLE`` error reply), with the backoff given,
    the replies pulled side by side (Flower pulls them one after the other), and each reply's
    confirmation sent beside the work that follows rather than before its inflation.
    """

    _confirms: Confirmations | None = None

    def pull_messages(self, message_ids):
        run_id = self.run.run_id
        client = self._runtime_client
        res = client.PullMessages(PullAppMessagesRequest(message_ids=message_ids))
        pairs = list(zip(res.messages_list, res.message_object_trees, strict=True))
        if len(pairs) <= 1:
            return [self._pull_one(run_id, *pair) for pair in pairs]
        # the replies side by side (each pull of one reply's objects is itself at most 2 at a time)
        with ThreadPoolExecutor(max_workers=min(len(pairs), MAX_PARALLEL_REPLIES)) as pool:
            return list(pool.map(lambda pair: self._pull_one(run_id, *pair), pairs))

    def _confirm(self, request) -> None:
        """Confirm a reply's receipt beside the work that follows (:class:`Confirmations`)."""
        if self._confirms is None:
            self._confirms = Confirmations(lambda text: _log.warning("%s", text))
        self._confirms.submit(lambda: self._runtime_client.ConfirmMessageReceived(request),
                              f"reply {request.message_object_id}")

    def _pull_one(self, run_id, msg_proto, tree):
        client = self._runtime_client
        msg_id = msg_proto.metadata.message_id
        try:
            contents = pull_objects([t.object_id for t in iterate_object_tree(tree)],
                                    make_pull_object_fn_protobuf(client.PullObject, self.node, run_id),
                                    initial_backoff=OBJECT_BACKOFF, backoff_cap=OBJECT_BACKOFF_CAP)
        except ObjectPullError as exc:
            return make_message(
                metadata=Metadata(run_id=run_id, message_id="", src_node_id=self.node.node_id,
                                  dst_node_id=self.node.node_id, message_type=SYSTEM_MESSAGE_TYPE, group_id="",
                                  ttl=0, reply_to_message_id=msg_proto.metadata.reply_to_message_id,
                                  created_at=now().timestamp()),
                error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason=f"Reply message objects are unavailable. {exc}"))
        self._confirm(ConfirmMessageReceivedRequest(node=self.node, run_id=run_id, message_object_id=msg_id))
        message = inflate_object_from_contents(msg_id, contents)
        assert isinstance(message, Message)  # the head of a reply's tree
        message.metadata.__dict__["_message_id"] = msg_id
        return message

