"""`python -m seekrl ...`: the same as the `seekrl` command (torchrun and started servers use it)."""

import sys

from seekrl.cli import main

sys.exit(main())
