"""Training an embedding model contrastively, exactly over the whole global batch (issue 58): the negatives of every
query are every candidate of the optimizer step, whatever the micro-batch and however many processes.

The shape keeps DDP, DeepSpeed and FSDP on ordinary gradient accumulation (sentence-transformers' cached loss runs
several backwards inside one, which DeepSpeed refuses: Tevatron #206). The cached chunk is the micro-batch:
1. Trainer fetches a step's micro-batches together (`get_batch_samples`): `EmbeddingTrainer` embeds them without a
   graph, gathers the vectors (and the texts' hashes) across processes, and takes the loss and its gradient in the
   vectors (`cache_step`);
2. each training step then forwards its micro-batch again, replaying its random state, and backpropagates that
   gradient (a surrogate whose gradient is the true one), scaled for the process count DDP averages over. On one
   process without DeepSpeed or FSDP, the step's first micro-batch keeps the graph of its cache forward instead (one
   forward fewer a step; a single micro-batch is then forwarded once), and under activation checkpointing the first
   `KEPT_CHECKPOINTED` do: such a graph holds only the layers' inputs, and the backward's recomputation is the only
   second forward. DDP syncs and the sharding engines gather per forward-backward pair, so there every micro-batch is
   replayed.
The logged loss is the global batch's; a candidate equal to a query's positive is masked from that query (across
the global batch) and counted (`false_negatives` in the log).
"""

import zlib

import torch
from transformers import Trainer

from .losses import InfoNCELoss


def text_hash(ids) -> int:
    """The same on every process (Python's hash of a tuple is salted per process)."""
    return zlib.crc32(torch.as_tensor(ids, dtype=torch.int64).numpy().tobytes())


# a checkpointed graph holds each layer's input, about 1/18 of a full graph's activations (SmolLM2-135M with LoRA,
# 12 SciQ texts packed: 60 MB against 1.06 GB): 8 kept hold under half of one plain micro-batch's graph, and memory
# stays flat in --grad-accum beyond them
KEPT_CHECKPOINTED = 8
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "packed_example_index", "prompt_length")


class EmbeddingCollator:
    """Features {query_input_ids, positive_input_ids, negative_input_ids (a list of id lists)} -> one batch of every
    text in the order [queries, positives, negatives], with `queries` (how many), `negatives` (per query) and
    `hashes` (one per text: which texts are equal). `packing=True`: the texts packed end to end into rows without
    padding (`PackedCollator`; the Stable forward pools each text and returns the vectors in this order).
    `prompt_tokens` ({"query": n, "document": m}, for an embedder with include_prompt=False): each text's
    `prompt_length`, so its prompt stays out of the mean (`stable_models.prompt_length` counts them)."""

    def __init__(self, tokenizer, packing: bool = False, prompt_tokens: dict | None = None):
        self.tokenizer, self.packing, self.prompt_tokens = tokenizer, packing, prompt_tokens

    def __call__(self, features):
        queries = [f["query_input_ids"] for f in features]
        positives = [f["positive_input_ids"] for f in features]
        negatives = [list(n) for f in features for n in f.get("negative_input_ids") or []]
        texts = queries + positives + negatives
        if self.packing:
            from .packing import PackedCollator

            pad = self.tokenizer.pad_token_id or 0
            batch = PackedCollator(pad_token_id=pad)([{"input_ids": list(t)} for t in texts])
        else:
            batch = self.tokenizer.pad({"input_ids": texts}, padding=True, return_tensors="pt")
        batch["queries"] = torch.tensor(len(queries))
        batch["negatives"] = torch.tensor([len(f.get("negative_input_ids") or []) for f in features])
        batch["hashes"] = torch.tensor([text_hash(t) for t in texts], dtype=torch.int64)
        if self.prompt_tokens:
            query, document = self.prompt_tokens.get("query", 0), self.prompt_tokens.get("document", 0)
            batch["prompt_length"] = torch.tensor([query] * len(queries) + [document] * (len(texts) - len(queries)))
        return batch


