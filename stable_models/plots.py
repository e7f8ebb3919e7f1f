"""The PNG plots of an evaluation (confusion matrix, reliability diagram, training curves; for a reward model the
reward histograms), drawn with matplotlib when it is installed (the `cli` extra); without it, no plots and a hint.
"""

import json
from pathlib import Path

import torch

from .calibration import calibration_points, pair_logits

PLOTS_HINT = "pip install 'stable_models[cli]' for the PNG plots (matplotlib)"


def plot_report(report, task, names, logits, targets, folder: Path, training_log=None) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    if task == "single_label_classification":
        figure, axes = plt.subplots(figsize=(1.2 * len(names) + 3, 1.2 * len(names) + 2))
        matrix = report["confusion_matrix"]
        axes.imshow(matrix, cmap="Blues")
        for i, row in enumerate(matrix):
            for j, count in enumerate(row):
                axes.text(j, i, str(count), ha="center", va="center")
        axes.set(xticks=range(len(names)), yticks=range(len(names)), xticklabels=names, yticklabels=names)
        axes.set(xlabel="predicted", ylabel="true", title="confusion matrix")
        written.append(save_figure(figure, folder / "confusion_matrix.png"))
    if task != "regression":
        written.append(reliability_diagram(plt, logits, targets, task, report["ece"], folder))
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


def reliability_diagram(plt, logits, targets, task, ece, folder: Path) -> str:
    confidence, correct = calibration_points(logits, targets, task)
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


def write_report(args, report, draw, render, temperature="temperature") -> None:
    """The end of `evaluate`: the plots (`draw(report_dir, training_log)`), report.json, the printed report and what
    --calibrate folded into the model."""
    report_dir = Path(args.report_dir or Path(args.model) / "evaluation")
    report_dir.mkdir(parents=True, exist_ok=True)
    log = Path(args.model) / "training_log.json"
    report["plots"] = draw(report_dir, json.loads(log.read_text()) if log.is_file() else None)
    (report_dir / "report.json").write_text(json.dumps(report, indent=1))
    print(render(report))
    if "calibration" in report:
        c = report["calibration"]
        print(
            f"calibrated: {temperature} {c['temperature']:.3f} folded into {args.model} (NLL {c['nll_before']:.4f} -> "
            f"{c['nll_after']:.4f}, ECE {c['ece_before']:.4f} -> {c['ece_after']:.4f})"
        )
    print(f"report: {report_dir / 'report.json'}" + ("" if report["plots"] else f" (no plots: {PLOTS_HINT})"))


def save_figure(figure, path: Path) -> str:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return str(path)
