"""StableQwen3ForSequenceClassification with the stable_models contract."""

from transformers import Qwen3ForSequenceClassification

from .modeling_stable import StableSequenceClassificationMixin


class StableQwen3ForSequenceClassification(StableSequenceClassificationMixin, Qwen3ForSequenceClassification):
    pass


StableQwen3ForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
