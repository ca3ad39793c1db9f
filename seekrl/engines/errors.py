"""Engine errors the CLI reports as one line (kept free of heavy imports: the CLI imports them first)."""


class EngineUnavailable(RuntimeError):
    """No engine server is left to serve a request (one line naming them and the last error)."""


class EngineRequestError(RuntimeError):
    """A server refused a request as bad (4xx), or sent what cannot be read: not a dead server."""
