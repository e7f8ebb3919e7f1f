"""Which architectures of the test table export to ONNX with the Stable class, and whether the stock class does.

    .venv/bin/python scripts/onnx_exporters.py [NAME ...] | grep '^{'    # default: every row of the table

For each row: `torch.onnx.export(dynamo=False)` (tracing) on an unpadded batch, checked in ONNX Runtime against eager
on left- and right-padded batches (within 1e-5). If that fails, `dynamo=True`; if that fails too, both exporters on
the stock class with the same weights, so the README can say whose limit it is. One JSON line per row; a row gets 240 s.
"""

import json
import logging
import os
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import architectures  # noqa: E402
from test_export import LENGTHS, TOLERANCE, export, run  # noqa: E402


class TooSlow(Exception):
    pass


def too_slow(*_):
    raise TooSlow("over 240 s")


def attempt(model, dynamo: bool) -> str:
    """The worst |ONNX Runtime - eager| over left and right padding, or FAIL and the first line of the error."""
    try:
        with tempfile.TemporaryDirectory() as folder:
            session = export(model, os.path.join(folder, "model.onnx"), dynamo)
            worst = 0.0
            for side in ("left", "right"):
                ids, mask = architectures.pad_batch(architectures.random_sequences(LENGTHS), side)
                with torch.no_grad():
                    eager = model(ids, attention_mask=mask, use_cache=False).logits
                worst = max(worst, (run(session, ids, mask) - eager).abs().max().item())
            return f"{worst:.1e}"
    except Exception as error:  # noqa: BLE001 - every failure is a result here
        lines = str(error).strip().splitlines()
        return f"FAIL {type(error).__name__}: {lines[0][:150] if lines else ''}"


def exact(result: str) -> bool:
    return not result.startswith("FAIL") and float(result) <= TOLERANCE


def main(names):
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, too_slow)
    for name in names or [arch.name for arch in architectures.ARCHITECTURES]:
        arch = architectures.BY_NAME[name]
        result, start = {"name": name}, time.perf_counter()
        signal.alarm(240)
        try:
            stable, stock = architectures.make_models(
                arch, attn="sdpa" if "sdpa" in arch.attn_implementations else "eager"
            )
            result["stable_ts"] = attempt(stable, dynamo=False)
            if not exact(result["stable_ts"]):
                result["stable_dyn"] = attempt(stable, dynamo=True)
                if not exact(result["stable_dyn"]):
                    result["stock_ts"] = attempt(stock, dynamo=False)
                    result["stock_dyn"] = attempt(stock, dynamo=True)
        except TooSlow as error:
            result["error"] = str(error)
        finally:
            signal.alarm(0)
        result["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
