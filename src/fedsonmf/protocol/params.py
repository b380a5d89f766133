"""Every user-facing parameter, declared once: name, default, meaning.

The function :func:`fedsonmf.federated_sonmf`, the estimators
:class:`~fedsonmf.FedSONMF` and :class:`~fedsonmf.estimators.FedMultiViewClustering`,
:class:`~fedsonmf.protocol.config.FedConfig` and the CLI options all take their
defaults and help texts from :data:`PARAMS`, so they cannot drift apart
(``tests/test_estimator_api.py`` checks every signature against this table).
Validation lives with the objects that use a value (``FedConfig`` for the
algorithm's parameters, the estimators for the run's); both are called at the
start of ``fit``, before any computation.

Scale-free defaults [C]: ``mu="auto"`` puts the server prox threshold
``eta_tilde * mu`` at ``mu_scale`` times the median row norm of the initial
V-bar^1, so it means the same at any data scale (the server computes it from
V-bar^1, which it builds anyway, and sends the number with each round: one
scalar); ``rho1=0`` (the U-step's proximal term) is trivially scale-free --
with it the U-solver's descent safeguard gives the monotonicity the proximal
term was for, and a positive ``rho1`` on Frobenius-normalised data freezes the
U-steps (docs/algorithm.md §11 proposes 1.0 for its synthetic generator's scale).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Param", "PARAMS", "FED_PARAMS", "RUN_PARAMS", "CLUSTER_PARAMS", "CLUSTERING_SIGNATURE", "SYNTHETIC_STUDY",
           "DP_PARAMS", "default", "options_of", "grouped", "FLOWER_SECURE_AGGREGATION"]


@dataclass(frozen=True)
class Param:
    """One parameter: its ``name``, ``default``, a one-line ``help`` (also the CLI help), what it
    ``accepts`` and where it lives in :class:`~fedsonmf.estimators.FedMultiViewClustering` (``group``).

    ``accepts`` lists the allowed kinds of value, as data (the estimators turn it into
    scikit-learn's ``_parameter_constraints``, :func:`fedsonmf.estimators.options.constraints`):
    ``None``; ``"bool"``; ``"random_state"``; ``"path"`` (str or os.PathLike); ``("str", *options)``;
    ``("int", low, high)`` (both ends included, None = unbounded); ``("real", low, high, closed)``
    (``closed`` as scikit-learn's Interval: "left", "right", "both", "neither"); ``("type", name)``
    (an option object of the estimators); ``("methods", *names)`` (an object with those methods).
    ``group``: ``""`` a parameter of the clustering estimator itself, else the option object that
    holds it (``"method"``, ``"refinement"``, ``"privacy"``, ``"inprocess"``, ``"flower"``) under the
    name ``field`` (default: ``name``).
    """

    name: str
    default: object
    help: str
    accepts: tuple = ()
    group: str = ""
    field: str = ""

    @property
    def key(self) -> str:
        """The parameter's name inside its option object."""
        return self.field or self.name


_POS_INT = ("int", 1, None)
_NONNEG_REAL = ("real", 0, None, "left")
_POS_REAL = ("real", 0, None, "neither")


_TABLE = [
    # -- the algorithm (FedConfig; travels to every client in the setup message)
    Param("n_components", 6, "Rank r: rows of V, columns of every basis U_p (at most every view's width).",
          (_POS_INT,)),
    Param("mu", "auto", "Weight of the l2,1 penalty on V; 'auto' = the scale-free rule (threshold "
                        "eta_g*tau*alpha*mu = mu_scale x median row norm of the initial V-bar).",
          (("str", "auto"), _NONNEG_REAL), group="method"),
    Param("mu_scale", 0.1, "The fraction used by mu='auto'.", (_NONNEG_REAL,), group="method"),
    Param("tau", 10, "Local steps per round.", (_POS_INT,), group="method"),
    Param("alpha", "auto", "Local step size (the server step is eta_g*tau*alpha); 'auto' = from the V-block's "
                           "curvature L = 2, so that a round contracts the V-error to 0.3 (0.0304 at tau 10, "
                           "eta_g 1.5; docs/speed.md).", (("str", "auto"), _POS_REAL), group="method"),
    Param("eta_g", 1.5, "Global (server) step multiplier.", (_POS_REAL,), group="method"),
    Param("rho1", 0.0, "Proximal weight of the U-subproblem (7), relative to nothing: 0 is scale-free.",
          (_NONNEG_REAL,), group="method"),
    Param("correction", True, "Drift correction (off: the 'no correction' ablation).", ("bool",), group="method"),
    Param("init_u", "auto", "Initial bases: 'auto' = 'svd' in a clustering fit and 'random' in a factorisation "
                            "(fedsonmf.core.init.resolve_init_u), 'random' or 'svd'.",
          (("str", "auto", "random", "svd"),), group="method"),
    Param("init_v", "projection", "Initial V-bar: 'projection' (mean_p max(U_p^T X_p, 0)) or 'random'.",
          (("str", "projection", "random"),), group="method"),
    Param("diagnostics", True, "Clients also send monitoring values (objective, residuals R_V, R_U); never "
                               "under differential privacy.", ("bool",), group="method"),
    Param("ustep", None, "Options of the U-solver (fedsonmf.core.ustep.PenaltyOptions); None = defaults.",
          (None, ("type", "PenaltyOptions")), group="method"),
    Param("batch_size", "auto", "Samples per local step (stochastic local steps, docs/algorithm.md §16): 'auto' = "
                                "all n below 20 000 samples, else ceil(n / tau) (every sample once per round); an "
                                "int b >= ceil(n / tau) (b >= n: all samples).",
          (("str", "auto"), _POS_INT), group="method"),
    Param("secure_aggregation", False, "Pairwise-masked secure aggregation: the server receives only the sums of "
                                       "the uploads it averages (docs/privacy.md). Off in-process by default; ON by "
                                       "default in Flower deployments (run_flower, `fedsonmf flower run`).",
          ("bool",), group="privacy"),
    Param("secagg_threshold", None, "Secure aggregation of rounds that may lose clients (participation): the "
                                    "number t of a round's clients whose Shamir shares remove the masks; the round "
                                    "completes while at least t uploaded and t answer the unmask step. None = "
                                    "ceil(2c/3) of the c clients asked; t must exceed c/2 (docs/privacy.md).",
          (None, ("int", 1, None)), group="privacy"),
    # -- differential privacy (fedsonmf.protocol.privacy; off unless dp_epsilon or dp_noise_multiplier is set)
    Param("dp_epsilon", None, "Differential privacy of each client's whole view: target epsilon of the run "
                              "(the noise is calibrated to it); None = no DP unless dp_noise_multiplier is set.",
          (None, _POS_REAL), group="privacy"),
    Param("dp_noise_multiplier", None, "DP noise std / sensitivity (2 x dp_clip), instead of dp_epsilon.",
          (None, _POS_REAL), group="privacy"),
    Param("dp_clip", 0.02, "DP: Frobenius bound of a client's change of V per round (its upload minus V^s), in "
                           "the data's units (views of Frobenius norm 1 in clustering).",
          (_POS_REAL,), group="privacy"),
    Param("dp_clip_setup", 0.2, "DP: Frobenius bound of the setup upload max(U_p^T X_p, 0) (data units).",
          (_POS_REAL,), group="privacy"),
    Param("dp_delta", 1e-5, "DP: the delta of the (epsilon, delta) guarantee.",
          (("real", 0, 1, "neither"),), group="privacy"),
    Param("dp_rounds", 10, "DP: rounds of a DP run (fixed in advance for the accountant; replaces max_rounds "
                           "and tol, which need the diagnostics).", (_POS_INT,), group="privacy"),
    # -- the run
    Param("max_rounds", 200, "Communication rounds at most.", (_POS_INT,)),
    Param("tol", 1e-4, "Stop when R/R1 <= tol (needs diagnostics; a clustering fit: R_step/R_step1, "
          "docs/algorithm.md §7.5); 0 runs all rounds.", (_NONNEG_REAL,)),
    Param("algorithm", "fedsonmf", "Federated algorithm (fedsonmf.algorithms.ALGORITHMS)."),
    Param("random_state", None, "Seed of every random choice: None, int, RandomState or Generator.", ("random_state",)),
    Param("n_jobs", 1, "Clients run in this many threads; FedMultiViewClustering runs up to this many of its "
                       "n_init fits at once instead (results do not depend on it).", (None, ("int", None, None))),
    Param("blas_threads", "auto", "Limit BLAS threads during the fit (threadpoolctl): 'auto' = 1 when clients run in "
                                  "parallel or the data products are small (docs/speed.md), None leaves them.",
          (None, ("str", "auto"), _POS_INT), group="inprocess"),
    Param("checkpoint_dir", None, "Save the state after every round here and resume from it.", (None, "path")),
    Param("verbose", 0, "0 silent, 1 progress (a line every 10 rounds, to stderr), 2 a line per round.", ("bool",
          ("int", 0, None))),
    # -- clustering
    Param("n_clusters", 8, "Number of clusters c.", (_POS_INT,)),
    Param("preprocess", "auto", "Each client's transform of its view: 'auto' (samples to unit norm; a dense "
                                "view -- its mean sample holds over half its energy -- is also centred, scaled to "
                                "unit variance and its samples scaled to unit norm again), 'l2' (samples to unit "
                                "norm only) or 'none' (docs/clustering.md).", (("str", "auto", "l2", "none"),)),
    Param("normalize_embedding", True, "Scale each sample's row of V^T to unit norm before k-means.",
          ("bool",), group="method"),
    Param("normalize_views", True, "Divide each view by its Frobenius norm first (the paper's preprocessing).",
          ("bool",), group="method"),
    Param("n_init", "auto", "Federated fits with different seeds: 'auto' = 5 (1 when no objective is reported: "
                            "diagnostics off or differential privacy, where every fit also spends budget), or an "
                            "int; the fit whose partition the others agree with most (the medoid) is kept.",
          (("str", "auto"), _POS_INT)),
    Param("kmeans_n_init", 10, "k-means replicates on each embedding.", (_POS_INT,), group="method"),
    Param("kmeans_max_iter", 300, "k-means iterations.", (_POS_INT,), group="method"),
    Param("early_stop", "labels", "Clustering's label-free stopping rule besides tol: 'labels' = stop when the "
                                  "server's warm-started k-means on V gives the same assignment 5 rounds in a row "
                                  "(docs/speed.md); 'none' = tol only. Off when tol = 0 (all rounds run).",
          (("str", "labels", "none"),), group="method"),
    Param("refine", "auto", "Last clustering steps: 'kmeans' = federated k-means on the row-normalised views, "
                            "started from the fit's partition (each client sends only distances); 'graph' = "
                            "federated normalized-cut refinement on the clients' k-NN graphs of their views (each "
                            "client sends only neighbour counts per cluster); 'kmeans+graph' = both, in that "
                            "order; 'none' = the partition of k-means on V; 'auto' = 'kmeans+graph', or 'none' "
                            "under differential privacy, which does not cover the refinements "
                            "(docs/clustering.md).", (("str", "auto", "kmeans+graph", "kmeans", "graph", "none"),)),
    Param("refine_starts", 10, "Starts of the refinement: the fit's partition and refine_starts - 1 partitions of "
                               "k-means on V; the refined one with the lowest score is kept, where only clients "
                               "with a dense view score (their k-means objective as a share of their spread); "
                               "with no dense view only the fit's partition is refined (docs/clustering.md).",
          (_POS_INT,), group="refinement", field="starts"),
    Param("refine_seeded_starts", 3, "More starts of the refinement once a dense view scores: partitions seeded "
                                     "by federated k-means++ on the pooled row-normalised views (about c exchanges "
                                     "in all; per start the server learns the summed distances to c (2 + ln c) "
                                     "drawn samples); 0 = none (docs/clustering.md).",
          (("int", 0, None),), group="refinement", field="seeded_starts"),
    Param("refine_spectral_steps", 20, "The graph refinement's spectral step: a second start from this many steps "
                                       "of orthogonal iteration on the summed graph (at most n // (2c); one "
                                       "exchange each), kept only if it lowers the normalized cut by 1 % and the "
                                       "dense views' k-means score does not rise; 0 = none (docs/clustering.md).",
          (("int", 0, None),), group="refinement", field="spectral_steps"),
    Param("run_dir", None, "The Flower run folder (one client folder per view, node state, logs, the server's "
                           "out-dir); None = a new temporary folder.", (None, "path"), group="flower"),
    Param("deployment", None, "A started LoopbackDeployment to fit on, left running (its daemons serve many fits; "
                              "the views must equal the files it serves); None = a deployment per fit "
                              "(docs/flower.md).", (None, ("methods", "run", "stop")), group="flower"),
    # -- the clustering estimator's option objects (fedsonmf.estimators.options)
    Param("method", None, "The method's options (MethodOptions: the factorisation, the views' scaling, k-means on "
                          "V, the label-free stopping rule); None = the defaults.", (None, ("type", "MethodOptions"))),
    Param("refinement", None, "The refinement's options (RefineOptions: its starts, seeded starts, spectral "
                              "steps); None = the defaults.", (None, ("type", "RefineOptions"))),
    Param("privacy", None, "Privacy options (PrivacyOptions: secure aggregation, differential privacy); None = "
                           "the defaults (no DP; secure aggregation on Flower, off in process).",
          (None, ("type", "PrivacyOptions"))),
    Param("federation", None, "Where the federation runs: None or InProcess(...) = this process; Flower(...) = a "
                              "loopback Flower deployment (SuperLink + one SuperNode per view).",
          (None, ("type", "InProcess"), ("type", "Flower"))),
]

#: every parameter by name
PARAMS: dict[str, Param] = {p.name: p for p in _TABLE}
#: the algorithm's parameters (the fields of FedConfig)
FED_PARAMS = ("n_components", "mu", "mu_scale", "tau", "alpha", "eta_g", "rho1", "correction", "init_u", "init_v",
              "diagnostics", "ustep", "batch_size", "secure_aggregation", "dp_epsilon", "dp_noise_multiplier",
              "dp_clip", "dp_clip_setup", "dp_delta",
              "dp_rounds")
#: the differential-privacy parameters (a subset of FED_PARAMS; fedsonmf.protocol.privacy)
DP_PARAMS = ("dp_epsilon", "dp_noise_multiplier", "dp_clip", "dp_clip_setup", "dp_delta",
              "dp_rounds")
#: the run's parameters (the estimator's besides FED_PARAMS)
RUN_PARAMS = ("max_rounds", "tol", "algorithm", "random_state", "n_jobs", "blas_threads", "checkpoint_dir",
              "verbose")
#: the clustering estimator's own parameters
CLUSTER_PARAMS = ("n_clusters", "preprocess", "normalize_embedding", "normalize_views", "n_init", "kmeans_n_init",
                  "kmeans_max_iter", "early_stop", "refine", "refine_starts", "refine_seeded_starts",
                  "refine_spectral_steps")
#: FedMultiViewClustering's own parameters, in its signature's order (every other one lives in an option object)
CLUSTERING_SIGNATURE = ("n_clusters", "n_components", "preprocess", "n_init", "refine", "max_rounds", "tol", "method",
                        "refinement", "privacy", "federation", "random_state", "n_jobs", "checkpoint_dir", "verbose")

#: the setting of the paper's synthetic study (docs/algorithm.md §8, §11): the generator's data have a
#: known scale, so mu and rho1 are given as numbers there (the synthetic figures use them); alpha = 0.01
#: is the step with which the study reproduces the paper's rounds to target (not the 'auto' rule)
SYNTHETIC_STUDY = {"mu": 1.0, "rho1": 1.0, "alpha": 0.01}


#: the default of ``secure_aggregation`` in Flower deployments (our choice: a real deployment is where
#: a curious server exists, so masking is on unless the operator opts out explicitly)
FLOWER_SECURE_AGGREGATION = True


def default(name: str):
    """The declared default of parameter ``name``."""
    return PARAMS[name].default


def options_of(name: str) -> tuple[str, ...]:
    """The string values parameter ``name`` accepts (its ``("str", ...)`` entry), declared once here."""
    for spec in PARAMS[name].accepts:
        if isinstance(spec, tuple) and spec[0] == "str":
            return tuple(spec[1:])
    return ()


def grouped(group: str) -> tuple[Param, ...]:
    """The parameters an option object holds (``group``: "method", "refinement", "privacy", "inprocess",
    "flower")."""
    return tuple(p for p in _TABLE if p.group == group)

