"""scikit-learn estimators on top of the federation: :class:`FedSONMF` (factorization,
transform) and :class:`FedMultiViewClustering` (factorization, then k-means), with the
clustering's option objects (:mod:`fedsonmf.estimators.options`)."""

from fedsonmf.estimators.clustering import FedMultiViewClustering
from fedsonmf.estimators.options import Flower, InProcess, MethodOptions, PrivacyOptions, RefineOptions
from fedsonmf.estimators.single import SparseONMF
from fedsonmf.estimators.sonmf import FedSONMF, federated_sonmf

__all__ = ["FedSONMF", "FedMultiViewClustering", "SparseONMF", "federated_sonmf", "MethodOptions", "RefineOptions",
           "PrivacyOptions", "InProcess", "Flower"]