class EmbeddingTrainer(Trainer):
    """Trainer for an embedding model (a `Stable<Name>ForEmbedding`, its `pooler_output` the vector) with
    `EmbeddingCollator` batches: `loss` (default `InfoNCELoss()`) over the global batch, cached per micro-batch (see
    the module's docstring). Dropout should be 0 for the replayed forward to give the cached vectors exactly."""

    def __init__(self, *args, loss: InfoNCELoss | None = None, **kwargs):
        self.loss = loss or InfoNCELoss()
        # a compute_loss_func tells Trainer the loss needs no division by the accumulation steps; compute_loss is ours
        super().__init__(*args, compute_loss_func=self.loss, **kwargs)
        self._cache, self._next, self.false_negatives = [], 0, 0

    def _get_num_items_in_batch(self, batch_samples, device):
        """Called once per optimizer step with its micro-batches (evaluation never comes here)."""
        if batch_samples and "hashes" in batch_samples[0]:
            self.cache_step(batch_samples, device)
        return None

    @staticmethod
    def vectors(model, inputs):
        given = {k: inputs[k] for k in MODEL_INPUTS if k in inputs}  # padded, or packed (positions, example order)
        return model(**given).pooler_output.float()

    def cache_step(self, batch_samples, device) -> None:
        """Embed the step's micro-batches without a graph, gather across processes, and keep, per micro-batch, the
        global loss's gradient in its vectors and the random state its forward started from."""
        parts, states = [], []
        self.model.train()  # the mode the training forwards run in (Trainer sets it at each step)
        one_process = self.args.world_size == 1 and not (self.is_deepspeed_enabled or self.is_fsdp_enabled)
        kept_count = KEPT_CHECKPOINTED if checkpointing(self.model) else 1
        kept = [one_process and index < kept_count for index in range(len(batch_samples))]
        for batch, keep in zip(batch_samples, kept, strict=True):
            inputs = self._prepare_inputs(batch)
            states.append(random_state())
            with torch.set_grad_enabled(keep):
                vectors = self.vectors(self.model, inputs)
            queries, counts = int(inputs["queries"]), inputs["negatives"].tolist()
            parts.append((vectors, queries, counts, inputs["hashes"]))
        rows = local_rows(parts)
        gathered = gather(rows, self.args.world_size)
        rank = self.args.process_index
        queries, candidates, positive_index, hashes, offsets = global_batch(gathered)
        queries, candidates = queries.detach().requires_grad_(True), candidates.detach().requires_grad_(True)
        masked = self.loss.false_negatives(hashes, positive_index)
        loss = self.loss(queries, candidates, positive_index, masked)
        loss.backward()
        self.false_negatives = int(masked.sum())
        grads = local_gradients(queries.grad, candidates.grad, offsets[rank], parts)
        scale = self.args.world_size  # DDP (and DeepSpeed, FSDP) average the processes' gradients
        value = loss.detach().to(device) / len(parts)  # the micro-batches' values add up to the global loss
        graphs = [part[0] if keep else None for part, keep in zip(parts, kept, strict=True)]  # vectors with a graph
        self._cache = [
            (g.to(device) * scale, state, value, graph) for g, state, graph in zip(grads, states, graphs, strict=True)
        ]
        self._next = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        grad, state, value, vectors = self._cache[self._next]
        self._cache[self._next] = None  # a kept graph goes with this micro-batch's backward
        self._next += 1
        if vectors is None:
            after = random_state()
            set_random_state(state)  # the forward the vectors were cached from, replayed
            vectors = self.vectors(model, inputs)
            set_random_state(after)
        surrogate = (vectors * grad).sum()
        loss = surrogate - surrogate.detach() + value  # the gradient of the global loss; its value for the log
        return (loss, vectors) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation: the loss over the eval batch alone (its queries against its candidates)."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            vectors = self.vectors(model, inputs)
            part = [(vectors, int(inputs["queries"]), inputs["negatives"].tolist(), inputs["hashes"])]
            queries, candidates, positive_index, hashes, _ = global_batch([local_rows(part)])
            loss = self.loss(queries, candidates, positive_index, self.loss.false_negatives(hashes, positive_index))
        return loss.detach(), None, None

    def log(self, logs, *args, **kwargs):
        if "loss" in logs:
            logs = {**logs, "false_negatives": self.false_negatives}
        super().log(logs, *args, **kwargs)


def checkpointing(model) -> bool:
    """Whether the model's layers recompute their activations in the backward (transformers' own test, which its
    5.25 rename of `is_gradient_checkpointing` kept)."""
    return any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules())


def random_state():
    return (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def set_random_state(state) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def local_rows(parts, keep_graph=False):
    """This process's (queries, positives, negatives, their hashes) from its micro-batches (on the CPU, detached,
    unless `keep_graph`)."""
    queries, positives, negatives, hashes = [], [], [], ([], [], [])
    for vectors, count, _, text_hashes in parts:
        if not keep_graph:
            vectors, text_hashes = vectors.detach().cpu(), text_hashes.cpu()
        queries.append(vectors[:count])
        positives.append(vectors[count : 2 * count])
        negatives.append(vectors[2 * count :])
        for kind, span in enumerate((slice(0, count), slice(count, 2 * count), slice(2 * count, None))):
            hashes[kind].append(text_hashes[span])
    return (
        torch.cat(queries),
        torch.cat(positives),
        torch.cat(negatives),
        torch.cat(hashes[1]),
        torch.cat(hashes[2]),
    )


def gather(rows, world: int) -> list:
    if world == 1:
        return [rows]
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, rows)
    return gathered


def global_batch(gathered):
    """(queries, candidates = every process's positives then every process's negatives, each query's positive's
    column, the candidates' hashes, each process's (query, positive, negative) offsets)."""
    queries = torch.cat([r[0] for r in gathered])
    positives = torch.cat([r[1] for r in gathered])
    negatives = torch.cat([r[2] for r in gathered])
    hashes = torch.cat([torch.cat([r[3] for r in gathered]), torch.cat([r[4] for r in gathered])])
    offsets, q, n = [], 0, 0
    for r in gathered:
        offsets.append((q, n))
        q, n = q + len(r[0]), n + len(r[2])
    candidates = torch.cat([positives, negatives])
    offsets = [(q, len(positives) + n) for q, n in offsets]
    return queries, candidates, torch.arange(len(queries), device=queries.device), hashes, offsets


def local_gradients(query_grad, candidate_grad, offset, parts):
    """Per micro-batch, the gradient in its texts' vectors, in its order [queries, positives, negatives]."""
    q, n = offset
    p = q  # a query's positive is the candidate column of its own index
    grads = []
    for _, count, negative_counts, _ in parts:
        negatives = sum(negative_counts)
        grads.append(
            torch.cat([query_grad[q : q + count], candidate_grad[p : p + count], candidate_grad[n : n + negatives]])
        )
        q, p, n = q + count, p + count, n + negatives
    return grads
