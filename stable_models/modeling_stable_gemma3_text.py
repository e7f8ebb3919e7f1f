"""StableGemma3TextForSequenceClassification with the stable_models contract."""

from transformers import Gemma3TextForSequenceClassification

from .modeling_stable import StableSequenceClassificationMixin


class StableGemma3TextForSequenceClassification(StableSequenceClassificationMixin, Gemma3TextForSequenceClassification):
    pass


StableGemma3TextForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
