"""Beyond the zoo: every architecture of a transformers task family, built from one tiny
config, through the zoo's runner.

    python -m tests.zoo.sweep [--family causal-lm] [--only llama,qwen2] [--max-params 20e6] [--shard i/n]
                              [runner options]

The zoo (models.py) holds hand-written configs for a few models; users compile the rest.
This builds each `model_type` of a transformers auto mapping (--family: causal-lm,
masked-lm, seq2seq-lm, image-classification, audio-classification, semantic-segmentation)
from its config class with the same small sizes set through the standard names
(hidden_size, num_hidden_layers, image_size, ...: a config's attribute_map turns them into
its own; a name a config rejects is left at its default), drops models that do not build
that way or stay over --max-params, and runs the others exactly as the zoo runs its own
entries (`python -m tests.zoo --help` lists the runner's options: --backend, --mode,
--compare, --json, ...).
Entries are named `hf:<model_type>` (causal LMs), `hf-mlm:`, `hf-s2s:`, `hf-img:`,
`hf-audio:` and `hf-seg:<model_type>`.
"""

from __future__ import annotations

import argparse
import sys

import torch

from . import models, runner

# Standard names (PretrainedConfig.attribute_map maps them to each config's own) and the
# usual extras; a config ignores a keyword it does not use.
TINY = dict(
    vocab_size=models.VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, intermediate_size=128, max_position_embeddings=128, n_positions=128,
    # mixtures of experts
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
    # latent attention (DeepSeek), linear attention and state-space layers
    kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    state_size=8, conv_kernel=4, expand=2, rotary_dim=8,
    # deterministic training steps: no dropout anywhere
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attention_dropout=0.0, hidden_dropout=0.0,
    dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_dropout=0.0,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False,
)

# and for vision models: patches of a 32-pixel image; then, for models built in stages
# (ConvNeXt, Swin, ...), two small stages, or where a config takes those names otherwise
# (ViT's embed_dim is its hidden size), the standard names alone
TINY_IMAGE = dict(TINY, image_size=models.IMAGE, patch_size=8, num_channels=3, num_labels=5, encoder_stride=8)
TINY_VISION = [dict(TINY_IMAGE, depths=[1, 1], hidden_sizes=[16, 32], embed_dim=16, num_heads=[2, 2],
                    embed_dims=[16, 32], dims=[16, 32], window_size=4, mlp_ratio=2.0), TINY_IMAGE]


# and for encoder-decoder models the decoder's sizes too (a config maps the standard names
# to its encoder's: Bart's num_hidden_layers is encoder_layers), and the token a decoder
# starts from (labels shifted right)
TINY_SEQ2SEQ = dict(TINY, encoder_layers=2, decoder_layers=2, num_decoder_layers=2, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, d_ff=128, d_kv=16,
                    decoder_start_token_id=0)


# and for audio: a small convolutional feature encoder (wav2vec2 and its kin), a short mel
# spectrogram (Whisper, AST), SpecAugment's random masks off (numpy draws them in training)
TINY_AUDIO = dict(TINY, conv_dim=[32, 32], conv_kernel=[10, 3], conv_stride=[5, 2],
                  num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, num_feat_extract_layers=2,
                  mask_time_prob=0.0, mask_feature_prob=0.0, num_mel_bins=16, max_source_positions=32,
                  max_length=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                  classifier_proj_size=32, tdnn_dim=[32, 32], tdnn_kernel=[3, 1], tdnn_dilation=[1, 1],
                  xvector_output_dim=32, frequency_stride=4, time_stride=4)


def _config(cls, candidates: list):
    """cls(**sizes) for the first of the candidate size sets it takes, leaving at its
    default each size the config's validation rejects by name (a list where it takes one
    number, a float where it takes an int)."""
    for sizes in candidates:
        # a size some configs derive (a read-only property there) is left to them
        sizes = {k: v for k, v in sizes.items() if not isinstance(getattr(cls, k, None), property)}
        for _ in range(8):
            try:
                return cls(**sizes)
            except Exception as exc:  # noqa: BLE001
                error = exc
                first = str(exc).splitlines()[0] if str(exc) else ""
                rejected = [k for k in sizes if f"'{k}'" in first]
                if not rejected:
                    break
                sizes = {k: v for k, v in sizes.items() if k not in rejected}
    raise error


def _builder(model_type: str, class_name: str, tiny: list = (TINY,)):
    def build():
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        cls = CONFIG_MAPPING[model_type]
        config = _config(cls, tiny)
        if getattr(cls, "kv_lora_rank", None):   # latent attention (MLA) expands the KV to every head
            config.num_key_value_heads = config.num_attention_heads
        for k, v in config.to_dict().items():   # every dropout, drop path and router jitter off, whatever its name
            if ("drop" in k or "jitter" in k) and isinstance(v, float) and v > 0:
                setattr(config, k, 0.0)
        return getattr(transformers, class_name)(config)
    return build


