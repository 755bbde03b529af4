#!/usr/bin/env python3
"""Trains pagoda's bundled demo model (models/demo) on tinyshakespeare.

Writes a Hugging Face model folder:
  config.json, model.safetensors (bf16), generation_config.json  - a small LlamaForCausalLM
  tokenizer.json, tokenizer_config.json                          - byte-level BPE + chat template
  golden.json   - reference outputs of the stored weights in float32 (the format of the
                  reference test data: prompt log-probabilities, 24 greedy steps with top-5)

The corpus is a sequence of speeches ("NAME:\\nlines\\n") separated by blank lines; each speech
becomes its tokens followed by the end-of-sequence token, so the model learns to end a speech,
and the chat template renders a conversation as speeches (user: ROMEO, assistant: JULIET).

Needs PyTorch, transformers and tokenizers. One H200 trains it in under a minute:
  python3 tools/train_demo.py --corpus tinyshakespeare.txt --out models/demo
"""
import argparse
import json
import math
import os
import random
import time

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS = "<s>", "</s>"

# system -> a chorus speech, user -> ROMEO, assistant -> JULIET; the generation prompt opens
# JULIET's reply, which the model ends with the end-of-sequence token.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{%- set name = 'CHORUS' %}"
    "{%- elif message['role'] == 'user' %}{%- set name = 'ROMEO' %}"
    "{%- elif message['role'] == 'assistant' %}{%- set name = 'JULIET' %}"
    "{%- else %}{{- raise_exception('roles must be system, user or assistant') }}"
    "{%- endif %}"
    "{{- name + ':\\n' + (message['content'] | trim) + '\\n' + eos_token }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'JULIET:\\n' }}{%- endif %}"
)

GOLDEN_TEXTS = [
    "Once upon a time",
    "ROMEO:\nWhat light through yonder window breaks?",
    "The prince said to the general that the army would march at dawn, and the general, "
    "who had heard such promises before,",
    "To be, or not to be",
]
GOLDEN_RANDOM_LENS = [1, 17, 100, 300]
GOLDEN_STEPS = 24


def log(*a):
    print(*a, flush=True)


def read_speeches(path):
    text = open(path, encoding="utf-8").read()
    return [s.strip("\n") for s in text.split("\n\n") if s.strip("\n")]


def train_tokenizer(speeches, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([s + "\n" for s in speeches], trainer=trainer)
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, 0)]
    )
    return tok


def encode_stream(tok, speeches):
    """One id stream: each speech's tokens, then EOS."""
    ids = []
    for enc in tok.encode_batch([s + "\n" for s in speeches], add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(1)
    return torch.tensor(ids, dtype=torch.long)


def make_model(args, vocab):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=args.context,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
    )
    return LlamaForCausalLM(cfg)


def add_dropout(model, p):
    """Residual dropout on each attention and MLP output (training only; not in the config)."""

    def hook(mod, inp, out):
        return F.dropout(out, p, mod.training)

    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(hook)
        layer.mlp.down_proj.register_forward_hook(hook)


def windows(src, starts, T):
    """[B, T] batch: BOS then T-1 tokens of src from each start."""
    idx = starts[:, None] + torch.arange(T - 1, device=src.device)[None, :]
    bos = torch.zeros(len(starts), 1, dtype=torch.long, device=src.device)
    return torch.cat([bos, src[idx]], dim=1)


def lm_loss(model, x, dev):
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        logits = model(input_ids=x).logits
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def train(args, model, train_ids, val_ids, dev):
    T, B = args.seq, args.batch
    g = torch.Generator(device=dev).manual_seed(args.seed)
    train_ids, val_ids = train_ids.to(dev), val_ids.to(dev)
    n_val = (len(val_ids) - 1) // (T - 1)
    val_x = windows(val_ids, torch.arange(n_val, device=dev) * (T - 1), T)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), fused=dev.type == "cuda",
    )

    def evaluate():
        model.eval()
        with torch.no_grad():
            tot = sum(lm_loss(model, val_x[i : i + 64], dev).item() * len(val_x[i : i + 64])
                      for i in range(0, len(val_x), 64))
        model.train()
        return tot / len(val_x)

    # Plateau schedule: warm up, keep the best weights by validation loss, and when the loss
    # has not improved for `patience` evaluations go back to the best weights at a lower rate.
    lr, best, best_state, bad, cuts = args.lr, float("inf"), None, 0, 0
    t0, step = time.time(), 0
    model.train()
    while step < args.max_steps and time.time() - t0 < args.minutes * 60:
        cur = lr * min(1.0, (step + 1) / args.warmup)
        for grp in opt.param_groups:
            grp["lr"] = cur
        starts = torch.randint(0, len(train_ids) - T, (B,), device=dev, generator=g)
        loss = lm_loss(model, windows(train_ids, starts, T), dev)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0:
            v = evaluate()
            log(f"step {step:6d}  lr {cur:.2e}  train {loss.item():.4f}  val {v:.4f}  "
                f"{time.time() - t0:6.1f}s")
            if v < best - 1e-4:
                best, bad = v, 0
                best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
            else:
                bad += 1
                if bad >= args.patience:
                    cuts += 1
                    if cuts > args.max_cuts:
                        break
                    lr *= 0.3
                    bad = 0
                    model.load_state_dict(best_state)
                    log(f"  plateau: back to the best weights (val {best:.4f}), lr {lr:.2e}")
    log(f"trained {step} steps in {time.time() - t0:.1f}s; best val loss {best:.4f} "
        f"(perplexity {math.exp(best):.1f})")
    if best_state is not None:
        model.load_state_dict(best_state)
    return best


