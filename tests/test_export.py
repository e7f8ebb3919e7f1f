"""ONNX: what the exporters users run produce gives the eager logits in ONNX Runtime, left, right and unpadded.

Tracing exporters (`torch.onnx.export(dynamo=False)`, optimum) run the forward once on an example and record it: any
Python decision on the data (is anything padded? is the first column padded?) would be frozen into the graph. The
Stable forward takes the graph-safe path under tracing, as under torch.compile.
"""

import pytest
import torch
import transformers
from architectures import BY_NAME, make_models, pad_batch, random_sequences

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

LENGTHS = [9, 4, 6]
TOLERANCE = 1e-5


class LogitsOnly(torch.nn.Module):
    """The exported signature: (input_ids, attention_mask) -> logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def export(model, path, dynamo: bool):
    ids = torch.randint(3, 90, (2, 7))
    mask = torch.ones_like(ids)  # traced on an unpadded batch: the case that froze the shortcuts
    batch, sequence = torch.export.Dim("batch", min=1), torch.export.Dim("sequence", min=2)
    kwargs = (
        {"dynamic_shapes": {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}}
        if dynamo
        else {"dynamic_axes": {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}}
    )
    torch.onnx.export(
        LogitsOnly(model),
        (ids, mask),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        dynamo=dynamo,
        **kwargs,
    )
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run(session, ids, mask):
    return torch.from_numpy(session.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0])


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("arch_name", ["qwen2", pytest.param("llama", marks=pytest.mark.exhaustive)])
def test_onnx_runtime_gives_the_eager_logits(arch_name, dynamo, tmp_path):
    stable, stock = make_models(BY_NAME[arch_name], attn="sdpa")
    if not dynamo and transformers.__version__.startswith("4."):
        # transformers 4.57 builds masks with torch.vmap, which torch.jit.trace cannot record: the stock class fails
        # to export the same way, so there is nothing for the Stable class to match on the floor
        for model in (stock, stable):
            with pytest.raises(RuntimeError, match="unordered_map"):
                export(model, tmp_path / "model.onnx", dynamo)
        return
    session = export(stable, tmp_path / "model.onnx", dynamo)
    sequences = random_sequences(LENGTHS)
    for side in ("left", "right"):
        ids, mask = pad_batch(sequences, side)
        with torch.no_grad():
            eager = stable(ids, attention_mask=mask).logits
        assert (run(session, ids, mask) - eager).abs().max() <= TOLERANCE, side
    ids = torch.stack([s[:4] for s in sequences])
    with torch.no_grad():
        eager = stable(ids, attention_mask=torch.ones_like(ids)).logits
    assert (run(session, ids, torch.ones_like(ids)) - eager).abs().max() <= TOLERANCE
