"""Flower (``flwr`` 1.42) driver: real multi-machine federation.

Needs the optional extra: ``pip install "fedsonmf[flower]"``.

* :mod:`.server_app` -- the ServerApp (``app``): runs :func:`fedsonmf.federation.run_federation`
  over :class:`.transport.FlowerTransport`.
* :mod:`.client_app` -- the ClientApp (``app``): answers with :class:`fedsonmf.federation.ClientRuntime`.
* :mod:`.launcher` -- :class:`LoopbackDeployment`, :func:`run_flower` (factorisation, or clustering
  with ``n_clusters=c``) and :func:`predict_flower` (SuperLink + SuperNodes on loopback).
* :mod:`.clustering` -- the clustering pipeline's node and server parts over Flower.
* :mod:`.simulation` -- :func:`run_simulation`: the same app in Flower's simulation engine (needs Ray).
* :mod:`.nodeconfig` -- where a node finds its view and state (deployment: node config; simulation: run config).
* :mod:`.template` -- :func:`write_app_dir`, the shim app for ``flwr run`` (the repository's ``flower-app/``).
* :mod:`.audit` -- the declared wire payload and :func:`audit_wire`.
"""

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the Flower engine needs the optional dependency flwr: pip install 'fedsonmf[flower]'"
    ) from exc

from fedsonmf.exceptions import FederationError, FlowerRunError
from fedsonmf.federation.flower.launcher import (
    LoopbackDeployment,
    PredictOutcome,
    check_inputs,
    load_result,
    predict_flower,
    run_flower,
    write_masks,
    write_views,
)
from fedsonmf.federation.flower.simulation import run_simulation
from fedsonmf.federation.flower.template import write_app_dir
from fedsonmf.federation.flower.transport import FlowerTransport, handshake

__all__ = [
    "FederationError", "FlowerRunError", "FlowerTransport", "LoopbackDeployment", "handshake", "load_result",
    "run_flower", "run_simulation", "write_app_dir", "write_views", "write_masks", "predict_flower", "PredictOutcome",
    "check_inputs",
]
