"""Labels as a model's targets: class ids (single-label), multi-hot rows (multi-label) or floats (regression)."""


def refuse_unseen(values, label2id, where) -> None:
    unseen = sorted({str(v) for v in values} - set(label2id))
    if unseen:
        raise ValueError(
            f"{where}: labels {unseen[:5]} are not among the model's labels {list(label2id)[:10]} "
            "(every label must occur in the training data)"
        )


def encode_labels(labels, problem_type, label2id, where):
    """Python labels (a list; names or, for multi-label, lists of names) as the model's targets; a label the model
    does not have is a ValueError naming `where` and the label."""
    if problem_type == "regression":
        return [float(v) for v in labels]
    refuse_unseen((v for label in labels for v in (label if isinstance(label, list) else [label])), label2id, where)
    if problem_type == "single_label_classification":
        return [label2id[str(v)] for v in labels]
    return [[1.0 if name in {str(v) for v in label} else 0.0 for name in label2id] for label in labels]
