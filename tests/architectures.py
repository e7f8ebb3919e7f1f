"""The one table of architectures every test is parametrized over, plus tiny-model and batch helpers.

Adding an architecture to the tests is one row in TABLE (first_class=True also puts it in the full matrix).
"""

from dataclasses import dataclass, field

import torch
import transformers
from transformers.modeling_layers import GenericForSequenceClassification
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

import stable_models
from stable_models.modeling_rules import (
    NOT_YET_TESTED,
    RECURRENT_LAYER_KINDS,
    decoder_classifier,
    recurrent_layer_kinds,
)

PAD, EOS, BOS = 0, 1, 2
VOCAB = 96
DOCS_TRANSFORMERS = "5.25.0"  # the release docs/supported-models.md and the README count for (the newest)
SLIDING_WINDOW = 3  # shorter than the padding in every test batch, so the sliding-window mask paths run


@dataclass(frozen=True)
class Arch:
    name: str  # the model_type; the stock and Stable classes come from transformers' own mapping
    config_kwargs: dict = field(default_factory=dict)  # for the text model (on top of TINY)
    multimodal: dict | None = None  # top-level kwargs of a multimodal config; config_kwargs then go to text_config
    first_class: bool = False  # also in the full dtype x pooling x padding x feature matrix
    shrink: bool = False  # start from SHRUNK (sizes the default config has) before TINY: rows added in bulk

    @property
    def stock_class(self):
        return decoder_classifier(self.name)

    @property
    def origin(self) -> str:
        """Where the class comes from: transformers' GenericForSequenceClassification, an older stock classifier,
        or built by stable_models for a causal LM that has none."""
        if getattr(transformers, self.stock_class.__name__, None) is not self.stock_class:
            return "built by stable_models"
        return "stock Generic" if issubclass(self.stock_class, GenericForSequenceClassification) else "stock legacy"

    @property
    def config_class(self):
        return self.stock_class.config_class

    @property
    def stable_class(self):
        return stable_models.stable_class_for(self.name)

    @property
    def causal_lm_class(self):
        """The generative model whose checkpoint a user turns into a classifier (for multimodal configs: the
        image-text-to-text model)."""
        names = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if self.multimodal is not None else {}
        return getattr(transformers, names.get(self.name) or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[self.name])

    @property
    def has_causal_lm(self) -> bool:
        return self.name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (
            self.multimodal is not None and self.name in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        )

    @property
    def has_sliding_window(self) -> bool:
        """A local attention window shorter than the padding: sliding (Mistral) or chunked (Llama 4)."""
        if "sliding_window" in self.config_kwargs or "attention_chunk_size" in self.config_kwargs:
            return True
        kinds = getattr(make_config(self).get_text_config(), "layer_types", None) or []  # rows sized by SHRUNK
        return any(kind in ("sliding_attention", "chunked_attention") for kind in kinds)

    @property
    def mixes_layer_types(self) -> bool:
        """More than one kind of attention mask (full and sliding window); recurrent layers take no such mask."""
        kinds = getattr(make_config(self).get_text_config(), "layer_types", None) or []
        return len(set(kinds) - set(RECURRENT_LAYER_KINDS)) > 1

    @property
    def attn_implementations(self) -> tuple[str, ...]:
        """The kernels the stock class accepts on CPU (Gemma2 refuses sdpa: it has no logit softcapping)."""
        return ("eager", "sdpa") if self.stock_class._supports_sdpa else ("eager",)

    def __str__(self) -> str:
        return self.name


