"""The failures seekrl reports as one line, and the exit status of each.

    seekrl: error: <message>            (stderr; exit status `exit_status`)

- Bad input, exit 2: `ConfigError` (a config value; raised before any model loads), `DataError`
  (a data file or row, named as file:line), `CheckpointError` (the checkpoint `train.resume`
  names cannot be loaded), `NonFiniteError` (train.max_nonfinite updates in a row had a nan/inf
  loss or gradient norm: the inputs - learning rate, rewards - make training diverge).
- Failures of what the run talks to, exit 1: `EngineUnavailable` (no engine server answers),
  `EngineRequestError` (a server refused a request), `LaunchError` (a `seekrl launch` job failed;
  its own status).

Everything else is a bug and keeps its traceback. This module imports nothing, so any layer
may raise these.
"""

from __future__ import annotations

__all__ = ["SeekrlError", "ConfigError", "DataError", "CheckpointError", "NonFiniteError", "EngineUnavailable",
           "EngineRequestError", "LaunchError", "ServiceUnavailable", "RewardUnavailable"]


class SeekrlError(Exception):
    """A failure reported as one line; `exit_status` is what the CLI exits with."""

    exit_status = 1


class ConfigError(SeekrlError, ValueError):
    """A bad config value. The message is one line naming the key and the fix."""

    exit_status = 2


class DataError(SeekrlError, ValueError):
    """Bad input data: the message names the file and line (or row) and the problem."""

    exit_status = 2


class CheckpointError(SeekrlError):
    """A checkpoint that cannot be loaded: missing, incomplete, corrupt or of another kind of run.
    `reason` is the problem without the folder ("state.json is not valid JSON (...)")."""

    exit_status = 2

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class NonFiniteError(SeekrlError):
    """`train.max_nonfinite` steps in a row had a non-finite loss or gradient norm; their updates
    were skipped, so the weights and every checkpoint are finite."""

    exit_status = 2


class EngineUnavailable(SeekrlError, RuntimeError):
    """No engine server is left to send a request to (all refused, timed out or failed)."""


class EngineRequestError(SeekrlError, RuntimeError):
    """A server refused a request (4xx) or answered something seekrl cannot read."""


class ServiceUnavailable(SeekrlError, RuntimeError):
    """A service an episode depends on (a tool's server, a retriever) could not be reached or
    failed (5xx): an infrastructure failure, not the model's. The tool executor reports it as
    `ToolResult.error="unavailable"`, and the episode's trajectory is excluded from the update."""


class RewardUnavailable(ServiceUnavailable):
    """A reward's service (an LLM judge) could not score a completion: refused, timed out, 5xx or
    an unreadable reply after its retries. The Rubric reports it (`RewardResult.unavailable`) and
    the trajectory's status becomes `reward_unavailable`: left out of the update, counted, never
    scored 0."""


class LaunchError(SeekrlError, RuntimeError):
    """A `seekrl launch` job failed; the message is one line, `status` the exit status (2: bad input)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status

    @property
    def exit_status(self) -> int:  # type: ignore[override]
        return self.status
