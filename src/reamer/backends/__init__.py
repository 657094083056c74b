"""Backends: where decisions become real. ``sim`` (discrete-event); ``local`` and ``k8s`` later."""
