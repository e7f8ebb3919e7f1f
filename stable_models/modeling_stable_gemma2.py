"""StableGemma2ForSequenceClassification with the stable_models contract."""

from transformers import Gemma2ForSequenceClassification

from .modeling_stable import StableSequenceClassificationMixin


class StableGemma2ForSequenceClassification(StableSequenceClassificationMixin, Gemma2ForSequenceClassification):
    pass


StableGemma2ForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
