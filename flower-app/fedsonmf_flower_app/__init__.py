"""fedsonmf Flower shim app."""
