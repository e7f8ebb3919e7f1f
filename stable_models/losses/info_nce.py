"""The contrastive loss of an embedding model: each query against every candidate of the batch."""

import torch
import torch.nn.functional as F


class InfoNCELoss:
    """Softmax cross-entropy of each query's similarity to its own positive against every candidate of the batch:
    the other queries' positives (in-batch negatives) and the hard negatives, on similarity / temperature (vectors
    normalised: cosine). Candidates marked in `masked` (false negatives: a text equal to the query's positive) are left
    out. fp32; the mean over the queries."""

    def __init__(self, temperature: float = 0.05):
        self.temperature = temperature

    def __call__(self, queries, candidates, positive_index, masked=None):
        logits = queries.float() @ candidates.float().T / self.temperature
        if masked is not None:
            logits = logits.masked_fill(masked, float("-inf"))
        return F.cross_entropy(logits, positive_index)

    def false_negatives(self, candidate_hashes, positive_index):
        """[queries, candidates]: a candidate whose text equals a query's positive, other than that positive itself."""
        positive_hashes = candidate_hashes[positive_index]
        masked = candidate_hashes[None, :] == positive_hashes[:, None]
        masked[torch.arange(len(positive_index)), positive_index] = False
        return masked
