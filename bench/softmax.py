"""softmax: kfc against torch.compile, Liger and QuACK on QuACK's 11 shapes (see bench.rows)."""

import sys

from .rows import main

if __name__ == "__main__":
    sys.exit(main("softmax"))
