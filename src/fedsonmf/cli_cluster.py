"""CLI commands of the cluster area (registered by :mod:`fedsonmf.cli`)."""

from __future__ import annotations


def register(app, reproduce_app) -> None:
    """Add this area's commands to the main app and to fedsonmf reproduce."""
