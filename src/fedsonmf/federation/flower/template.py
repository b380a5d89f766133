"""The Flower app: a tiny "shim" app folder for ``flwr run``.

The FAB (Flower app bundle) that ``flwr run`` sends to the SuperLink holds only
this shim; the real code is imported from the installed ``fedsonmf`` on every
machine (docs/flower.md, "Flower behaviours").  ``flwr run`` checks statically that
``server_app.py``/``client_app.py`` *assign* ``app``, hence ``app = _impl.app``.

One source of truth: this module.  :func:`write_app_dir` writes the folder (the
launcher and the simulation driver write a fresh one per run); the repository's
``flower-app/`` is its output, committed so that a Flower user can open it and
``flwr run flower-app <connection>``, and ``tests/test_flower_app_folder.py``
checks that the two are equal (regenerate with ``fedsonmf flower app flower-app``).
The template lives in Python strings, not package data, so that a plain
``pip install`` of fedsonmf always has it; the run-config defaults come from
:mod:`fedsonmf.protocol.params` (declared once).
Never write results into the app directory: everything in it with a
``.py/.toml/.md/.json/...`` suffix is shipped with the next run.
"""

from __future__ import annotations

from pathlib import Path

from fedsonmf._io import private_dir, write_atomic
from fedsonmf.federation import deployment_defaults as dd
from fedsonmf.protocol.params import FLOWER_SECURE_AGGREGATION, default

__all__ = ["write_app_dir", "RUN_CONFIG_DEFAULTS", "PACKAGE"]

PACKAGE = "fedsonmf_flower_app"

#: run-config keys of the app and their defaults (``flwr run --run-config`` may override only these)
RUN_CONFIG_DEFAULTS: dict[str, object] = {
    "num-clients": 3,           # number of views = SuperNodes
    "num-rounds": default("max_rounds"),  # max rounds (a private run: at most its dp_rounds)
    "tol": default("tol"),      # stop when R/R1 <= tol (unused when the clients send no diagnostics)
    "seed": dd.SEED,
    "algorithm": default("algorithm"),  # any name of fedsonmf.algorithms.ALGORITHMS
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
    "secure-aggregation": FLOWER_SECURE_AGGREGATION,  # pairwise-masked uploads: the server sees only sums
    "config-json": "",          # full FedConfig.to_dict() as JSON; replaces the keys above when set
    "out-dir": "",              # absolute directory on the SuperLink host (required)
    "job-id": "",               # names the clients' state files; keep it to resume
    "resume": False,            # continue from out-dir/checkpoint
    "round-timeout": dd.ROUND_TIMEOUT,  # seconds to wait for all replies of one round
    "node-timeout": dd.NODE_TIMEOUT,  # seconds to wait for all views to come online
    "startup-timeout": 0.0,     # seconds for the nodes' start-up (setup exchange); 0 = node-timeout
    "poll-interval": 0.02,      # seconds between pulls
    "setup-at-handshake": True, # the hellos carry the setup: one exchange (a Flower round trip) less before round 1
    "record-wire": False,       # write out-dir/wire.jsonl (privacy audit)
    "record-wire-arrays": False,  # also save every array the server receives (out-dir/wire-arrays/)
    "min-clients": 0.0,         # partial participation (§15.2): quorum per round, int >= 1 or fraction; 0 = off
    "sample-clients": 0.0,      # clients asked per round, int >= 1 or fraction; 0 = every client
    "rejoin": dd.REJOIN,         # correction of a returning client: server (measured default) | refresh | drop | stale
    "sim-data-dir": "",         # simulation only: folder of view<p>.* files, one per simulated partition (nodeconfig)
    "gate-token": "",           # the coordinator's signed authorisation of this run (set by the launcher; see .gate)
    "secagg-peers": "",         # JSON list of every view's public signing key (secure aggregation); "" = none
    "node-pins": "",            # pins file {view: node id, key} on the SuperLink host (node auth); "" = unpinned
    # clustering (FedMultiViewClustering's pipeline, fedsonmf.federation.flower.clustering)
    "mode": "fit",              # fit | predict (one exchange with the fitted bases fixed; new samples from each
                                # node's own node-config predict-path)
    "n-clusters": 0,            # c > 0: cluster the samples (labels.csv); 0 = factorisation only
    "rank-rule": dd.RANK_RULE,   # r from c and the d_p the nodes report: auto (2c, narrow views padded) |
                                # paper (c) | an integer (capped); replaces rank / config-json's n_components
    "preprocess": default("preprocess"),            # each node's rule for its own view
    "normalize-views": default("normalize_views"),  # each node divides its view by its Frobenius norm
    "normalize-embedding": default("normalize_embedding"),
    "kmeans-n-init": default("kmeans_n_init"),
    "kmeans-max-iter": default("kmeans_max_iter"),
    "early-stop": default("early_stop"),       # labels: the server stops when its k-means of V has settled
    "refine": default("refine"),               # kmeans+graph: the server refines the partition with the nodes
    "refine-starts": default("refine_starts"),  # starts of the refinement; only dense views score them
    "refine-seeded-starts": default("refine_seeded_starts"),  # k-means++ starts, once a dense view scores
    "refine-spectral-steps": default("refine_spectral_steps"),  # the graph stage's spectral start (<= n // 2c)
    "n-init": str(default("n_init")),  # fits with different seeds (auto = 5, 1 under DP); the medoid's is kept
    "model-dir": "",            # predict: the fit's out-dir (on the SuperLink host)
}

