"""Defaults of a Flower deployment that are not algorithm parameters, declared once.

The algorithm's and the run's parameters live in :data:`fedsonmf.protocol.params.PARAMS`;
these are the deployment's own: how long the server waits, the seed a run config
needs, the rejoin rule and the clustering rank rule.  The Flower app template
(:data:`fedsonmf.federation.flower.template.RUN_CONFIG_DEFAULTS`), the launcher
(``run_flower``, ``predict_flower``) and ``fedsonmf flower ...`` take them from here.
This module imports no Flower, so the CLI can read it without the optional extra.
"""

from __future__ import annotations

__all__ = ["ROUND_TIMEOUT", "NODE_TIMEOUT", "SEED", "REJOIN", "RANK_RULE"]

#: seconds the server waits for the replies of one round
ROUND_TIMEOUT = 300.0
#: seconds the server waits for every view's SuperNode at the handshake
NODE_TIMEOUT = 120.0
#: the run seed of a deployment (a run config holds numbers, not None)
SEED = 0
#: correction of a client that missed rounds (docs/algorithm.md §15.2; the measured default)
REJOIN = "server"
#: a clustering run's rank rule: 2c, narrow views zero-padded (the estimator's default)
RANK_RULE = "auto"
