"""torch.compile: same logits as eager, and no more graph breaks than the stock class."""

import pytest
import torch
from architectures import BY_NAME, make_models, pad_batch, random_sequences


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