_SERVER = '''"""Shim: the real ServerApp is fedsonmf.federation.flower.server_app."""
import fedsonmf.federation.flower.server_app as _impl

app = _impl.app
'''

_CLIENT = '''"""Shim: the real ClientApp is fedsonmf.federation.flower.client_app."""
import fedsonmf.federation.flower.client_app as _impl

app = _impl.app
'''

# the project's LICENSE, verbatim (tests/test_flower_app_folder.py checks it)
_LICENSE = """BSD 3-Clause License

Copyright (c) 2026, the fedsonmf developers

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this
   list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice,
   this list of conditions and the following disclaimer in the documentation
   and/or other materials provided with the distribution.

3. Neither the name of the copyright holder nor the names of its
   contributors may be used to endorse or promote products derived from
   this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""


_HEADER = """\
# The fedsonmf Flower app (written by fedsonmf.federation.flower.template.write_app_dir; do not edit
# by hand: regenerate with `fedsonmf flower app flower-app`).  Deploy it on any Flower 1.42 SuperLink:
#
#     flwr run flower-app <connection> --stream --run-config 'num-clients=3 out-dir="/abs/dir" ...'
#
# Every machine needs fedsonmf installed with the flower extra (pip install "<fedsonmf checkout>[flower]");
# run-time dependency installation must be off (the SuperLink's --disable-runtime-dependency-installation):
# "fedsonmf" below is not on a package index.  Each SuperNode names its own view in its node config:
#     --node-config 'partition-id=<p> num-partitions=<m> data-path="/data/view<p>.npy" state-dir="/data/state"'
# Simulation (Flower's simulation engine): run config sim-data-dir = a folder of view<p>.* files.
# The run-config keys and their meaning: docs/flower.md, "The app folder".

"""


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_app_dir(dest, *, client_source: str | None = None, server_source: str | None = None,
                  extra_config: dict | None = None, publisher: str = "fedsonmf") -> Path:
    """Write the shim Flower app to ``dest`` and return it.

    Parameters
    ----------
    dest : path
        The app folder (created; only the app's files go there).
    client_source, server_source : str or None, default=None
        Replace the shim modules (tests wrap the ClientApp with a fault hook this way).
    extra_config : dict or None, default=None
        Run-config keys added to :data:`RUN_CONFIG_DEFAULTS`.
    publisher : str, default="fedsonmf"
        ``[tool.flwr.app] publisher``.

    Returns
    -------
    Path
        ``dest``.
    """
    dest = Path(dest)
    pkg = dest / PACKAGE
    private_dir(dest)
    private_dir(pkg)
    conf = {**RUN_CONFIG_DEFAULTS, **(extra_config or {})}
    config_lines = "\n".join(f"{k} = {_toml_value(v)}" for k, v in conf.items())
    write_atomic(dest / "pyproject.toml", f'''{_HEADER}[build-system]
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
    write_atomic(dest / "LICENSE", _LICENSE)
    write_atomic(pkg / "__init__.py", '"""fedsonmf Flower shim app."""\n')
    write_atomic(pkg / "server_app.py", server_source or _SERVER)
    write_atomic(pkg / "client_app.py", client_source or _CLIENT)
    return dest
