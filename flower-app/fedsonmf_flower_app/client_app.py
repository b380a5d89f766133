"""Shim: the real ClientApp is fedsonmf.federation.flower.client_app."""
import fedsonmf.federation.flower.client_app as _impl

app = _impl.app
