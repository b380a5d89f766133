"""Shim: the real ServerApp is fedsonmf.federation.flower.server_app, with the clustering steps."""
import fedsonmf.federation.flower.server_app as _impl

app = _impl.make_server_app(clustering="fedsonmf.estimators.clustering_steps")
