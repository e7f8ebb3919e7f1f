"""`python -m stable_models train | evaluate | predict | doctor` (the same as the `stable-models` command)."""

from .cli import run

if __name__ == "__main__":
    run()
