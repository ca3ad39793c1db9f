"""The request policy of seekrl's servers: `seekrl.api.guards` (here under its public name, so
`from seekrl.servers.guards import Guard` keeps working)."""

from seekrl.api.guards import (  # noqa: F401
    LOOPBACK,
    ClientGone,
    Guard,
    HTTPError,
    add_status_routes,
    bearer_token,
    cancel_on_disconnect,
    check_json,
    check_port,
    check_temperature,
    check_token,
    json_error,
    one_line,
    openapi_body,
    parse_json,
    resolve_token,
    token_matches,
    validation_message,
)

__all__ = ["LOOPBACK", "HTTPError", "Guard", "ClientGone", "cancel_on_disconnect", "check_json", "parse_json",
           "bearer_token", "check_token", "token_matches", "json_error", "openapi_body", "add_status_routes",
           "validation_message", "resolve_token", "check_port", "check_temperature", "one_line"]
