import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)  # -n auto: a worker per core


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    """A case of a row outside architectures.DEFAULT_SAMPLE belongs to -m exhaustive: one rule for every test that
    is parametrized over the table, so the default run takes the sample and -m exhaustive the rest. Tests marked
    `trains` take the smaller architectures.TRAINING_SAMPLE."""
    from architectures import DEFAULT_SAMPLE, TRAINING_SAMPLE, Arch

    for item in items:
        values = list(getattr(getattr(item, "callspec", None), "params", {}).values())
        values += [v for value in values if isinstance(value, tuple) for v in value]
        sample = TRAINING_SAMPLE if item.get_closest_marker("trains") else DEFAULT_SAMPLE
        if any(isinstance(v, Arch) and v.name not in sample for v in values):
            item.add_marker(pytest.mark.exhaustive)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _auto_mapping_restored():
    """Loading a folder with trust_remote_code=True registers its remote class in AutoModelForSequenceClassification
    for the config class, process-wide (transformers' own behaviour). Undo that after each test, so that what a plain
    AutoModel load gives does not depend on which tests ran before on the same worker."""
    from transformers import AutoModelForSequenceClassification

    extra = AutoModelForSequenceClassification._model_mapping._extra_content
    before = dict(extra)
    yield
    extra.clear()
    extra.update(before)
