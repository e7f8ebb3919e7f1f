"""torch.compile: same logits as eager, and no more graph breaks than the stock class."""

import pytest
import torch
from architectures import BY_NAME, make_models, pad_batch, random_sequences

from stable_models import PackedCollator


@pytest.mark.parametrize("arch", [BY_NAME["qwen2"], BY_NAME["llama"]], ids=str)
def test_compiled_logits_and_graph_breaks(arch):
    torch._dynamo.reset()
    stable, stock = make_models(arch, "sdpa")
    ids, mask = pad_batch(random_sequences([9, 4, 6]), "left")
    with torch.no_grad():
        eager = stable(ids, attention_mask=mask).logits
        compiled = torch.compile(stable, backend="eager")(ids, attention_mask=mask).logits
        breaks = {
            name: torch._dynamo.explain(model)(ids, attention_mask=mask).graph_break_count
            for name, model in (("stable", stable), ("stock", stock))
        }
    assert (compiled - eager).abs().max() <= 1e-5
    assert breaks["stable"] <= breaks["stock"], breaks


def test_compiled_packed_training_gives_the_eager_logits_loss_and_gradients_in_feature_order():
    """Packed batches under torch.compile: the data-dependent packing steps run eagerly (graph breaks), so every text
    gets its own logits in feature order, never one logit per row."""
    torch._dynamo.reset()
    stable, _ = make_models(BY_NAME["qwen2"], "sdpa")
    stable.train()
    sequences = random_sequences([9, 4, 6, 3, 5])
    labels = torch.tensor([0, 1, 2, 1, 0])
    batch = PackedCollator(max_tokens=12)(
        [{"input_ids": s, "labels": y} for s, y in zip(sequences, labels, strict=True)]
    )
    assert "packed_example_index" in batch and batch["input_ids"].shape[0] < len(sequences)  # several rows, reordered
    results = {}
    for name, model in (("eager", stable), ("compiled", torch.compile(stable, backend="eager"))):
        stable.zero_grad()
        out = model(**batch)
        out.loss.backward()
        results[name] = out.logits.detach(), out.loss.detach(), [p.grad.clone() for p in stable.parameters()]
    (eager, eager_loss, eager_grads), (compiled, compiled_loss, compiled_grads) = results["eager"], results["compiled"]
    assert compiled.shape == (len(sequences), 3)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-6, rtol=1e-6)
    for grad, eager_grad in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(grad, eager_grad, atol=1e-5, rtol=1e-4)
    stable.eval()
    with torch.no_grad():  # and each text's logits are those of the text alone
        alone = torch.cat([stable(s[None]).logits for s in sequences])
    torch.testing.assert_close(compiled, alone, atol=1e-5, rtol=1e-5)


def test_export_with_position_ids_is_refused_with_the_fix_named():
    """An exported graph cannot tell a packed batch from a padded one: refused at export, not a wrong shape later."""
    stable, _ = make_models(BY_NAME["qwen2"])
    batch = PackedCollator()([{"input_ids": s} for s in random_sequences([5, 3])])
    with pytest.raises(Exception, match="export or trace with input_ids and attention_mask only"):
        torch.export.export(stable, (batch["input_ids"],), {"position_ids": batch["position_ids"]}, strict=False)
    ids, mask = pad_batch(random_sequences([5, 3]), "left")
    exported = torch.export.export(stable, (ids,), {"attention_mask": mask}, strict=False)  # the supported signature
    with torch.no_grad():
        torch.testing.assert_close(
            exported.module()(ids, attention_mask=mask).logits, stable(ids, attention_mask=mask).logits
        )