W = SLIDING_WINDOW
ROPE = {"rope_type": "default", "rope_theta": 10000.0}
# multi-head latent attention (MLA) needs as many key/value heads as query heads
MLA = dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
ROUTED = dict(
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
)
GATED_DELTA = dict(
    head_dim=8,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention"],
)
MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=8)  # Bamba-style hybrids
# a one-block vision tower for the Qwen3.5 multimodal configs (text-only input never runs it)
QWEN3_5_VISION = dict(
    vision_config=dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, deepstack_visual_indexes=[]
    )
)
# MLA with equal query and key/value heads in both the indexed and the sliding layers (their validator's rule)
DOTS3_NOTE = dict(
    num_key_value_heads=4,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=4,
    swa_head_dim=8,
    swa_qk_nope_head_dim=4,
    swa_q_lora_rank=16,
    swa_kv_lora_rank=16,
    swa_v_head_dim=8,
    index_topk=4,  # shorter than the test sequences, so the indexer selects
)
DOTS3_NOTE_TOWERS = dict(
    vision_config=dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        adapter_in_dim=16,
        adapter_out_dim=32,
        pyramid_num_routed=[-1],
    ),
    audio_config=dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        adapter_input_size=16,
        adapter_out_dim=32,
        downsample_hidden_size=8,
        feature_size=16,
        max_position_embeddings=64,
    ),
)
# the sparse indexer over a budget shorter than the test sequences, and one n-gram embedding layer (PLE)
QWEN4_EXP = dict(
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=8,
    indexer_budget=4,
    indexer_compress_ratio=2,
    hc_lowrank=8,
    ple_layer_ids=[1],
    ple_embed_dim=16,
    heads_per_ngram=2,
    ngram_vocab_size_base=97,
    make_ngram_vocab_size_divisible_by=8,
    split_ngram_parts=2,
)
QWEN4_EXP_VISION = dict(
    vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
)
QWEN_WINDOW = dict(use_sliding_window=True, sliding_window=W, max_window_layers=1)
GEMMA = dict(
    head_dim=16, query_pre_attn_scalar=16, sliding_window=W, layer_types=["sliding_attention", "full_attention"]
)

