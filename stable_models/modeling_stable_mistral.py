"""StableMistralForSequenceClassification with the stable_models contract."""

from transformers import MistralForSequenceClassification

from .modeling_stable import StableSequenceClassificationMixin


class StableMistralForSequenceClassification(StableSequenceClassificationMixin, MistralForSequenceClassification):
    backbone_takes_mask_dict = False  # MistralModel wants one mask tensor (sliding if config.sliding_window)


StableMistralForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