def _lm_inputs(model, gen):
    vocab = getattr(model.config, "vocab_size", models.VOCAB) or models.VOCAB
    ids = torch.randint(3, min(vocab, models.VOCAB), (models.BATCH, models.SEQ), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _mlm_inputs(model, gen):
    inputs = _lm_inputs(model, gen)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[:, ::4] = inputs["input_ids"][:, ::4]     # predict every fourth token
    return {**inputs, "labels": labels}


def _audio_cls_inputs(model, gen):
    """A waveform, or the features the model reads (a mel spectrogram, Wav2Vec2-BERT's
    frames) at the length its config takes, and class labels."""
    c, b = model.config, models.BATCH

    def declares(name):     # the config class's own field (an instance keeps every keyword given)
        return hasattr(type(c), name)

    if model.main_input_name == "input_features":
        if declares("feature_projection_input_dim"):   # Wav2Vec2-BERT: frames of stacked features
            shape = (b, 16, c.feature_projection_input_dim)
        else:                                          # Whisper: exactly two frames a position
            shape = (b, c.num_mel_bins, 2 * c.max_source_positions)
    elif declares("num_mel_bins"):                     # AST: max_length frames of num_mel_bins
        shape = (b, c.max_length, c.num_mel_bins)
    else:                                              # a waveform
        shape = (b, 800)
    labels = torch.randint(0, c.num_labels, (b,), generator=gen)
    return {model.main_input_name: torch.randn(*shape, generator=gen), "labels": labels}


def _segmentation_inputs(model, gen):
    """The zoo's images and a class for every pixel."""
    inputs = models.image_cls_inputs(model, gen)
    size = inputs["pixel_values"].shape[-2:]
    return {**inputs, "labels": torch.randint(0, model.config.num_labels, (models.BATCH, *size), generator=gen)}


def _family(name: str):
    """(auto mapping of model types to class names, entry prefix, candidate tiny sizes, inputs)."""
    from transformers.models.auto import modeling_auto as auto

    return {"causal-lm": (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "hf", [TINY], _lm_inputs),
            "masked-lm": (auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, "hf-mlm", [TINY], _mlm_inputs),
            "seq2seq-lm": (auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "hf-s2s", [TINY_SEQ2SEQ], _lm_inputs),
            "image-classification": (auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES, "hf-img", TINY_VISION,
                                     models.image_cls_inputs),
            "audio-classification": (auto.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES, "hf-audio", [TINY_AUDIO],
                                     _audio_cls_inputs),
            "semantic-segmentation": (auto.MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES, "hf-seg", TINY_VISION,
                                      _segmentation_inputs)}[name]


FAMILIES = ("causal-lm", "masked-lm", "seq2seq-lm", "image-classification", "audio-classification",
            "semantic-segmentation")


def family_entries(only=(), max_params: float = 20e6, out=sys.stderr, family: str = "causal-lm") -> list[str]:
    """Register an entry per buildable architecture of `family`; the names registered."""
    import transformers

    mapping, prefix, tiny, inputs = _family(family)
    transformers.logging.set_verbosity_error()
    names = []
    for model_type, class_name in sorted(mapping.items()):
        if only and model_type not in only:
            continue
        class_name = class_name[0] if isinstance(class_name, tuple) else class_name
        name = f"{prefix}:{model_type}"
        build = _builder(model_type, class_name, tiny)
        try:
            with torch.device("meta"):   # sized without allocating (a default may be huge)
                n = sum(p.numel() for p in build().parameters())
        except Exception as exc:  # a config that needs more than the standard names
            print(f"sweep: {name} ({class_name}) skipped: does not build from the tiny config: "
                  f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}", file=out)
            continue
        if n > max_params:
            print(f"sweep: {name} ({class_name}) skipped: {n / 1e6:.1f}M parameters", file=out)
            continue
        entry = models.Entry(name, build, inputs)
        models.ENTRIES.append(entry)
        models.ZOO[name] = entry
        names.append(name)
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.zoo.sweep", description=__doc__.split("\n\n")[0],
                                 epilog="Every other option goes to the zoo's runner (python -m tests.zoo --help).")
    ap.add_argument("--family", default="causal-lm", choices=FAMILIES, help="which auto mapping (default causal-lm)")
    ap.add_argument("--only", default="", help="comma-separated model types (default: all)")
    ap.add_argument("--max-params", type=float, default=20e6, help="skip larger models (default 20e6)")
    ap.add_argument("--shard", default="0/1", help="i/n: every n-th architecture from the i-th, to run n processes")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    k, n = map(int, args.shard.split("/"))
    names = family_entries(only, args.max_params, family=args.family)[k::n]
    print(f"sweep: {len(names)} architectures built", file=sys.stderr)
    if "--models" not in rest:
        rest += ["--models", ",".join(names)]
    return runner.main(rest)


if __name__ == "__main__":
    sys.exit(main())
