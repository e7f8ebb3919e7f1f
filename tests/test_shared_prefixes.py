"""Shared prefixes: a query group's first tokens (template head, query) computed once per group, and every document
still gets the logits it has alone, the loss and gradients of the plain packed batch."""

import pytest
import torch
from architectures import ALL_ARCH_ATTN, ALL_ARCH_ATTN_IDS, BY_NAME, logits_alone, make_models, random_sequences
from test_packing import packs

from stable_models import PackedGroupCollator, ranking_loss
from stable_models.modeling_rules import shared_prefix_obstacle

PREFIXES = [7, 3]  # two groups, each its own prefix
DOCUMENTS = [[4, 6, 1, 5], [2, 3]]  # each document's own tokens (one of a single token)


def groups(seed=0):
    """Two query groups of full documents (prefix + own tokens), relevance 1 for the first document."""
    prefixes = random_sequences(PREFIXES, seed=seed)
    features = []
    for g, (prefix, lengths) in enumerate(zip(prefixes, DOCUMENTS, strict=True)):
        own = random_sequences(lengths, seed=seed + 10 + g)
        own = [
            torch.cat([torch.tensor([9 + i]), t[1:]]) if len(t) > 1 else torch.tensor([9 + i])
            for i, t in enumerate(own)
        ]
        features.append(
            {"input_ids": [torch.cat([prefix, t]) for t in own], "relevance": [1.0] + [0.0] * (len(own) - 1)}
        )
    return features


def documents(features):
    return [ids for feature in features for ids in feature["input_ids"]]


def test_the_collator_lays_each_prefix_once_with_continuing_positions():
    features = groups()
    batch = PackedGroupCollator(max_tokens=None, share_prefixes=True)(features)
    plain = PackedGroupCollator(max_tokens=None)(features)
    shared_tokens = sum(PREFIXES) + sum(map(sum, DOCUMENTS))
    assert batch["input_ids"].shape == (1, shared_tokens)
    assert plain["input_ids"].shape == (1, sum(len(d) for d in documents(features)))
    positions = batch["position_ids"][0].tolist()
    first = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 7, 8, 9, 10, 11, 12, 7, 7, 8, 9, 10, 11]  # prefix 7, own 4, 6, 1, 5
    assert positions[: len(first)] == first
    assert positions[len(first) :] == [0, 1, 2, 3, 4, 3, 4, 5]  # the second group restarts at 0
    assert torch.equal(batch["labels"], plain["labels"]) and batch["group_sizes"].tolist() == [4, 2]


def test_a_large_group_repeats_its_prefix_per_unit_and_keeps_the_order():
    features = groups()
    batch = PackedGroupCollator(max_tokens=None, share_prefixes=True, prefix_unit_tokens=14)(features)
    positions = batch["position_ids"][0].tolist()
    assert positions.count(0) == 4  # group one in three units (7+4, 7+6+1, 7+5), group two in one
    stable, _ = make_models(BY_NAME["llama"], "sdpa")
    with torch.no_grad():
        logits = stable(**{k: v for k, v in batch.items() if k not in ("labels", "group_sizes")}).logits
    assert (logits - logits_alone(stable, documents(features))).abs().max() <= 1e-5


def test_identical_documents_keep_their_last_token_of_their_own():
    prefix = random_sequences([5])[0]
    features = [{"input_ids": [prefix, prefix.clone()], "relevance": [1.0, 0.0]}]
    batch = PackedGroupCollator(max_tokens=None, share_prefixes=True)(features)
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 4]
    stable, _ = make_models(BY_NAME["llama"])
    with torch.no_grad():
        logits = stable(**{k: v for k, v in batch.items() if k not in ("labels", "group_sizes")}).logits
    assert (logits - logits_alone(stable, documents(features))).abs().max() <= 1e-5


