"""Shim: the real ServerApp is fedsonmf.federation.flower.server_app."""
import fedsonmf.federation.flower.server_app as _impl

app = _impl.app
