#!/usr/bin/env python3
"""Reference outputs for BitNet b1.58 (BitNetForCausalLM), which the shared test data lacks.

Builds one tiny random BitNet model with the llama-tiny reference model's vocabulary (2048)
and golden prompts, and writes under OUT two folders in the format of the reference test data
(config.json, model.safetensors, golden.json; `base` names the model whose tokenizer they
borrow):

  bitnet-packed  the layout of microsoft/bitnet-b1.58-2B-4T: every linear layer of the
                 decoder stored as ternary values packed four to a byte (uint8, the row
                 index split in four quarters, value + 1 in bits 2i..2i+1 of quarter i) with
                 a one-element `weight_scale`; quantization_config {quant_method: bitnet,
                 linear_class: bitlinear, quantization_mode: offline}
  bitnet-bf16    the bf16-master layout (microsoft/bitnet-b1.58-2B-4T-bf16): bf16 weights,
                 quantized to ternary at run time (absmean per tensor);
                 quantization_config {quant_method: bitnet, linear_class: autobitlinear,
                 quantization_mode: online}

Both quantize activations to 8 bits per token (absmax) before every BitLinear, as the
reference does. The goldens come from Hugging Face transformers in float32 (TF32 off); the
bitnet quantizer needs a CUDA device, so this runs where one is.

  TORCHDYNAMO_DISABLE=1 python3 tools/make_bitnet_goldens.py --base DIR/llama-tiny --out OUT
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def ternary(w):
    """absmean quantization of one tensor: (values in {-1, 0, 1}, scale s with w ~ values / s)."""
    w = w.float()
    s = 1.0 / w.abs().mean().clamp(min=1e-5)
    return (w * s).round().clamp(-1, 1), s


def pack(values):
    """[n, k] ternary -> uint8 [n/4, k]: row r of quarter i sits in bits 2i..2i+1 of row r."""
    n, k = values.shape
    assert n % 4 == 0
    q = n // 4
    codes = (values + 1).to(torch.uint8)
    packed = torch.zeros(q, k, dtype=torch.uint8)
    for i in range(4):
        packed |= codes[i * q : (i + 1) * q] << (2 * i)
    return packed


@torch.no_grad()
def run_case(model, ids, n_steps, dev):
    """prompt log-probabilities and greedy steps with top-5, as in the reference goldens."""
    out = model(torch.tensor([ids], device=dev), use_cache=True)
    past, logits = out.past_key_values, out.logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    prompt_lp = [None] + [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    steps, greedy, last = [], [], logits[-1]
    for _ in range(n_steps):
        l = torch.log_softmax(last, dim=-1)
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
        out = model(torch.tensor([[tok]], device=dev), past_key_values=past, use_cache=True)
        past = out.past_key_values
        last = out.logits[0, -1].double()
    return prompt_lp, greedy, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM, BitNetConfig, BitNetForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    torch.manual_seed(args.seed)
    base_gold = json.load(open(os.path.join(args.base, "golden.json")))
    cfg = BitNetConfig(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="relu2",
        max_position_embeddings=4096,
        initializer_range=0.05,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=None,
    )
    cfg.architectures = ["BitNetForCausalLM"]
    master = BitNetForCausalLM(cfg).eval()
    # Norm weights away from 1 so that a norm applied to the wrong tensor shows.
    for name, p in master.named_parameters():
        if name.endswith("norm.weight"):
            p.data = 1.0 + 0.2 * torch.randn_like(p)
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in master.state_dict().items()}
    weights.pop("lm_head.weight", None)

    layouts = {
        "bitnet-packed": {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"},
        "bitnet-bf16": {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"},
    }
    for name, qc in layouts.items():
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        stored = {}
        for k, v in weights.items():
            if name == "bitnet-packed" and k.endswith(".weight") and k.split(".")[-2] in LINEAR:
                values, s = ternary(v)
                stored[k] = pack(values)
                stored[k[: -len(".weight")] + ".weight_scale"] = torch.tensor([s], dtype=torch.bfloat16)
            else:
                stored[k] = v
        save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        c = json.loads(cfg.to_json_string())
        c["quantization_config"] = qc
        c["dtype"] = "bfloat16"
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, device_map=dev).eval()
        kinds = sorted({type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__})
        cases = []
        for case in base_gold["cases"]:
            plp, greedy, steps = run_case(model, case["prompt_ids"], len(case["greedy_ids"]), dev)
            cases.append({"prompt_ids": case["prompt_ids"], "prompt_logprobs": plp, "greedy_ids": greedy, "steps": steps})
        gold = {
            "reference": {"transformers": transformers.__version__, "torch": torch.__version__},
            "model": name,
            "architecture": "BitNetForCausalLM",
            "base": os.path.basename(os.path.normpath(args.base)),
            "dtype": "ternary weights (%s), int8 per-token activations, float32 compute" % qc["linear_class"],
            "note": "greedy decoding, no stop on eos; steps[i].margin = top1 - top2 logit; linear modules: "
            + ", ".join(kinds),
            "cases": cases,
        }
        json.dump(gold, open(os.path.join(d, "golden.json"), "w"))
        for f in ("generation_config.json",):
            if os.path.exists(os.path.join(d, f)):
                os.remove(os.path.join(d, f))
        print(name, "done:", ", ".join(kinds), flush=True)
        del model
    shutil.rmtree(os.path.join(args.out, "__pycache__"), ignore_errors=True)


if __name__ == "__main__":
    main()
