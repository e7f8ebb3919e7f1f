"""`python -m stable_models doctor --model DIR [...]`."""

import sys

from .doctor import main

USAGE = "usage: python -m stable_models doctor --model DIR [--data FILE.jsonl] [--dtype bf16] [--padding-side left]"

USAGE += (
    "\n       python -m stable_models doctor --log trainer_state.json"
    "\n(python -m stable_models doctor --help: all options)"
)

if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0)
    if len(sys.argv) < 2 or sys.argv[1] != "doctor":
        sys.exit(USAGE)
    sys.exit(main(sys.argv[2:]))
