#!/usr/bin/env python3
"""make_tiny_llama.py [--weights] [--sliding-window N [--mixed]] DIR -- write a tiny Llama-architecture model directory for `vllm serve DIR
--load-format dummy` (random weights, no download): config.json (2 layers, 4 query heads, 4 KV heads of
32 dims, so TP2 and TP4 split heads), a byte-level BPE tokenizer trained with `tokenizers` on a few
sentences (tokenizer.json, vocabulary below the model's 512), tokenizer_config.json and
generation_config.json. Deterministic: the same files every run. Needs the `tokenizers` package.

--sliding-window N makes it a Mistral-architecture model (the same weights' names) whose attention sees
only the last N tokens: vLLM then keeps a sliding-window KV cache group. --mixed keeps it a Llama whose
first layer attends fully and second in the window (config layer_types): a hybrid model, two KV cache
groups where vLLM's hybrid KV cache manager runs.
--weights also writes model.safetensors with seeded random weights (torch + safetensors), to serve
without --load-format dummy: vLLM's dummy loader draws each rank's shard on its own, so a TP2 instance
and a TP1 instance of the same dummy model compute different functions (seen: " fox fox" at TP1,
"4\ufffd4" at TP2 for the same greedy prompt), and P/D parity across TP sizes needs real weights.
"""
from __future__ import annotations

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "head_dim": 32, "hidden_act": "silu", "max_position_embeddings": 1024, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "torch_dtype": "float32",
}
TEXT = ["The quick brown fox jumps over the lazy dog. " * 3,
        "pdlink moves the KV cache of a prompt from prefill to decode.",
        "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}"]


def write_weights(out: str) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(15)
    H, I, V = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    q = CONFIG["num_attention_heads"] * CONFIG["head_dim"]
    kv = CONFIG["num_key_value_heads"] * CONFIG["head_dim"]

    def rnd(*shape: int) -> "torch.Tensor":
        return (torch.randn(*shape, generator=g) * 0.05).contiguous()

    w = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": torch.ones(H), "lm_head.weight": rnd(V, H)}
    for layer in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        w.update({p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
                  p + "self_attn.q_proj.weight": rnd(q, H), p + "self_attn.k_proj.weight": rnd(kv, H),
                  p + "self_attn.v_proj.weight": rnd(kv, H), p + "self_attn.o_proj.weight": rnd(H, q),
                  p + "mlp.gate_proj.weight": rnd(I, H), p + "mlp.up_proj.weight": rnd(I, H),
                  p + "mlp.down_proj.weight": rnd(H, I)})
    save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def main(out: str, sliding_window: int = 0, mixed: bool = False) -> None:
    os.makedirs(out, exist_ok=True)
    if sliding_window and mixed:
        CONFIG.update(sliding_window=sliding_window, layer_types=["full_attention", "sliding_attention"])
    elif sliding_window:
        CONFIG.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=sliding_window)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=CONFIG["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 50, trainer)
    assert tok.get_vocab_size() <= CONFIG["vocab_size"], tok.get_vocab_size()
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "model_max_length": 1024}, f)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"do_sample": False, "bos_token_id": 1, "eos_token_id": 2}, f)


if __name__ == "__main__":
    args = sys.argv[1:]
    weights = "--weights" in args
    args = [a for a in args if a != "--weights"]
    mixed = "--mixed" in args
    args = [a for a in args if a != "--mixed"]
    window = 0
    if "--sliding-window" in args:
        i = args.index("--sliding-window")
        window = int(args[i + 1]) if i + 1 < len(args) and args[i + 1].isdigit() else 0
        if window <= 0:
            sys.exit("--sliding-window needs a positive number of tokens")
        del args[i:i + 2]
    if len(args) != 1:
        sys.exit(__doc__)
    if mixed and not window:
        sys.exit("--mixed needs --sliding-window N")
    main(args[0], window, mixed)
    if weights:
        write_weights(args[0])
