"""Beyond the zoo: every causal-LM architecture transformers ships, built from one tiny
config, through the zoo's runner.

    python -m tests.zoo.sweep [--only llama,qwen2] [--max-params 20e6] [--shard i/n] [runner options]

The zoo (models.py) holds hand-written configs for a few models; users compile the rest.
This builds each `model_type` of transformers' causal-LM auto mapping from its config
class with the same small sizes set through the standard names (hidden_size,
num_hidden_layers, ...: a config's attribute_map turns them into its own), drops models
that do not build that way or stay over --max-params, and runs the others exactly as the
zoo runs its own entries (`python -m tests.zoo --help` lists the runner's options:
--backend, --mode, --compare, --json, ...). Entries are named `hf:<model_type>`.
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


def _builder(model_type: str, class_name: str):
    def build():
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        cls = CONFIG_MAPPING[model_type]
        # a size some configs derive (a read-only property there) is left to them
        config = cls(**{k: v for k, v in TINY.items() if not isinstance(getattr(cls, k, None), property)})
        if getattr(cls, "kv_lora_rank", None):   # latent attention (MLA) expands the KV to every head
            config.num_key_value_heads = config.num_attention_heads
        for k, v in config.to_dict().items():   # every dropout and router jitter off, whatever its name
            if ("dropout" in k or "pdrop" in k or "jitter" in k) and isinstance(v, float) and v > 0:
                setattr(config, k, 0.0)
        return getattr(transformers, class_name)(config)
    return build


def _lm_inputs(model, gen):
    vocab = getattr(model.config, "vocab_size", models.VOCAB) or models.VOCAB
    ids = torch.randint(3, min(vocab, models.VOCAB), (models.BATCH, models.SEQ), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def causal_lm_entries(only=(), max_params: float = 20e6, out=sys.stderr) -> list[str]:
    """Register an entry per buildable causal-LM architecture; the names registered."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    import transformers

    transformers.logging.set_verbosity_error()
    names = []
    for model_type, class_name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        if only and model_type not in only:
            continue
        name = f"hf:{model_type}"
        build = _builder(model_type, class_name)
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
        entry = models.Entry(name, build, _lm_inputs)
        models.ENTRIES.append(entry)
        models.ZOO[name] = entry
        names.append(name)
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.zoo.sweep", description=__doc__.split("\n\n")[0],
                                 epilog="Every other option goes to the zoo's runner (python -m tests.zoo --help).")
    ap.add_argument("--only", default="", help="comma-separated model types (default: all)")
    ap.add_argument("--max-params", type=float, default=20e6, help="skip larger models (default 20e6)")
    ap.add_argument("--shard", default="0/1", help="i/n: every n-th architecture from the i-th, to run n processes")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    k, n = map(int, args.shard.split("/"))
    names = causal_lm_entries(only, args.max_params)[k::n]
    print(f"sweep: {len(names)} architectures built", file=sys.stderr)
    if "--models" not in rest:
        rest += ["--models", ",".join(names)]
    return runner.main(rest)


if __name__ == "__main__":
    sys.exit(main())
