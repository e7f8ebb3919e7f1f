"""TRL compatibility: TRL's `get_reward` through the model's forward, for tools that pool by pad id themselves."""

import torch


def get_reward(model, query_responses, pad_token_id, context_length, attention_mask=None):
    """Drop-in for TRL's `trl.experimental.utils.get_reward`, through the model's forward.

    TRL's version runs the backbone and `model.score` itself and picks the scored token by searching for
    `pad_token_id` after the context: with pad == eos (most chat tokenizers) it scores the token before the eos the
    reward model was trained to read, and a mean-pooled model is scored at one token. Here the Stable forward pools
    by `attention_mask`. Default mask: TRL's rule (tokens != pad_token_id), except that when pad is also eos the first
    pad id after the context, the eos that ends the response, is a real token.

    Returns what TRL's returns: per-token head outputs (batch, length, num_labels), the pooled reward per row
    (batch,) for num_labels=1, and each row's last real index.
    """
    if attention_mask is None:
        attention_mask = query_responses != pad_token_id
        eos = model.config.get_text_config().eos_token_id
        if pad_token_id in (eos if isinstance(eos, (list, tuple)) else [eos]):
            response = attention_mask[:, context_length:]
            ends = (~response).int().argmax(-1)  # first pad after the context (0 when there is none: checked below)
            has_pad = ~response.all(-1)
            rows = torch.arange(len(query_responses), device=query_responses.device)[has_pad]
            attention_mask = attention_mask.clone()
            attention_mask[rows, context_length + ends[has_pad]] = True
    attention_mask = attention_mask.long()
    output = model(input_ids=query_responses, attention_mask=attention_mask, output_hidden_states=True)
    reward_logits = model.score(output.hidden_states[-1])
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    sequence_lengths = (attention_mask * positions).argmax(-1)
    return reward_logits, output.logits.squeeze(-1), sequence_lengths
