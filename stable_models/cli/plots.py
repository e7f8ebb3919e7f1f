"""The PNG plots of an evaluation (confusion matrix, reliability diagram, training curves; for a reward model the
reward histograms), drawn with matplotlib when it is installed (the `cli` extra); without it, no plots and a hint.
"""

from pathlib import Path

import torch

from ..metrics import calibration_points, pair_logits

PLOTS_HINT = "pip install 'stable_models[cli]' for the PNG plots (matplotlib)"


def plot_classification(report, problem_type, names, logits, targets, folder: Path, training_log=None) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    if problem_type == "single_label_classification":
        figure, axes = plt.subplots(figsize=(1.2 * len(names) + 3, 1.2 * len(names) + 2))
        matrix = report["confusion_matrix"]
        axes.imshow(matrix, cmap="Blues")
        for i, row in enumerate(matrix):
            for j, count in enumerate(row):
                axes.text(j, i, str(count), ha="center", va="center")
        axes.set(xticks=range(len(names)), yticks=range(len(names)), xticklabels=names, yticklabels=names)
        axes.set(xlabel="predicted", ylabel="true", title="confusion matrix")
        written.append(save_figure(figure, folder / "confusion_matrix.png"))
    if problem_type != "regression":
        written.append(reliability_diagram(plt, logits, targets, problem_type, report["ece"], folder))
    if training_log:
        written.append(training_curves(plt, training_log, folder))
    return written


def plot_rewards(report, chosen, rejected, folder: Path, training_log=None) -> list[str]:
    """A reward model's plots: chosen and rejected reward histograms, the reliability of sigmoid(r_chosen -
    r_rejected), the training curves."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    figure, axes = plt.subplots(figsize=(5.5, 3.8))
    bins = torch.linspace(min(chosen.min(), rejected.min()).item(), max(chosen.max(), rejected.max()).item(), 31)
    axes.hist(chosen.numpy(), bins=bins.numpy(), alpha=0.6, label="chosen")
    axes.hist(rejected.numpy(), bins=bins.numpy(), alpha=0.6, label="rejected")
    axes.set(xlabel="reward", ylabel="responses", title=f"rewards (pairwise accuracy {report['accuracy']:.3f})")
    axes.legend()
    written = [save_figure(figure, folder / "rewards.png")]
    ones = torch.ones(len(chosen))
    written.append(
        reliability_diagram(
            plt, pair_logits(chosen, rejected), ones, "single_label_classification", report["ece"], folder
        )
    )
    if training_log:
        written.append(training_curves(plt, training_log, folder))
    return written


def reliability_diagram(plt, logits, targets, problem_type, ece, folder: Path) -> str:
    confidence, correct = calibration_points(logits, targets, problem_type)
    edges = torch.linspace(0, 1, 11)
    centres, accuracy = [], []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        inside = (confidence >= low) & (confidence <= high)
        if inside.any():
            centres.append(confidence[inside].mean().item())
            accuracy.append(correct[inside].mean().item())
    figure, axes = plt.subplots(figsize=(4.5, 4.5))
    axes.plot([0, 1], [0, 1], "--", color="grey", label="perfectly calibrated")
    axes.plot(centres, accuracy, "o-", label=f"model (ECE {ece:.3f})")
    axes.set(xlabel="confidence", ylabel="accuracy", title="reliability diagram", xlim=(0, 1), ylim=(0, 1))
    axes.legend()
    return save_figure(figure, folder / "reliability.png")


def training_curves(plt, training_log, folder: Path) -> str:
    panels = [("loss", "training loss"), ("grad_norm", "gradient norm"), ("eval_loss", "eval loss")]
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for axis, (key, title) in zip(axes, panels, strict=True):
        points = [(e["step"], e[key]) for e in training_log if key in e and e[key] is not None]
        if points:
            axis.plot(*zip(*points, strict=True), "o-" if len(points) < 30 else "-")
        axis.set(xlabel="step", title=title)
    return save_figure(figure, folder / "training_curves.png")


def save_figure(figure, path: Path) -> str:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return str(path)


def plot_ranking(report, first_stage_ndcg, folder: Path, training_log=None) -> list[str]:
    """A reranker's plots: the per-query NDCG@10 histogram (reranker beside the first stage), the training curves."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    figure, axes = plt.subplots(figsize=(5.5, 3.8))
    bins = [i / 20 for i in range(21)]
    axes.hist(first_stage_ndcg, bins=bins, alpha=0.6, label=f"first stage ({report['first_stage']['ndcg@10']:.3f})")
    axes.hist(report["per_query_ndcg@10"], bins=bins, alpha=0.6, label=f"reranker ({report['ndcg@10']:.3f})")
    axes.set(xlabel="NDCG@10", ylabel="queries", title="NDCG@10 per query")
    axes.legend()
    written = [save_figure(figure, folder / "ndcg_per_query.png")]
    if training_log:
        written.append(training_curves(plt, training_log, folder))
    return written


def plot_training(report, folder: Path, training_log=None) -> list[str]:
    """The training curves alone (an embedder's evaluation has no per-class or per-pair plot)."""
    if not training_log:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    return [training_curves(plt, training_log, folder)]