# Every model type whose stock classifier is built on GenericForSequenceClassification (transformers 5.25: 49).
# Tiny configs: hidden 32, 2 layers, every sliding window shorter than the padding of the test batches.
TABLE = [
    Arch("arcee"),
    Arch("axk1", {**MLA, **ROUTED}),
    Arch("axk2", {**MLA, **ROUTED}),
    Arch(
        "cohere_compass_text",
        dict(
            sliding_window=W,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"full_attention": ROPE, "sliding_attention": ROPE},
        ),
    ),
    Arch("deepseek_v2", {**MLA, **ROUTED}),
    Arch("deepseek_v3", {**MLA, **ROUTED}),
    Arch("diffllama"),
    Arch("doge", dict(sliding_window=W)),  # dense; the MoE variant couples the rows of a batch (test_architectures)
    Arch("exaone4", dict(sliding_window=W, layer_types=["sliding_attention", "full_attention"])),
    Arch("gemma", dict(head_dim=16), first_class=True),
    Arch("gemma2", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=W), first_class=True),
    Arch(
        "gemma3",
        GEMMA,
        first_class=True,
        multimodal=dict(
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
            ),
            mm_tokens_per_image=1,
        ),
    ),
    Arch("gemma3_text", GEMMA, first_class=True),
    Arch("glm"),
    Arch("glm4"),
    Arch("gpt_oss", dict(sliding_window=W, num_local_experts=4, num_experts_per_tok=2, head_dim=8)),
    Arch("gptj", dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=64)),
    Arch("helium", dict(head_dim=8)),
    Arch("hunyuan_v1_dense", dict(rope_parameters=ROPE, head_dim=8)),
    Arch("hunyuan_v1_moe", dict(rope_parameters=ROPE, head_dim=8, num_experts=4, moe_topk=2)),
    Arch(
        "jamba",
        dict(
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=4,
            use_mamba_kernels=False,
            mamba_d_state=4,
        ),
    ),
    Arch("jetmoe", dict(num_local_experts=4, num_experts_per_tok=2)),
    Arch("llama", first_class=True),
    Arch("minicpm3", MLA),
    Arch(
        "minimax",
        dict(
            sliding_window=W,
            layer_types=["linear_attention", "full_attention"],
            num_local_experts=4,
            num_experts_per_tok=2,
            head_dim=8,
        ),
    ),
    Arch("ministral", dict(rope_parameters=ROPE, sliding_window=W, head_dim=8)),
    Arch("ministral3", dict(sliding_window=W)),
    Arch("mistral", dict(sliding_window=W), first_class=True),
    Arch("mistral4", {**MLA, **ROUTED, "head_dim": 16}),
    Arch("mixtral", dict(sliding_window=W, num_local_experts=4, num_experts_per_tok=2), first_class=True),
    Arch("nemotron"),
    Arch("olmo"),
    Arch("olmo2"),
    Arch("olmo3", dict(sliding_window=W)),
    Arch("persimmon"),
    Arch("phi"),
    Arch("phi3", dict(sliding_window=W), first_class=True),
    Arch("phimoe", dict(sliding_window=W, num_local_experts=4, num_experts_per_tok=2)),
    Arch("qwen2", QWEN_WINDOW, first_class=True),
    Arch(
        "qwen2_moe",
        dict(
            QWEN_WINDOW,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
        ),
    ),
    Arch("qwen3", QWEN_WINDOW, first_class=True),
    Arch(
        "qwen3_5",
        GATED_DELTA,
        first_class=True,
        multimodal=QWEN3_5_VISION,
    ),
    Arch("qwen3_5_text", GATED_DELTA),
    Arch(
        "qwen3_moe",
        dict(use_sliding_window=True, sliding_window=W, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
        first_class=True,
    ),
    Arch(
        "qwen3_next",
        dict(
            GATED_DELTA,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
        ),
    ),
    Arch("seed_oss"),
    Arch(
        "smollm3", dict(use_sliding_window=True, sliding_window=W, layer_types=["sliding_attention", "full_attention"])
    ),
    Arch("stablelm"),
    Arch("starcoder2", dict(sliding_window=W)),
    # Older decoder classifiers (not GenericForSequenceClassification; they pool the last non-pad token too)
    Arch("biogpt"),
    Arch("bloom", dict(n_layer=2, n_head=4)),
    Arch("falcon", dict(num_kv_heads=2, new_decoder_architecture=True)),
    Arch(
        "gpt2",
        dict(n_embd=32, n_layer=2, n_head=4, n_inner=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
        first_class=True,
    ),
    Arch("gpt_bigcode", dict(n_embd=32, n_layer=2, n_head=4, n_inner=64)),
    Arch("gpt_neo", dict(num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=W)),
    Arch("gpt_neox", dict(rotary_pct=0.5), first_class=True),
    Arch("mpt", dict(d_model=32, n_layers=2, n_heads=4, expansion_ratio=2)),
    Arch("opt", dict(ffn_dim=64, word_embed_proj_dim=32)),
    # Causal LMs without a stock classifier: stable_models builds the class transformers would write. Sizes from
    # SHRUNK where the config has them (shrink=True), plus what the row says.
    Arch("afmoe", shrink=True),
    Arch("apertus", shrink=True),
    Arch("apertus1p5_text", shrink=True),
    Arch("aria_text", shrink=True),
    Arch(
        "bailing_hybrid",
        dict(
            num_key_value_heads=4,
            num_experts_per_token=2,
            num_expert_group=1,
            topk_group=1,
            linear_head_dim=8,
            linear_num_heads=4,
            layer_group_size=2,
        ),
        shrink=True,
    ),
    Arch(
        "bamba",
        {"attn_layer_indices": [1], **MAMBA2},
        shrink=True,
    ),
    Arch("beam", shrink=True),
    Arch("bitnet", shrink=True),
    Arch("codegen", {"rotary_dim": 4, "n_ctx": 64, "n_positions": 64}, shrink=True),
    Arch("cohere", shrink=True),
    Arch("cohere2", shrink=True),
    Arch("cohere2_moe", shrink=True),
    Arch("cwm", shrink=True),
    Arch("deepseek_v32", {"num_key_value_heads": 4}, shrink=True),
    Arch(
        "dbrx",
        dict(
            d_model=32,
            n_heads=4,
            n_layers=2,
            max_seq_len=64,
            attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
            ffn_config=dict(moe_num_experts=4, moe_top_k=2, ffn_hidden_size=64),
        ),
        shrink=True,
    ),
    Arch(  # 1 input, 1 looped, 1 output layer
        "dory",
        dict(
            num_hidden_layers=3,
            n_input_layers=1,
            n_output_layers=1,
            layer_types=["sliding_attention", "full_attention"],
        ),
        shrink=True,
    ),
    Arch("dots1", shrink=True),
    Arch("dots3_note", DOTS3_NOTE, shrink=True, multimodal=DOTS3_NOTE_TOWERS),
    Arch("dots3_note_text", DOTS3_NOTE, shrink=True),
    Arch("ergo", shrink=True),
    Arch("ernie4_5", shrink=True),
    Arch("ernie4_5_moe", shrink=True),
    Arch("exaone", shrink=True),
    Arch("exaone_moe", shrink=True),
    Arch(
        "falcon_h1",
        {"attn_layer_indices": [1], "mamba_d_ssm": 64, **MAMBA2},
        shrink=True,
    ),
    Arch("flex_olmo", shrink=True),
    Arch("flint", shrink=True),
    Arch(
        "gemma3n_text",
        {
            "num_kv_shared_layers": 0,
            "intermediate_size": [64, 64],
            "activation_sparsity_pattern": [0.0, 0.0],
            "laurel_rank": 4,
            "altup_num_inputs": 2,
        },
        shrink=True,
    ),
    Arch("gemma4", shrink=True, multimodal={}),
    Arch("gemma4_text", shrink=True, first_class=True),
    Arch("gemma4_unified", shrink=True, multimodal={}),
    Arch("gemma4_unified_text", shrink=True),
    Arch("glm4_moe", shrink=True),
    Arch("glm4_moe_lite", {"num_key_value_heads": 4}, shrink=True),
    Arch("glm_moe_dsa", {"num_key_value_heads": 4}, shrink=True),
    Arch(
        "got_ocr2",
        shrink=True,
        multimodal=dict(
            vision_config=dict(
                hidden_size=16,
                output_channels=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=32,
                patch_size=16,
                window_size=2,
                global_attn_indexes=[1],
                mlp_dim=32,
            )
        ),
    ),
    Arch("granite", shrink=True, first_class=True),
    Arch("granite_swa", shrink=True),
    Arch("granitemoe", shrink=True),
    Arch("granitemoe_swa", shrink=True),
    Arch(
        "granitemoehybrid",
        {"layer_types": ["linear_attention", "full_attention"], "shared_intermediate_size": 16, **MAMBA2},
        shrink=True,
    ),
    Arch("granitemoeshared", shrink=True),
    Arch("hrm_text", {"num_layers_per_stack": 1, "H_cycles": 1, "L_cycles": 1, "L_bp_cycles": [1]}, shrink=True),
    Arch("hy_v3", shrink=True),
    Arch("hy_v4", shrink=True),
    Arch("hyperclovax", shrink=True),
    Arch("inkling2_loop_text", shrink=True),
    Arch("inkling2_text", shrink=True),
    Arch("inkling_text", shrink=True),
    Arch("internlm3", shrink=True),
    Arch("iquestcoder", shrink=True),
    Arch("jais2", shrink=True),
    Arch(
        "kimi_linear",
        dict(num_key_value_heads=4, num_experts_per_token=2, linear_head_dim=8, linear_num_heads=4),
        shrink=True,
    ),
    Arch("kolibri1", shrink=True),
    Arch(
        "kolibri1_1",
        dict(
            head_dim=16,  # NVFP4 rounding of keys and values needs a multiple of 16
            layer_types=["sliding_attention", "indexed_attention"],
            index_layers=[1],
            kv_source_layers=[0, 1],
            index_num_heads=2,
            index_topk=4,
            index_pool_size=8,
            index_compression=2,
            index_num_local_tokens=2,
            index_num_sink_tokens=1,
            mlp_only_layers=[0],
            mlp_only_intermediate_size=64,
        ),
        shrink=True,
    ),
    Arch("laguna", shrink=True),
    Arch("lara_mini", shrink=True),
    Arch("lfm2", shrink=True),
    Arch("lfm2_moe", {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1}, shrink=True),
    Arch("lfm3", shrink=True),
    Arch("llama4_text", {"attention_chunk_size": W}, shrink=True, first_class=True),  # chunks shorter than the padding
    Arch("longcat_flash", {"num_key_value_heads": 4, "zero_expert_num": 1}, shrink=True),
    Arch("mellum", shrink=True),
    Arch("mimo_v2_flash", shrink=True),
    Arch("minicpm5_moe", shrink=True),
    Arch("minimax_m2", shrink=True),
    Arch("minimax_m3_vl_text", shrink=True),
    Arch(
        "mllama",
        dict(cross_attention_layers=[]),  # text-only input never runs a cross-attention layer
        shrink=True,
        multimodal=dict(
            vision_config=dict(
                hidden_size=16,
                num_hidden_layers=2,
                num_global_layers=1,
                attention_heads=2,
                intermediate_size=32,
                vision_output_dim=32,
                image_size=28,
                patch_size=14,
                intermediate_layers_indices=[0],
            )
        ),
    ),
    Arch("moshi", shrink=True),
    Arch(
        "moss_transcribe_diarize",
        shrink=True,
        multimodal=dict(
            audio_config=dict(
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                hidden_size=16,
                max_source_positions=16,
            )
        ),
    ),
    Arch("nanochat", shrink=True),
    Arch(
        "nemotron_h",
        {
            "layers_block_type": ["linear_attention", "full_attention"],
            "mamba_num_heads": 4,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "chunk_size": 8,
            "n_groups": 1,
        },
        shrink=True,
    ),
    Arch("olmo_hybrid", shrink=True),
    Arch("open-llama", shrink=True),  # transformers 4.57 only (deprecated there, gone in 5.x)
    Arch("olmoe", shrink=True),
    Arch("param2moe", shrink=True),
    Arch(
        "qwen3_5_moe",
        shrink=True,
        multimodal=QWEN3_5_VISION,
    ),
    Arch(
        "phi4_multimodal",
        dict(
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
                crop_size=28,
            ),
            audio_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_blocks=1,
                num_attention_heads=2,
                ext_pw_out_channel=16,
                depthwise_separable_out_channel=16,
                nemo_conv_channels=16,
            ),
        ),
        shrink=True,
    ),
    Arch("qwen3_5_moe_text", shrink=True),
    Arch("qwen4_exp", QWEN4_EXP, shrink=True, multimodal=QWEN4_EXP_VISION),
    Arch("qwen4_exp_text", QWEN4_EXP, shrink=True),
    Arch("sarvam_mla", {"num_key_value_heads": 4}, shrink=True),
    Arch("sarvam_moe", shrink=True),
    Arch("solar_open", shrink=True),
    Arch("vaultgemma", shrink=True),
    Arch("xglm", shrink=True),
    Arch("youtu", {"num_key_value_heads": 4}, shrink=True),
    Arch("zaya", {"num_experts_per_tok": 1}, shrink=True),
]
TABLE_BY_NAME = {arch.name: arch for arch in TABLE}
# Supported by the rule (stable_models builds their class) but without a tiny config that builds and runs here yet:
# not tested; the class warns at construction and the docs list them (model_type -> what stopped the tiny config).
NO_TINY_CONFIG_YET = NOT_YET_TESTED
# The default run's sample: a test parametrized with a row outside it runs with -m exhaustive only (conftest.py).
# Each family, mask kind (full, sliding, chunked, ALiBi, inverted bool), cache kind (attention, Mamba, gated delta,
# short convolution), MoE and MLA, multimodal, each legacy backbone kind, and classes stable_models builds itself.
DEFAULT_SAMPLE = {
    "qwen2",  # sliding window on some layers, the user story's model
    "gemma2",  # softcapping, sliding window, eager only
    "llama",  # plain dense
    "qwen3_moe",  # MoE
    "deepseek_v3",  # MLA + MoE
    "qwen3_next",  # gated delta (linear attention) hybrid
    "jamba",  # Mamba hybrid
    "gemma3",  # multimodal, text-only input
    "qwen3_5",  # multimodal hybrid
    "gpt2",  # legacy: positional mask, Conv1D
    "mpt",  # legacy: ALiBi, True = masked bool masks
    "gpt_neox",  # legacy: partial rotary
    "gemma4_text",  # built: per-layer head dims
    "llama4_text",  # built: chunked attention
    "lfm2",  # built: short convolution cache
    "granite",  # built: multipliers
}
# Tests marked `trains` (Trainer runs, seconds per row) take a smaller sample by default: a Generic class, an eager-only
# one with softcapping, MoE, a legacy class and one stable_models builds.
TRAINING_SAMPLE = {"qwen2", "gemma2", "qwen3_moe", "gpt2", "granite"}
# the installed transformers decides which rows exist (the 4.57 floor has fewer)
ARCHITECTURES = [arch for arch in TABLE if arch.name in stable_models.supported_model_types()]
FIRST_CLASS = [arch for arch in ARCHITECTURES if arch.first_class]
BY_NAME = {arch.name: arch for arch in ARCHITECTURES}
ARCH_ATTN = [(arch, attn) for arch in FIRST_CLASS for attn in arch.attn_implementations]
ARCH_ATTN_IDS = [f"{arch}-{attn}" for arch, attn in ARCH_ATTN]
ALL_ARCH_ATTN = [(arch, attn) for arch in ARCHITECTURES for attn in arch.attn_implementations]
ALL_ARCH_ATTN_IDS = [f"{arch}-{attn}" for arch, attn in ALL_ARCH_ATTN]