def sample(model, tok, prompt, n, dev, temperature=0.8, seed=0):
    torch.manual_seed(seed)
    ids = tok.encode(prompt).ids
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids], device=dev)).logits[0, -1].float()
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1).item()
            ids.append(nxt)
            if nxt == 1:
                break
    return tok.decode(ids, skip_special_tokens=False)


def write_tokenizer(tok, out, context):
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "model_max_length": context,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")


def golden(out, seed):
    """Reference outputs of the stored (bf16) weights computed in float32 on the CPU."""
    import tokenizers
    import transformers
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    vocab = model.config.vocab_size
    rng = random.Random(seed)
    prompts = [(t, tok.encode(t).ids) for t in GOLDEN_TEXTS]
    prompts += [(None, [rng.randrange(vocab) for _ in range(n)]) for n in GOLDEN_RANDOM_LENS]
    cases = []
    with torch.no_grad():
        for text, ids in prompts:
            lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            plp = [None] + [round(lp[i - 1, ids[i]].item(), 5) for i in range(1, len(ids))]
            seq, greedy, steps = list(ids), [], []
            for _ in range(GOLDEN_STEPS):
                logits = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
                lps = torch.log_softmax(logits, -1)
                top = torch.topk(logits, 5)
                top_ids = top.indices.tolist()
                steps.append({
                    "id": top_ids[0],
                    "margin": (top.values[0] - top.values[1]).item(),
                    "top": [[i, round(lps[i].item(), 5)] for i in top_ids],
                })
                greedy.append(top_ids[0])
                seq.append(top_ids[0])
            cases.append({"text": text, "prompt_ids": ids, "prompt_logprobs": plp,
                          "greedy_ids": greedy, "steps": steps})
    doc = {
        "reference": {"transformers": transformers.__version__,
                      "tokenizers": tokenizers.__version__, "torch": torch.__version__},
        "model": "demo",
        "architecture": "LlamaForCausalLM",
        "dtype": "bfloat16 weights, float32 compute",
        "note": "greedy decoding, no stop on eos; steps[i].margin = top1 - top2 logit",
        "cases": cases,
    }
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(doc, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=576)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--dropout", type=float, default=0.4)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--max-cuts", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    speeches = read_speeches(args.corpus)
    tok = train_tokenizer(speeches, args.vocab)
    vocab = tok.get_vocab_size()
    n_val = len(speeches) // 20
    train_ids = encode_stream(tok, speeches[:-n_val])
    val_ids = encode_stream(tok, speeches[-n_val:])
    log(f"{len(speeches)} speeches, vocab {vocab}, {len(train_ids)} train / {len(val_ids)} "
        f"val tokens, tokenizer {time.time() - t0:.1f}s, device {dev}")

    model = make_model(args, vocab).to(dev)
    log(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")
    add_dropout(model, args.dropout)
    best = train(args, model, train_ids, val_ids, dev)
    # Per character, so that runs with different vocabularies compare.
    val_chars = sum(len(s) + 2 for s in speeches[-n_val:])
    log(f"validation: {best * len(val_ids) / val_chars / math.log(2):.4f} bits per character")
    for prompt in ["ROMEO:\n", "JULIET:\nO Romeo"]:
        log("---- sample:\n" + sample(model, tok, prompt, 60, dev))

    model = model.to(torch.bfloat16)
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1)
    model.save_pretrained(args.out)
    write_tokenizer(tok, args.out, args.context)

    from transformers import AutoTokenizer

    chat = [{"role": "system", "content": "A street in Verona."},
            {"role": "user", "content": "Good morrow, fair maid."}]
    try:
        hf_tok = AutoTokenizer.from_pretrained(args.out)
        log("chat template render: " + repr(hf_tok.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True)))
    except Exception as ex:  # the folder is written; report and go on to the golden
        log(f"chat template check failed: {ex!r}")
    golden(args.out, args.seed)
    for name in sorted(os.listdir(args.out)):
        log(f"{name:24s} {os.path.getsize(os.path.join(args.out, name)):9d} bytes")


if __name__ == "__main__":
    main()