@pytest.mark.parametrize(("arch", "attn"), ALL_ARCH_ATTN, ids=ALL_ARCH_ATTN_IDS)
def test_each_document_gets_its_logits_alone_or_the_model_refuses(arch, attn):
    """Every architecture whose layers all take one 4D mask gives exact logits; the others (local windows, ALiBi,
    recurrent state, a kernel without custom masks) refuse the batch in one line instead of mixing documents."""
    stable, _ = make_models(arch, attn)
    features = groups()
    batch = PackedGroupCollator(max_tokens=None, share_prefixes=True)(features)
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "group_sizes")}
    if not packs(arch):
        with pytest.raises(ValueError, match="Pad instead of packing|pad instead of packing"):
            stable(**inputs)
        return
    if why := shared_prefix_obstacle(stable):
        with pytest.raises(
            ValueError, match=r"shares prefixes between examples .*Pack without shared prefixes"
        ) as error:
            stable(**inputs)
        assert why in str(error.value)
        return
    with torch.no_grad():
        logits = stable(**inputs).logits
    assert (logits - logits_alone(stable, documents(features))).abs().max() <= 1e-5


def test_the_stock_backbone_reads_a_continuing_document_without_its_prefix():
    """What the 4D mask is for: from position ids alone transformers starts a new sequence at every jump, so the
    second document would not see the query."""
    stable, stock = make_models(BY_NAME["llama"], "sdpa")
    features = groups()
    batch = PackedGroupCollator(max_tokens=None, share_prefixes=True)(features)
    with torch.no_grad():
        hidden = stock.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).last_hidden_state
        second_alone = stock.model(documents(features)[1][None]).last_hidden_state[0, -1]
    end_of_second = PREFIXES[0] + DOCUMENTS[0][0] + DOCUMENTS[0][1] - 1
    assert (hidden[0, end_of_second] - second_alone).abs().max() > 1e-2


def test_mean_pooling_refuses_shared_prefixes():
    stable, _ = make_models(BY_NAME["llama"], pooling="mean")
    batch = PackedGroupCollator(max_tokens=None, share_prefixes=True)(groups())
    with pytest.raises(ValueError, match="need last-token pooling"):
        stable(input_ids=batch["input_ids"], position_ids=batch["position_ids"])


@pytest.mark.parametrize("name", ["llama", "gpt_neox"])
def test_the_loss_and_gradients_equal_the_plain_packed_batch(name):
    stable, _ = make_models(BY_NAME[name], "sdpa", num_labels=1)
    stable.train()
    features = groups(seed=3)
    results = []
    for share in (True, False):
        stable.zero_grad()
        batch = PackedGroupCollator(share_prefixes=share)(features)  # rows near the longest unit
        sizes = batch.pop("group_sizes")
        labels = batch.pop("labels")
        loss = ranking_loss(stable(**batch).logits, labels, sizes)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in stable.parameters() if p.grad is not None]))
    (shared_loss, shared_grads), (plain_loss, plain_grads) = results
    assert abs(shared_loss - plain_loss) <= 1e-5
    assert len(shared_grads) == len(plain_grads) > 0
    for a, b in zip(shared_grads, plain_grads, strict=True):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max())


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_scoring_lists_in_order_computes_shared_starts_once_and_gives_each_its_logits_alone(batch_size):
    """evaluate / predict's engine: consecutive lists that start alike for 8 tokens or more (a query's documents)
    share one computation of that start; the others are packed alone. Every list gets its logits alone, in order."""
    from stable_models.scoring import logits_with_shared_prefixes

    query = random_sequences([9], seed=4)[0]
    lists = documents(groups())  # two groups: starts of 7 and 3 tokens (the second too short to share)
    lists += [torch.cat([query, t]) for t in random_sequences([1, 4, 2], seed=6)] + random_sequences([5], seed=7)
    stable, _ = make_models(BY_NAME["llama"], "sdpa")
    calls = []
    hook = stable.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["input_ids"]), with_kwargs=True
    )
    logits = logits_with_shared_prefixes(stable, lists, batch_size=batch_size)
    hook.remove()
    assert (logits - logits_alone(stable, lists)).abs().max() <= 1e-5
    if batch_size == 64:  # one forward: the 9-token query computed once for its 3 lists, starts of 7 and 3 apart
        (ids,) = calls
        assert (ids != 0).sum() == sum(len(t) for t in lists) - 2 * len(query)