# For rows with shrink=True: sizes applied where the config has the attribute (hidden 32, 2 layers come from TINY).
SHRUNK = dict(
    intermediate_size=64,
    head_dim=8,
    max_position_embeddings=64,
    sliding_window=W,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    global_head_dim=16,
    hidden_size_per_layer_input=16,
    vocab_size_per_layer_input=VOCAB,
    unpadded_vocab_size=VOCAB,
    ffn_dim=64,
    ffn_hidden_size=64,
    expert_ffn_hidden_size=16,
    dense_intermediate_size=64,
    first_dense_intermediate_size=64,
    shared_intermediate_size=16,
    router_hidden_size=16,
    index_head_dim=8,
    index_n_heads=2,
    swa_head_dim=8,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    moe_topk=2,
    sliding_window_size=W,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)


def shrunk(config_class) -> dict:
    """SHRUNK's sizes that the config class's text config has, and its layer pattern cut to two layers."""
    default = config_class().get_text_config().to_dict()
    kwargs = {key: value for key, value in SHRUNK.items() if key in default}
    if default.get("layer_types"):
        kinds = list(dict.fromkeys(default["layer_types"]))
        kwargs["layer_types"] = kinds if len(kinds) >= 2 else kinds * 2
    return kwargs


TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=PAD,
    eos_token_id=EOS,
    bos_token_id=BOS,
)


