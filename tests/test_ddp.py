"""Two gloo DDP processes (torchrun) with batch B give the loss curve of one process with batch 2B (also with class
weights and label smoothing: StableTrainer gathers the total class weight across processes)."""

from pathlib import Path

import pytest
from distributed import run_worker

WORKER = Path(__file__).with_name("ddp_worker.py")


def run(tmp_path, name, processes, batch, packing, stock=False):
    extra = {
        "padding": [],
        "one-row": ["--packing"],
        "capped, class weights": ["--packing", "--max-tokens", "16", "--class-weights"],
    }[packing]
    extra += ["--stock"] if stock else []
    return run_worker(WORKER, tmp_path / f"{name}.json", "--batch", str(batch), *extra, processes=processes)


# the default run takes the case that covers most (packing, capped rows, class weights); -m exhaustive the others
EXHAUSTIVE = pytest.mark.exhaustive


@pytest.mark.parametrize(
    "packing",
    [pytest.param("padding", marks=EXHAUSTIVE), pytest.param("one-row", marks=EXHAUSTIVE), "capped, class weights"],
)
def test_two_processes_match_one_with_the_doubled_batch(tmp_path, packing):
    single = run(tmp_path, "single", 1, 8, packing)
    ddp = run(tmp_path, "ddp", 2, 4, packing)
    assert ddp["world"] == 2 and single["world"] == 1
    assert len(ddp["losses"]) == len(single["losses"]) == 4
    assert ddp["losses"] == pytest.approx(single["losses"], rel=1e-4)
    assert ddp["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-4)
    assert ddp["weights"] == pytest.approx(single["weights"], rel=1e-6)


@pytest.mark.exhaustive
def test_stock_class_logs_twice_the_loss_and_grad_norm_under_two_processes(tmp_path):
    """The stock loss ignores num_items_in_batch, so Trainer's x num_processes (meant for a loss summed over the
    global item count) doubles what it logs and the gradient it clips; the Stable rows above log the true values."""
    single = run(tmp_path, "stock-single", 1, 8, "padding", stock=True)
    ddp = run(tmp_path, "stock-ddp", 2, 4, "padding", stock=True)
    true = run(tmp_path, "stable-single", 1, 8, "padding")
    assert single["losses"][0] == pytest.approx(true["losses"][0], rel=1e-5)  # one process: stock logs the truth
    assert ddp["losses"] == pytest.approx([2 * loss for loss in single["losses"]], rel=1e-4)
    assert ddp["grad_norms"] == pytest.approx([2 * norm for norm in single["grad_norms"]], rel=1e-4)
