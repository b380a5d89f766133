"""Where a ClientApp finds its view and keeps its private state: the node-config rule.

Two kinds of node run the same ClientApp:

**Deployment** -- a SuperNode an organisation starts on its own machine with
``flower-supernode --node-config 'partition-id=0 data-path="/data/view0.npy" ...'``.
The node config names everything the node reads or writes:

``data-path``   the node's own view file (required)
``state-dir``   node-local folder of the private state files
                (default: ``<folder of data-path>/.fedsonmf-state``)

**Simulation** -- a virtual node of Flower's simulation engine (``flwr run`` on a
simulation SuperLink, or ``flwr.simulation.run_simulation``).  Flower gives it only
``partition-id`` and ``num-partitions``, so the *run config* says where the views are:

``sim-data-dir``  a folder with one view file per partition, ``view<p>.<ext>``
                  (``view0.npy``, ``view1.npz``, ... as :func:`~.launcher.write_views`
                  writes them); partition p reads ``view<p>.*`` and keeps its state in
                  ``<sim-data-dir>/.fedsonmf-state/p<p>``.

Privacy (the rule's reason): the run config comes from whoever submits the run,
the node config from the organisation that runs the node.  ``sim-data-dir`` is used
ONLY when the node config has no ``data-path`` *and* the ClientApp runs inside
Flower's simulation engine (a Ray worker, which a SuperNode never is).  A
deployment node always has a ``data-path``, and a deployment node without one
gets an error rather than a fallback, so no run config can redirect what a real
organisation's node reads or where it writes.  (Our choice: the second condition
is defence in depth against a SuperNode started without ``data-path``.)
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["SIM_DATA_DIR", "REQUIRE_SECURE", "data_path", "state_base", "in_simulation", "sim_view_path",
           "sim_state_dir", "requires_secure_aggregation", "MIN_CLUSTER_SIZE", "min_cluster_size"]

#: run-config key of the simulation view folder
SIM_DATA_DIR = "sim-data-dir"
#: node-config key of the node's secure-aggregation policy
REQUIRE_SECURE = "require-secure-aggregation"
#: node-config key of the smallest cluster a refinement request may hold
MIN_CLUSTER_SIZE = "refine-min-cluster-size"


def in_simulation() -> bool:
    """True inside Flower's simulation engine: the ClientApp runs in a connected Ray worker.

    Flower's only simulation backend is Ray; a SuperNode's ``flwr-clientapp``
    process never imports it.
    """
    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized())
    except Exception:  # noqa: BLE001 - a broken or partial ray import is not a simulation
        return False


def _partition(node_config) -> int:
    try:
        return int(node_config["partition-id"])
    except KeyError:
        raise ValueError("node config has no 'partition-id': start the SuperNode with "
                         "--node-config 'partition-id=<view index> data-path=\"<file>\"'") from None


def sim_view_path(sim_dir, partition: int) -> Path:
    """The one file ``view<partition>.<ext>`` in ``sim_dir`` (``view0.mask.npy`` and the like are not views)."""
    sim_dir = Path(sim_dir)
    if not sim_dir.is_dir():
        raise FileNotFoundError(f"run config {SIM_DATA_DIR!r} = {str(sim_dir)!r} is not a folder")
    stem = f"view{int(partition)}"
    found = sorted(p for p in sim_dir.iterdir() if p.stem == stem and p.suffix and p.is_file())
    if not found:
        raise FileNotFoundError(f"no view file {stem}.<ext> for partition {partition} in {SIM_DATA_DIR} {sim_dir}")
    if len(found) > 1:
        raise ValueError(f"partition {partition} has several view files in {SIM_DATA_DIR} {sim_dir}: "
                         f"{[p.name for p in found]}; keep one")
    return found[0]


def sim_state_dir(sim_dir, partition: int) -> Path:
    """Node-local state folder of simulated partition ``partition``: ``<sim_dir>/.fedsonmf-state/p<partition>``."""
    return Path(sim_dir) / ".fedsonmf-state" / f"p{int(partition)}"


def _sim_dir(context, simulation: bool | None) -> Path | None:
    """``sim-data-dir`` if this node may use it (no ``data-path``, inside the simulation engine), else None."""
    if "data-path" in context.node_config:
        return None
    sim_dir = str(context.run_config.get(SIM_DATA_DIR, "") or "")
    if not sim_dir:
        return None
    if not (in_simulation() if simulation is None else simulation):
        raise ValueError(f"node config has no 'data-path' (the node's own view file); run config "
                         f"{SIM_DATA_DIR!r} is honoured only by the simulated nodes of Flower's simulation engine")
    return Path(sim_dir)


def data_path(context, *, simulation: bool | None = None) -> Path:
    """The node's view file: node config ``data-path``, else (simulation only) ``<sim-data-dir>/view<p>.*``.

    ``simulation`` overrides :func:`in_simulation` (tests).
    """
    nc = context.node_config
    if "data-path" in nc:
        return Path(str(nc["data-path"]))
    sim_dir = _sim_dir(context, simulation)
    if sim_dir is None:
        raise ValueError("node config has no 'data-path' (the node's own view file); in Flower's simulation "
                         f"engine, give the run config {SIM_DATA_DIR!r} (a folder of view<p>.* files)")
    return sim_view_path(sim_dir, _partition(nc))


def state_base(context, *, simulation: bool | None = None) -> Path:
    """The node's state folder (the job folders go inside): node config ``state-dir``, else
    ``<folder of data-path>/.fedsonmf-state``, else (simulation only) :func:`sim_state_dir`."""
    nc = context.node_config
    base = str(nc.get("state-dir", "") or "")
    if base:
        return Path(base)
    if "data-path" in nc:
        return Path(str(nc["data-path"])).parent / ".fedsonmf-state"
    sim_dir = _sim_dir(context, simulation)
    if sim_dir is None:
        raise ValueError("node config has neither 'state-dir' nor 'data-path'")
    return sim_state_dir(sim_dir, _partition(nc))


def requires_secure_aggregation(context) -> bool:
    """The node's own secure-aggregation policy: node config ``require-secure-aggregation``, else
    True on a deployment node (one with a ``data-path``) and False on a simulated one.

    A deployment node belongs to an organisation that never hands the server its uploads in the
    clear unless its operator says so (``require-secure-aggregation=false``): the run config comes
    from the coordinator, so a coordinator that turns masking off cannot downgrade such a node.  A
    simulation's nodes are the simulating user's own, and follow the run.
    """
    nc = context.node_config
    if REQUIRE_SECURE not in nc:
        return "data-path" in nc
    value = nc[REQUIRE_SECURE]
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"node config {REQUIRE_SECURE!r} must be true or false, got {value!r}")


def min_cluster_size(context) -> int:
    """The node's ``refine-min-cluster-size`` (default 1: any partition): the node answers a
    refinement request (``refine``, ``graph``) only when every nonempty cluster of its labels holds
    at least that many samples, so no request singles out fewer samples than its operator allows
    (the seeded starts put drawn samples alone in a cluster: a node with 2 or more refuses them)."""
    value = context.node_config.get(MIN_CLUSTER_SIZE, 1)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"node config {MIN_CLUSTER_SIZE!r} must be an integer >= 1, got {value!r}")
    return int(value)
