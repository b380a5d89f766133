"""The shipped Flower app: a tiny "shim" app directory for ``flwr run``.

The FAB (Flower app bundle) that ``flwr run`` sends to the SuperLink holds only
this shim; the real code is imported from the installed ``fedsonmf`` on every
machine (FLOWER.md §3.2).  ``flwr run`` checks statically that
``server_app.py``/``client_app.py`` *assign* ``app``, hence ``app = _impl.make_server_app(...)``;
the shim is also where the clustering steps are wired in (the composition root).

The template lives in Python strings (not package data) so that a plain
``pip install fedsonmf[flower]`` always has it; :func:`write_app_dir` writes it.
Never write results into the app directory: everything in it with a
``.py/.toml/.md/.json/...`` suffix is shipped with the next run.
"""

from __future__ import annotations

from pathlib import Path

from fedsonmf.protocol.params import default

__all__ = ["write_app_dir", "RUN_CONFIG_DEFAULTS", "PACKAGE", "STEPS_MODULE"]

PACKAGE = "fedsonmf_flower_app"

#: run-config keys of the app and their defaults (``flwr run --run-config`` may override only these)
RUN_CONFIG_DEFAULTS: dict[str, object] = {
    "num-clients": 3,           # number of views = SuperNodes
    "num-rounds": 10,           # max rounds
    "tol": 0.0,                 # stop when R/R1 <= tol (needs diagnostics)
    "seed": 0,
    "algorithm": "fedsonmf",    # any name of fedsonmf.algorithms.ALGORITHMS
    "rank": default("n_components"),
    "mu": default("mu"),
    "mu-scale": default("mu_scale"),
    "alpha": default("alpha"),
    "tau": default("tau"),
    "eta-g": default("eta_g"),
    "rho1": default("rho1"),
    "correction": default("correction"),
    "init-u": default("init_u"),
    "init-v": default("init_v"),
    "diagnostics": default("diagnostics"),  # clients add monitoring values (objective, residual) to replies
    "config-json": "",          # full FedConfig.to_dict() as JSON; replaces the keys above when set
    "out-dir": "",              # absolute directory on the SuperLink host (required)
    "job-id": "",               # names the clients' state files; keep it to resume
    "resume": False,            # continue from out-dir/checkpoint
    "round-timeout": 300.0,     # seconds to wait for all replies of one round
    "node-timeout": 120.0,      # seconds to wait for all views to come online
    "startup-timeout": 0.0,     # seconds for the nodes' start-up (setup exchange); 0 = node-timeout
    "poll-interval": 0.02,      # seconds between pulls
    "setup-at-handshake": True, # the hellos carry the setup: one exchange (a Flower round trip) less before round 1
    "record-wire": False,       # write out-dir/wire.jsonl (privacy audit)
    "min-clients": 0.0,         # partial participation (§15.2): quorum per round, int >= 1 or fraction; 0 = off
    "sample-clients": 0.0,      # clients asked per round, int >= 1 or fraction; 0 = every client
    "rejoin": "server",         # correction of a returning client: server (measured default) | refresh | drop | stale
    # clustering (FedMultiViewClustering's pipeline, fedsonmf.federation.flower.clustering)
    "mode": "fit",              # fit | predict (one exchange with the fitted bases fixed; new samples from each
                                # node's own node-config predict-path)
    "n-clusters": 0,            # c > 0: cluster the samples (labels.csv); 0 = factorisation only
    "rank-rule": "auto",        # r from c and the d_p the nodes report: auto (2c, narrow views padded) | auto-cap |
                                # paper (c) | an integer (capped); replaces rank / config-json's n_components
    "preprocess": default("preprocess"),            # each node's rule for its own view
    "normalize-views": default("normalize_views"),  # each node divides its view by its Frobenius norm
    "normalize-embedding": default("normalize_embedding"),
    "kmeans-n-init": default("kmeans_n_init"),
    "kmeans-max-iter": default("kmeans_max_iter"),
    "model-dir": "",            # predict: the fit's out-dir (on the SuperLink host)
}

#: the clustering steps the shipped app wires into the apps (the federation layer never imports them)
STEPS_MODULE = "fedsonmf.estimators.clustering_steps"

_SERVER = f'''"""Shim: the real ServerApp is fedsonmf.federation.flower.server_app, with the clustering steps."""
import fedsonmf.federation.flower.server_app as _impl

app = _impl.make_server_app(clustering="{STEPS_MODULE}")
'''

_CLIENT = f'''"""Shim: the real ClientApp is fedsonmf.federation.flower.client_app, with the clustering steps."""
import fedsonmf.federation.flower.client_app as _impl

app = _impl.make_client_app(clustering="{STEPS_MODULE}")
'''

_LICENSE = "BSD-3-Clause. See the fedsonmf project for the full text.\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_app_dir(dest, *, client_source: str | None = None, server_source: str | None = None,
                  extra_config: dict | None = None, publisher: str = "fedsonmf") -> Path:
    """Write the shim Flower app to ``dest`` and return it.

    ``client_source``/``server_source`` replace the shim modules (tests use this
    to wrap the ClientApp with a fault hook); ``extra_config`` adds run-config keys.
    """
    dest = Path(dest)
    pkg = dest / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    conf = {**RUN_CONFIG_DEFAULTS, **(extra_config or {})}
    config_lines = "\n".join(f"{k} = {_toml_value(v)}" for k, v in conf.items())
    (dest / "pyproject.toml").write_text(f'''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{PACKAGE.replace("_", "-")}"
version = "1.0.0"
description = "fedsonmf federated sparse ONMF on Flower (shim app; the code is the installed fedsonmf)"
license = {{ file = "LICENSE" }}
dependencies = ["flwr>=1.42.0,<1.43", "fedsonmf"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "{publisher}"
fab-format-version = 1
flwr-version-target = "1.42.0"

[tool.flwr.app.components]
serverapp = "{PACKAGE}.server_app:app"
clientapp = "{PACKAGE}.client_app:app"

[tool.flwr.app.config]
{config_lines}
''')
    (dest / "LICENSE").write_text(_LICENSE)
    (pkg / "__init__.py").write_text('"""fedsonmf Flower shim app."""\n')
    (pkg / "server_app.py").write_text(server_source or _SERVER)
    (pkg / "client_app.py").write_text(client_source or _CLIENT)
    return dest
