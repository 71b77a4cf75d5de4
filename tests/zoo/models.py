"""The zoo's registry: transformers models built from tiny configs with random init.

Nothing is downloaded. Each entry is data: a name, a function that builds the model from
a config, a function that makes its example inputs (keyword arguments), and how to get a
scalar loss from its output for training. `build(name, mode)` seeds torch, builds the
model and its inputs, and puts the model in eval() ("infer") or train() ("train") mode;
every config sets its dropout probabilities to 0 so that train mode is deterministic.

Adding a model is a few lines: a builder and an `Entry(...)` in `ENTRIES`.

Two kinds of entry:
  forward   the model is called as `model(**inputs)`; the compiled thing is the module.
  generate  `model.generate(**inputs)`; the compiled thing is the model's forward
            (`model.forward = torch.compile(model.forward)`, what torch.compile users
            do), and the result to compare is the token ids. Inference only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

SEED = 0
BATCH = 2
SEQ = 16
VOCAB = 1000
IMAGE = 32      # pixels a side for the vision models

# A small transformer everywhere the config allows: 2 layers, hidden 32, 2-4 heads.
HIDDEN = 32
FFN = 64


def _tf():
    import transformers

    return transformers


def _config(cls_name: str, **kwargs):
    # The attention implementation is left at transformers' default (sdpa where the
    # model supports it): what users get.
    return getattr(_tf(), cls_name)(**kwargs)


# ---------------------------------------------------------------------------- inputs

def _ids(gen: torch.Generator, batch: int = BATCH, seq: int = SEQ, low: int = 3, high: int = VOCAB) -> torch.Tensor:
    # ids from 3 up: 0-2 are the special tokens (pad/bos/eos) of every config below
    return torch.randint(low, high, (batch, seq), generator=gen)


def _pixels(gen: torch.Generator, channels: int = 3, size: int = IMAGE) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=gen)


def lm_inputs(model, gen):
    ids = _ids(gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def mlm_inputs(model, gen):
    ids = _ids(gen)
    labels = torch.full_like(ids, -100)
    labels[:, ::4] = ids[:, ::4]            # predict every fourth token
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def seq2seq_inputs(model, gen):
    # labels given: the model shifts them right into decoder_input_ids itself
    ids = _ids(gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": _ids(gen, seq=SEQ // 2)}


def seq_cls_inputs(model, gen):
    ids = _ids(gen)
    labels = torch.randint(0, model.config.num_labels, (BATCH,), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def image_cls_inputs(model, gen):
    labels = torch.randint(0, model.config.num_labels, (BATCH,), generator=gen)
    return {"pixel_values": _pixels(gen, model.config.num_channels), "labels": labels}


def whisper_inputs(model, gen):
    # the encoder's two convolutions (the second one strided) turn the mel frames into
    # max_source_positions positions: the input must be exactly 2 * max_source_positions long
    c = model.config
    feats = torch.randn(BATCH, c.num_mel_bins, 2 * c.max_source_positions, generator=gen)
    return {"input_features": feats, "labels": _ids(gen, seq=SEQ // 2)}


def clip_inputs(model, gen):
    ids = _ids(gen, seq=SEQ)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": _pixels(gen, model.config.vision_config.num_channels), "return_loss": True}


def generate_inputs(model, gen):
    ids = _ids(gen, seq=8)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": 8, "do_sample": False,
            "pad_token_id": model.config.eos_token_id}


# ---------------------------------------------------------------------------- models

def gpt2():
    c = _config("GPT2Config", vocab_size=VOCAB, n_positions=128, n_embd=HIDDEN, n_layer=2, n_head=2, n_inner=FFN,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                bos_token_id=1, eos_token_id=2)
    return _tf().GPT2LMHeadModel(c)


def bert():
    c = _config("BertConfig", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=FFN, max_position_embeddings=128, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
    return _tf().BertForMaskedLM(c)


def llama():
    c = _config("LlamaConfig", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.0,
                bos_token_id=1, eos_token_id=2)
    return _tf().LlamaForCausalLM(c)


def t5():
    c = _config("T5Config", vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=FFN, num_layers=2, num_decoder_layers=2,
                num_heads=4, dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return _tf().T5ForConditionalGeneration(c)


def bart():
    c = _config("BartConfig", vocab_size=VOCAB, max_position_embeddings=128, d_model=HIDDEN, encoder_layers=2,
                decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=FFN,
                decoder_ffn_dim=FFN, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                classifier_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                forced_eos_token_id=2)
    return _tf().BartForConditionalGeneration(c)


def distilbert():
    c = _config("DistilBertConfig", vocab_size=VOCAB, max_position_embeddings=128, n_layers=2, n_heads=2, dim=HIDDEN,
                hidden_dim=FFN, dropout=0.0, attention_dropout=0.0, qa_dropout=0.0, seq_classif_dropout=0.0,
                num_labels=3)
    return _tf().DistilBertForSequenceClassification(c)


def vit():
    c = _config("ViTConfig", hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2, intermediate_size=FFN,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, image_size=IMAGE, patch_size=8,
                encoder_stride=8, num_labels=10)
    return _tf().ViTForImageClassification(c)


def whisper():
    c = _config("WhisperConfig", vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                d_model=HIDDEN, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                max_source_positions=32, max_target_positions=64, pad_token_id=0, bos_token_id=1,
                eos_token_id=2, decoder_start_token_id=1, begin_suppress_tokens=None, suppress_tokens=None)
    return _tf().WhisperForConditionalGeneration(c)


def gpt_neox():
    c = _config("GPTNeoXConfig", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=FFN, max_position_embeddings=128, attention_dropout=0.0, hidden_dropout=0.0,
                classifier_dropout=0.0, bos_token_id=1, eos_token_id=2)
    return _tf().GPTNeoXForCausalLM(c)


def opt():
    c = _config("OPTConfig", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, ffn_dim=FFN,
                max_position_embeddings=128, word_embed_proj_dim=HIDDEN, num_attention_heads=2, dropout=0.0,
                attention_dropout=0.0, layerdrop=0.0, pad_token_id=1, bos_token_id=2, eos_token_id=2)
    return _tf().OPTForCausalLM(c)


def mamba():
    # a state-space model: its selective scan is torch's associative_scan under compile
    c = _config("MambaConfig", vocab_size=VOCAB, hidden_size=HIDDEN, state_size=4, num_hidden_layers=2,
                intermediate_size=FFN, use_cache=False)
    return _tf().MambaForCausalLM(c)


def resnet():
    c = _config("ResNetConfig", num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                layer_type="basic", num_labels=10)
    return _tf().ResNetForImageClassification(c)


def clip():
    tf = _tf()
    text = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=SEQ, attention_dropout=0.0, projection_dim=HIDDEN,
                pad_token_id=1, bos_token_id=0, eos_token_id=2)   # eos 2: pool at argmax(input_ids), the legacy rule
    vision = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2, num_attention_heads=2,
                  image_size=IMAGE, patch_size=8, attention_dropout=0.0, projection_dim=HIDDEN)
    c = tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=HIDDEN)
    return tf.CLIPModel(c)


# ---------------------------------------------------------------------------- other libraries
# Models users build with libraries besides transformers (`pip install -e '.[libs]'`; an
# entry runs where its library imports): LoRA adapters (peft), a diffusion UNet and a VAE
# (diffusers), and einops' rearrange/reduce/repeat.

def peft_lora_llama():
    import peft
    model = llama()
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(model, config)
    with torch.no_grad():       # lora_B starts at 0: give it values, so that the adapters change the output
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    return model


def diffusers_unet():
    from diffusers import UNet2DConditionModel
    return UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(HIDDEN, 2 * HIDDEN),
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=HIDDEN,
                                attention_head_dim=8, norm_num_groups=8)


def unet_inputs(model, gen):
    return {"sample": torch.randn(BATCH, 4, 16, 16, generator=gen),
            "timestep": torch.randint(0, 1000, (BATCH,), generator=gen),
            "encoder_hidden_states": torch.randn(BATCH, 7, HIDDEN, generator=gen)}


def diffusers_vae():
    from diffusers import AutoencoderKL
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, HIDDEN), latent_channels=4,
                         norm_num_groups=8, sample_size=16)


def vae_inputs(model, gen):
    return {"sample": torch.randn(BATCH, 3, 16, 16, generator=gen)}   # decoded from the posterior's mode


def einops_vit():
    from einops import rearrange, reduce, repeat
    from einops.layers.torch import Rearrange

    class PatchAttention(torch.nn.Module):
        """A one-block ViT written with einops, as its README writes attention."""

        def __init__(self, dim=HIDDEN, heads=4, patch=4, classes=10):
            super().__init__()
            self.heads = heads
            self.patches = torch.nn.Sequential(Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch, p2=patch),
                                               torch.nn.Linear(3 * patch * patch, dim))
            self.cls = torch.nn.Parameter(torch.randn(1, 1, dim))
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.head = torch.nn.Linear(dim, classes)

        def forward(self, pixel_values, labels):
            h = self.patches(pixel_values)
            h = torch.cat([repeat(self.cls, "1 n d -> b n d", b=h.shape[0]), h], 1)
            q, k, v = rearrange(self.qkv(h), "b n (three heads d) -> three b heads n d", three=3, heads=self.heads)
            attn = (torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5).softmax(-1)
            h = h + rearrange(attn @ v, "b heads n d -> b n (heads d)")
            logits = self.head(reduce(h, "b n d -> b d", "mean"))
            return {"logits": logits, "loss": torch.nn.functional.cross_entropy(logits, labels)}

    return PatchAttention()


def einops_inputs(model, gen):
    return {"pixel_values": _pixels(gen), "labels": torch.randint(0, 10, (BATCH,), generator=gen)}


# ---------------------------------------------------------------------------- registry

def output_loss(out) -> torch.Tensor:
    """`out.loss` where the model computed one (inputs carry labels), else the sum of the
    first floating-point tensor of the output."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is not None:
        return loss
    values = out.values() if isinstance(out, dict) else (out if isinstance(out, (tuple, list)) else [out])
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.sum()
    raise TypeError(f"no loss in a {type(out).__name__}")


