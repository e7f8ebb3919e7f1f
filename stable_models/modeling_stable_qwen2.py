"""StableQwen2ForSequenceClassification with the stable_models contract."""

from transformers import Qwen2ForSequenceClassification

from .modeling_stable import StableSequenceClassificationMixin


class StableQwen2ForSequenceClassification(StableSequenceClassificationMixin, Qwen2ForSequenceClassification):
    pass


StableQwen2ForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
