"""The live dashboard: a Starlette app that reads the one round stream
(:class:`reamer.runtime.rounds.RoundStream`) of a simulated (replayed), local or Kubernetes
run and draws it in the browser as rounds happen."""

from reamer.dashboard.app import Dashboard, create_app, listen, serve

__all__ = ["Dashboard", "create_app", "listen", "serve"]
