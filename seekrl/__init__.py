"""seekrl: train language models to reason and use tools with reinforcement learning.

See README.md for the quickstart and ../shared/DESIGN.md (the project's design page) for the
data flow and contracts.
"""

from seekrl.memory import limit_malloc_arenas

# At most 2 glibc malloc arenas for any process that imports seekrl (the `seekrl` command, a
# script calling seekrl.jobs, a trainer rank), set before seekrl imports torch (seekrl/memory.py).
limit_malloc_arenas()

from seekrl.types import Completion, SamplingParams, Task, Trajectory, TrajectoryGroup  # noqa: E402

__all__ = ["Task", "SamplingParams", "Completion", "Trajectory", "TrajectoryGroup"]
__version__ = "0.1.0"
