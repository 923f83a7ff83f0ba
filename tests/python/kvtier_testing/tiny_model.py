"""A tiny Llama-family model made here: random weights and a tokenizer trained on text
generated here, written as a Hugging Face model directory that vLLM loads with
HF_HUB_OFFLINE=1 (nothing comes from a hub).

    python -m kvtier_testing.tiny_model DIR [--layers 2 --hidden 64 --heads 4 --kv-heads 2]
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


def make(out_dir: str, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
         intermediate: int = 0, vocab_size: int = 512, max_positions: int = 8192, seed: int = 0,
         weights: bool = True) -> str:
    """Writes the model to `out_dir` (made if missing); returns it. `weights=False`
    writes only config and tokenizer (enough for vLLM's configs and scheduler)."""
    os.makedirs(out_dir, exist_ok=True)
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m kvtier_testing.tiny_model", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    a = p.parse_args(argv)
    print(make(a.out_dir, layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, vocab_size=a.vocab))


if __name__ == "__main__":
    main()
