"""Shim: the real ClientApp is fedsonmf.federation.flower.client_app, with the clustering steps."""
import fedsonmf.federation.flower.client_app as _impl

app = _impl.make_client_app(clustering="fedsonmf.estimators.clustering_steps")