def mean_square(out) -> torch.Tensor:
    """A diffusion model's loss against a zero target (noise prediction, reconstruction):
    the mean, where a sum's gradients reach 1e3 and float32 rounding alone passes 1e-4."""
    return out.sample.pow(2).mean()


def torchvision_model(name: str):
    """A torchvision model at its real size, random init (weights=None): GPU machines only
    (PyPI's torchvision does not import beside the CPU build of torch)."""
    def build():
        import torchvision
        return getattr(torchvision.models, name)(weights=None)
    return build


def torchvision_inputs(model, gen):
    return {"x": torch.randn(BATCH, 3, 224, 224, generator=gen)}


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.nn.Module, torch.Generator], dict]
    kind: str = "forward"                     # "forward" or "generate"
    loss: Callable[[Any], torch.Tensor] = output_loss
    modes: tuple = ("infer", "train")
    small: bool = False                       # in the quick inductor sample (tests/test_zoo.py)
    needs: str = "transformers"               # the library that builds it

    def supports(self, mode: str) -> bool:
        return mode in self.modes


ENTRIES: list[Entry] = [
    Entry("GPT2LMHeadModel", gpt2, lm_inputs, small=True),
    Entry("BertForMaskedLM", bert, mlm_inputs, small=True),
    Entry("LlamaForCausalLM", llama, lm_inputs, small=True),
    Entry("T5ForConditionalGeneration", t5, seq2seq_inputs),
    Entry("BartForConditionalGeneration", bart, seq2seq_inputs),
    Entry("DistilBertForSequenceClassification", distilbert, seq_cls_inputs),
    Entry("ViTForImageClassification", vit, image_cls_inputs),
    Entry("WhisperForConditionalGeneration", whisper, whisper_inputs),
    Entry("GPTNeoXForCausalLM", gpt_neox, lm_inputs),
    Entry("OPTForCausalLM", opt, lm_inputs),
    Entry("ResNetForImageClassification", resnet, image_cls_inputs),
    Entry("CLIPModel", clip, clip_inputs),
    Entry("MambaForCausalLM", mamba, lm_inputs),
    Entry("GPT2LMHeadModel.generate", gpt2, generate_inputs, kind="generate", modes=("infer",)),
    Entry("LlamaForCausalLM.generate", llama, generate_inputs, kind="generate", modes=("infer",)),
    Entry("peft.LoraLlama", peft_lora_llama, lm_inputs, needs="peft"),
    Entry("diffusers.UNet2DConditionModel", diffusers_unet, unet_inputs, loss=mean_square, needs="diffusers"),
    Entry("diffusers.AutoencoderKL", diffusers_vae, vae_inputs, loss=mean_square, needs="diffusers"),
    Entry("einops.ViT", einops_vit, einops_inputs, needs="einops"),
    Entry("torchvision.resnet50", torchvision_model("resnet50"), torchvision_inputs, needs="torchvision"),
    Entry("torchvision.vit_b_16", torchvision_model("vit_b_16"), torchvision_inputs, needs="torchvision"),
]

ZOO: dict[str, Entry] = {e.name: e for e in ENTRIES}


def names(mode: Optional[str] = None) -> list[str]:
    """The entries whose library imports here (torchvision ones only on GPU machines)."""
    return [e.name for e in ENTRIES if (mode is None or e.supports(mode)) and available(e.needs) is None]


def available(library: str = "transformers") -> Optional[str]:
    """None when the library imports, else why not."""
    try:
        __import__(library)
    except Exception as exc:  # ImportError, or a library that fails to import (torchvision beside CPU torch)
        return f"{type(exc).__name__}: {exc}"
    return None


def build(name: str, mode: str = "infer", seed: int = SEED, device: str = "cpu", dtype=None):
    """(model, inputs) for an entry: the same weights and inputs on every call with the
    same seed. The model is in eval() for "infer", train() for "train"."""
    entry = ZOO[name]
    torch.manual_seed(seed)
    model = entry.build()
    model.train(mode == "train")
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = entry.inputs(model, gen)
    if device != "cpu" or dtype is not None:
        model = model.to(device=device, dtype=dtype)
        inputs = {k: (v.to(device=device, dtype=dtype if v.is_floating_point() else None)
                      if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    return model, inputs
