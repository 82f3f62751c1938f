"""`python -m kfc`: the `kfc` command, for an environment where the package is on the path
but not installed."""

import sys

from .cli import main

sys.exit(main())
