"""``python -m capo_verl.compare``: the same as ``capo-verl compare``."""

import sys

from capo_verl.compare.cli import main

if __name__ == "__main__":
    sys.exit(main())
