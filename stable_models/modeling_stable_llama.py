"""StableLlamaForSequenceClassification with the stable_models contract."""

from transformers import LlamaForSequenceClassification

from .modeling_stable import StableSequenceClassificationMixin


class StableLlamaForSequenceClassification(StableSequenceClassificationMixin, LlamaForSequenceClassification):
    backbone_takes_mask_dict = False  # LlamaModel wants one mask tensor


StableLlamaForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