def make_config(arch: Arch, attn: str = "eager", **overrides):
    """A tiny config of the architecture; `overrides` change the text model (num_labels: the classifier)."""
    num_labels = overrides.pop("num_labels", 3)
    kwargs = {**(shrunk(arch.config_class) if arch.shrink else {}), **TINY, **arch.config_kwargs, **overrides}
    if "layer_types" in kwargs:  # repeat the pattern when a test asks for more layers
        pattern = kwargs["layer_types"]
        kwargs["layer_types"] = [pattern[i % len(pattern)] for i in range(kwargs["num_hidden_layers"])]
    if arch.multimodal is None:
        config = arch.config_class(**kwargs, num_labels=num_labels)
    else:
        config = arch.config_class(**arch.multimodal, text_config=kwargs, num_labels=num_labels)
    for part in {id(c): c for c in (config, config.get_text_config())}.values():
        part._attn_implementation = attn
    return config


def make_models(arch: Arch, attn: str = "eager", dtype=torch.float32, pooling="last", seed=0, **overrides):
    """A Stable model and a stock model with identical weights, in eval mode."""
    torch.manual_seed(seed)
    stable = arch.stable_class(make_config(arch, attn, **overrides), pooling=pooling)
    # weights big enough that padding mistakes show up clearly in the logits
    with torch.no_grad():
        for param in stable.parameters():
            if param.dim() > 1:
                param.normal_(0, 0.2)
    stock = arch.stock_class(make_config(arch, attn, **overrides))
    stock.load_state_dict(stable.state_dict())
    return stable.to(dtype).eval(), stock.to(dtype).eval()


