#!/usr/bin/env python3
"""Reference outputs for model variants that the shared test data does not cover.

From one tiny Llama checkpoint (its weights and golden prompts), writes under OUT one folder
per variant with config.json and golden.json (the format of the reference test data) and,
for the quantized variant, its own model.safetensors:

  rope-linear   rope_type linear, factor 4
  rope-dynamic  rope_type dynamic (NTK), factor 2, context 64: the long prompts run past it
  rope-yarn     rope_type yarn, factor 4 over an original context of 64
  nvfp4         every linear layer in MLX's nvfp4 layout (fp4 e2m1 values, one e4m3 scale
                per 16), the golden computed from the dequantized weights

Goldens come from Hugging Face transformers in float32. Dynamic NTK rescales by the length
seen so far, so its golden feeds the tokens one at a time (each token rotated for its own
position), which is how pagoda applies it.

  python3 tools/make_variant_goldens.py --base DIR/llama-tiny --out OUT
"""
import argparse
import copy
import json
import math
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaForCausalLM

FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]

VARIANTS = {
    "rope-linear": {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
    "rope-dynamic": {
        "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        "max_position_embeddings": 64,
    },
    "rope-yarn": {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 10000.0,
        },
        "max_position_embeddings": 256,
    },
    "nvfp4": {"quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4"}},
}

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_nvfp4(w):
    """w [n, k] float32 -> (packed uint32 [n, k/8], scales uint8 [n, k/16], dequantized)."""
    n, k = w.shape
    g = w.reshape(n, k // 16, 16)
    amax = g.abs().amax(dim=-1, keepdim=True)
    scale = (amax / 6.0).to(torch.float8_e4m3fn)
    s = scale.to(torch.float32)
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = g / s
    table = torch.tensor(FP4)
    idx = (q.abs().unsqueeze(-1) - table).abs().argmin(dim=-1)
    sign = (q < 0).to(torch.int64)
    codes = (sign << 3) | idx
    deq = (table[idx] * torch.where(sign.bool(), -1.0, 1.0) * s).reshape(n, k)
    codes = codes.reshape(n, k // 8, 8)
    packed = torch.zeros(n, k // 8, dtype=torch.int64)
    for j in range(8):
        packed |= codes[:, :, j] << (4 * j)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32).view(torch.uint32)
    return packed, scale.reshape(n, k // 16).view(torch.uint8), deq


@torch.no_grad()
def run_case(model, ids, n_steps, one_by_one):
    """prompt log-probabilities and greedy steps with top-5, as in the reference goldens."""
    ids_t = torch.tensor([ids])
    if one_by_one:
        past, rows = None, []
        for i in range(len(ids)):
            out = model(ids_t[:, i : i + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0, -1])
        logits = torch.stack(rows)
    else:
        out = model(ids_t, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0]
    lp = torch.log_softmax(logits.double(), dim=-1)
    prompt_lp = [None] + [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    steps, greedy, last = [], [], logits[-1]
    for _ in range(n_steps):
        l = torch.log_softmax(last.double(), dim=-1)
        top = torch.topk(last, 5)
        tok = int(top.indices[0])
        steps.append(
            {
                "id": tok,
                "margin": float(top.values[0] - top.values[1]),
                "top": [[int(i), l[int(i)].item()] for i in top.indices],
            }
        )
        greedy.append(tok)
        out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        last = out.logits[0, -1]
    return prompt_lp, greedy, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    base_cfg = json.load(open(os.path.join(args.base, "config.json")))
    base_gold = json.load(open(os.path.join(args.base, "golden.json")))
    weights = load_file(os.path.join(args.base, "model.safetensors"))
    for name, change in VARIANTS.items():
        cfg = copy.deepcopy(base_cfg)
        cfg.update(change)
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        ref_weights = {k: v.float() for k, v in weights.items()}
        if name == "nvfp4":
            stored = {}
            for k, v in weights.items():
                if k.endswith(".weight") and k.split(".")[-2] in LINEAR:
                    packed, scales, deq = quantize_nvfp4(v.float())
                    stored[k] = packed
                    stored[k[: -len(".weight")] + ".scales"] = scales
                    ref_weights[k] = deq
                else:
                    stored[k] = v
            save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "mlx"})
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
        ref_cfg = {k: v for k, v in cfg.items() if k != "quantization"}
        tmp = os.path.join(d, ".ref")
        os.makedirs(tmp, exist_ok=True)
        json.dump(ref_cfg, open(os.path.join(tmp, "config.json"), "w"))
        save_file({k: v.contiguous() for k, v in ref_weights.items()}, os.path.join(tmp, "model.safetensors"))
        model = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        cases = []
        for c in base_gold["cases"]:
            plp, greedy, steps = run_case(model, c["prompt_ids"], len(c["greedy_ids"]), name == "rope-dynamic")
            cases.append({"prompt_ids": c["prompt_ids"], "prompt_logprobs": plp, "greedy_ids": greedy, "steps": steps})
        import transformers

        gold = {
            "reference": {"transformers": transformers.__version__, "torch": torch.__version__},
            "model": name,
            "architecture": "LlamaForCausalLM",
            "base": os.path.basename(os.path.normpath(args.base)),
            "dtype": "bfloat16 weights, float32 compute" + (" (dequantized nvfp4)" if name == "nvfp4" else ""),
            "note": "greedy decoding, no stop on eos; steps[i].margin = top1 - top2 logit"
            + ("; fed one token at a time" if name == "rope-dynamic" else ""),
            "cases": cases,
        }
        json.dump(gold, open(os.path.join(d, "golden.json"), "w"))
        for f in os.listdir(tmp):
            os.remove(os.path.join(tmp, f))
        os.rmdir(tmp)
        print(name, "done", flush=True)


if __name__ == "__main__":
    main()
