"""`python -m stable_models train | evaluate | predict | doctor` (the same as the `stable-models` command)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