def random_sequences(lengths, seed=0, low=3):
    """Token ids that avoid PAD/EOS/BOS unless a test puts them in on purpose."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(low, VOCAB, (n,), generator=generator) for n in lengths]


def pad_batch(sequences, side: str, pad_id: int = PAD):
    """(input_ids, attention_mask) padded to the longest sequence on `side` ("left" or "right")."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, span] = seq
        mask[row, span] = 1
    return ids, mask


def logits_alone(model, sequences, **kwargs):
    """Each sequence run on its own, without padding or mask: the reference for padding invariance."""
    with torch.no_grad():
        return torch.cat([model(seq[None], **kwargs).logits for seq in sequences])


def toy_dataset(lengths, seed):
    """Trainer examples {"input_ids": 1-D tensor, "labels": int}; a list is a valid Trainer dataset."""
    return [{"input_ids": s, "labels": i % 3} for i, s in enumerate(random_sequences(lengths, seed=seed))]


def collate_left(features):
    ids, mask = pad_batch([f["input_ids"] for f in features], "left")
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["labels"] for f in features])}


def cpu_training_args(output_dir, **overrides):
    """TrainingArguments for a short, seeded CPU run that logs every step and saves only when asked."""
    quiet = {"logging_steps": 1, "report_to": [], "use_cpu": True, "seed": 0, "save_strategy": "no"}
    return transformers.TrainingArguments(str(output_dir), **{**quiet, "remove_unused_columns": False, **overrides})


def attention_layer_count(config) -> int:
    """How many layers call an attention kernel (hybrid models also have recurrent / linear-attention layers)."""
    text = config.get_text_config()
    kinds = getattr(text, "layer_types", None) or getattr(text, "layers_block_type", None)
    if not kinds:
        return text.num_hidden_layers
    return sum(kind not in RECURRENT_LAYER_KINDS for kind in kinds)


# attention projections: q/v, Phi-3's fused qkv, Qwen3.5's linear-attention qkv, GPT-2's c_attn, GPT-NeoX's
# query_key_value (peft needs one to match)
LORA_TARGETS = ["q_proj", "v_proj", "qkv_proj", "in_proj_qkv", "c_attn", "query_key_value"]
# unused by text-only input: no gradient (Phi-4-multimodal keeps its image and audio embedders in embed_tokens_extend)
VISION_PARTS = ("vision_tower", "visual", "multi_modal_projector", "vision_model", "embed_tokens_extend")


def is_vision_part(parameter_name: str) -> bool:
    return any(part in parameter_name.split(".") for part in VISION_PARTS)


def has_recurrent_layers(arch: Arch) -> bool:
    return bool(recurrent_layer_kinds(make_config(arch)))
