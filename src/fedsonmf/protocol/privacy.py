"""Differential privacy of a run: what is protected, and the (epsilon, delta) accountant.

**The unit of privacy is a client's whole view X_p** (view-level, "client-level"
DP; our choice).  Two runs are neighbours when one client's view is replaced by
any other view of the same shape, everything else equal.  Each client clips and
noises everything it uploads (:mod:`fedsonmf.core.dp`, applied by
:class:`fedsonmf.federation.loop.ClientRuntime`):

* setup: V_proj = max(U_p^T X_p, 0) (r x n), clipped to Frobenius norm ``dp_clip_setup``;
* every round: the change Vhat_p - V^s (r x n), clipped to ``dp_clip`` (V^s is public);
* Gaussian noise of std ``dp_noise_multiplier * 2 * C`` per entry (C the release's
  clip), from the client's own noise stream;
* no diagnostics (they would be unnoised per-client uploads), no x_sqnorm
  (``init_v="random"`` is refused), so nothing else about X_p leaves the node.

Whatever the previous rounds released, two views give clipped values at most
``2 C`` apart, so each release is a Gaussian mechanism of noise
multiplier ``dp_noise_multiplier`` (std / L2 sensitivity) and a run is their
adaptive composition: ``rounds + 1`` releases per client (``rounds`` without the
setup upload).  The accountant is dp-accounting's :class:`RdpAccountant`
(Rényi DP, converted to (epsilon, delta); an upper bound, within about 10 % of
the exact Gaussian value for these compositions).

Why the view and not one sample: U_p is computed from *all* samples of the
view, so one sample's features move every column of U_p^T X_p, not only its
own; clipping per column would bound nothing.  The only bound we can prove is
the whole view's, and a view-level guarantee implies the same (epsilon, delta)
for any part of the view: one sample's features in that view, one feature.

What the guarantee covers: everything the client sends (and so V, the
server's messages and every later use of them: post-processing), against any
party that sees the client's uploads.  What it does not cover: the public
facts d_p (the view's width) and n; with incomplete views the set of samples a
client holds (sent in the clear); a sample's data in *several* views at once
(each client protects its own view; ``epsilon_all_views`` is the bound when
every view changes); a client that colludes with the server against another
(the guarantee of each client rests on its own noise only, so collusion changes
nothing -- this is why the noise is calibrated that way); and, in a deployment,
a node whose noise seed is known to the server (each node draws its own from OS
entropy; only the in-process simulation derives it from ``random_state``).

Three numbers are reported (:func:`privacy_report`):

* ``epsilon`` -- one view, against anyone who sees that client's uploads (plain mode);
* ``epsilon_secagg`` -- one view, against a server that sees only the sums over
  the m clients (secure aggregation) while the other clients are honest: the
  sum carries m clients' noise, multiplier ``z sqrt(m)``;
* ``epsilon_all_views`` -- every view changed at once (the whole federation's
  data; hence one sample's features in every view): multiplier ``z / sqrt(m)``.
"""

from __future__ import annotations

import functools
import math

__all__ = ["ACCOUNTANT", "UNIT", "releases", "run_event", "epsilon", "calibrate_noise_multiplier",
           "privacy_report"]

#: the accountant used (reported with every epsilon)
ACCOUNTANT = "dp-accounting RdpAccountant (Renyi DP of the composed Gaussian mechanisms)"
#: the unit of privacy, in words (reported with every epsilon)
UNIT = ("one client's whole view X_p (replace-one-view neighbours); implies the same bound for any "
        "part of that view, e.g. one sample's features in it")


def releases(rounds: int, setup_upload: bool) -> int:
    """Noised uploads of one client in a run of ``rounds`` rounds (+1 for the V_proj setup upload)."""
    return int(rounds) + (1 if setup_upload else 0)


def run_event(noise_multiplier: float, n_releases: int):
    """The dp-accounting event of ``n_releases`` Gaussian mechanisms of one noise multiplier."""
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(float(noise_multiplier)),
                                             int(n_releases))


@functools.lru_cache(maxsize=256)
def epsilon(noise_multiplier: float, n_releases: int, delta: float) -> float:
    """epsilon at ``delta`` of ``n_releases`` composed Gaussian mechanisms (multiplier = std / sensitivity)."""
    from dp_accounting.rdp import RdpAccountant

    if n_releases == 0:
        return 0.0
    acc = RdpAccountant()
    acc.compose(run_event(noise_multiplier, n_releases))
    return float(acc.get_epsilon(float(delta)))


@functools.lru_cache(maxsize=256)
def calibrate_noise_multiplier(target_epsilon: float, delta: float, n_releases: int) -> float:
    """The smallest noise multiplier whose ``n_releases``-fold composition is (target_epsilon, delta)-DP.

    dp-accounting's ``calibrate_dp_mechanism`` (Brent search over the accountant);
    the value returned is nudged up to the tolerance so the target is never exceeded.
    """
    from dp_accounting import mechanism_calibration as mc
    from dp_accounting.rdp import RdpAccountant

    z = mc.calibrate_dp_mechanism(RdpAccountant, lambda z: run_event(z, n_releases), float(target_epsilon),
                                  float(delta), mc.LowerEndpointAndGuess(1e-6, 1.0), tol=1e-7)
    while epsilon(z, n_releases, delta) > target_epsilon:  # the search's tolerance may land just below
        z *= 1.0 + 1e-6
    return float(z)


def privacy_report(cfg, rounds: int, n_clients: int) -> dict:
    """The (epsilon, delta) of a DP run of ``rounds`` completed rounds with ``n_clients`` clients.

    ``cfg`` is the run's :class:`~fedsonmf.protocol.config.FedConfig` (DP on).
    """
    z = cfg.dp_sigma
    k = releases(rounds, cfg.init_v == "projection")
    m = max(int(n_clients), 1)
    d = cfg.dp_delta
    return {
        "unit": UNIT,
        "mechanism": "clip each round upload's change to Frobenius norm dp_clip (the setup upload to "
                     "dp_clip_setup), add Gaussian noise of std noise_multiplier * 2 * clip per entry "
                     "(each client, before it sends)",
        "accountant": ACCOUNTANT,
        "epsilon": epsilon(z, k, d),
        "epsilon_secagg": epsilon(z * math.sqrt(m), k, d),
        "epsilon_all_views": epsilon(z / math.sqrt(m), k, d),
        "delta": d,
        "target_epsilon": cfg.dp_epsilon,
        "noise_multiplier": z,
        "clip": cfg.dp_clip,
        "clip_setup": cfg.dp_clip_setup,
        "noise_std": z * 2.0 * cfg.dp_clip,
        "releases_per_client": k,
        "rounds": int(rounds),
        "n_clients": m,
    }
