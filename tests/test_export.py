"""ONNX: what the exporters users run produce gives the eager logits in ONNX Runtime, left, right and unpadded.

Tracing exporters (`torch.onnx.export(dynamo=False)`, optimum) run the forward once on an example and record it: any
Python decision on the data (is anything padded? is the first column padded?) would be frozen into the graph. The
Stable forward takes the graph-safe path under tracing, as under torch.compile.
"""

import importlib.util
import subprocess
import sys

import pytest
import tiny_tokenizers
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
        LogitsOnly(model).eval(),  # export restores the wrapper's mode afterwards, recursively: a new one trains
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


@pytest.mark.parametrize("arch_name", ["qwen2", pytest.param("llama", marks=pytest.mark.exhaustive)])
def test_optimum_cli_export_gives_the_eager_logits(arch_name, tmp_path):
    """`optimum-cli export onnx --task text-classification --trust-remote-code` on a saved Stable folder, the route
    users take to ONNX Runtime. optimum-onnx 0.1.0 needs transformers < 4.58, so CI runs this on the 4.57 floor."""
    if importlib.util.find_spec("optimum") is None or importlib.util.find_spec("optimum.exporters.onnx") is None:
        assert not transformers.__version__.startswith("4."), "the floor install must bring optimum-onnx (./dev)"
        pytest.skip("optimum-onnx 0.1.0 pins transformers < 4.58: this runs on the floor install")
    tokenizer = tiny_tokenizers.qwen2_like()
    stable = make_models(BY_NAME[arch_name], attn="sdpa", vocab_size=len(tokenizer))[0]
    stable.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    command = [
        sys.executable,
        "-m",
        "optimum.commands.optimum_cli",
        "export",
        "onnx",
        "--model",
        str(tmp_path / "model"),
    ]
    command += ["--task", "text-classification", "--trust-remote-code", str(tmp_path / "onnx")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    sequences = random_sequences(LENGTHS)
    unpadded = torch.stack([s[:4] for s in sequences])
    batches = [pad_batch(sequences, "left"), pad_batch(sequences, "right"), (unpadded, torch.ones_like(unpadded))]
    for ids, mask in batches:
        with torch.no_grad():
            eager = stable(ids, attention_mask=mask).logits
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        assert (torch.from_numpy(got) - eager).abs().max() <= TOLERANCE
