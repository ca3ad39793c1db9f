"""The request policy of seekrl's servers: `seekrl.api.guards` (here under its public name, so
`from seekrl.servers.guards import Guard` keeps working)."""

from seekrl.api.guards import *  # noqa: F401,F403
from seekrl.api.guards import __all__  # noqa: F401
