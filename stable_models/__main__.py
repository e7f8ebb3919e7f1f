"""`python -m stable_models doctor --model DIR [...]`."""

import sys

from .doctor import main

USAGE = "usage: python -m stable_models doctor --model DIR [--data FILE.jsonl] [--dtype bf16] [--padding-side left]"

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "doctor":
        sys.exit(USAGE)
    sys.exit(main(sys.argv[2:]))
