"""train's checks of the model before step 1: the model kind's numerics (the doctor's for classifiers), stopping with
the doctor's advice, and whether DDP must look for unused parameters every step.
"""

import sys


def preflight(kind, model, tokenizer, candidates, folder) -> list[str]:
    """The model kind's numerics check (`ModelKind.preflight`, the doctor's for classifiers) at the cost of about one
    training step, on the model as it will train (LoRA attached). Stops with the doctor's advice when a check fails;
    leaves the weights and gradients as they were. Returns the trainable parameters that got no gradient (DDP must
    then look for unused parameters)."""
    found = kind.preflight(model, tokenizer, candidates)
    if found.problems:
        raise SystemExit(
            f"stable-models: the pre-flight check failed: {next(iter(found.problems.values()))}. `python -m "
            f"stable_models doctor --model {folder}` gives the full report."
        )
    print(
        f"[train] pre-flight ok: finite, padding changes {kind.scores_noun} by {found.padding_error:.1e}",
        file=sys.stderr,
    )
    return found.unused


def find_unused_parameters(model, unused: list[str], job) -> bool:
    """DDP's find_unused_parameters (an extra walk of the autograd graph every step) only where a model needs it:
    a trainable parameter got no gradient in the pre-flight, or the model routes tokens to experts (a batch may
    leave one unused)."""
    config = model.config.get_text_config()
    experts = max(value if isinstance(value := getattr(config, key, None), int) else 0 for key in EXPERT_COUNTS)
    if job.world > 1 and (unused or experts > 1):
        reason = f"{len(unused)} trainable tensor(s) got no gradient" if unused else f"{experts} routed experts"
        job.say(f"[train] DDP looks for unused parameters every step: {reason}", file=sys.stderr)
    return bool(unused) or experts > 1


EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")  # config names in use
