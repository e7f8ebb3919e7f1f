"""StableGemmaForSequenceClassification with the stable_models contract."""

from transformers import GemmaForSequenceClassification

from .modeling_stable import StableSequenceClassificationMixin


class StableGemmaForSequenceClassification(StableSequenceClassificationMixin, GemmaForSequenceClassification):
    backbone_takes_mask_dict = False  # GemmaModel wants one mask tensor


StableGemmaForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
