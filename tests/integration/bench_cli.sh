#!/usr/bin/env bash
# CLI test of `pagoda bench decode` and `pagoda bench throughput` on the bundled demo model:
# the run's shape as reported in --json (batch, prompts per prefill step, lengths; requests,
# sampling, output tokens), the clamp of --prefill-seqs to the batch, and exit status 2 for
# usage errors. Then `pagoda bench make-model` for the MoE, hybrid and BitNet families: the
# tensors of both layouts (names, dtypes, shapes), info's parameter counts against the
# shape's, and 8 generated tokens from each written model.
# Usage: bench_cli.sh PAGODA_BINARY
set -uo pipefail
BIN="$1"
MODEL="$(dirname "$0")/../../models/demo"
[ -x "$BIN" ] || { echo "FAIL: no binary $BIN"; exit 1; }
fails=0
expect() { # expect NAME WANT GOT
  if [ "$2" != "$3" ]; then echo "FAIL $1: want [$2] got [$3]"; fails=$((fails + 1)); fi
}
shape() { # the shape fields of a --json report
  grep -o '"batch": [0-9]*, "prefill_seqs": [0-9]*, "prompt_len": [0-9]*, "gen_len": [0-9]*'
}
run() { "$BIN" bench decode --model "$MODEL" --device cpu --threads 1 --no-bandwidth --json "$@"; }

expect "every prompt in one step by default" '"batch": 3, "prefill_seqs": 3, "prompt_len": 8, "gen_len": 2' \
  "$(run --batch 3 --prompt-len 8 --gen-len 2 | shape)"
expect "one prompt a step" '"batch": 3, "prefill_seqs": 1, "prompt_len": 8, "gen_len": 2' \
  "$(run --batch 3 --prompt-len 8 --gen-len 2 --prefill-seqs 1 | shape)"
expect "two prompts a step" '"batch": 5, "prefill_seqs": 2, "prompt_len": 8, "gen_len": 2' \
  "$(run --batch 5 --prompt-len 8 --gen-len 2 --prefill-seqs 2 | shape)"
expect "clamped to the batch" '"batch": 2, "prefill_seqs": 2, "prompt_len": 4, "gen_len": 1' \
  "$(run --batch 2 --prompt-len 4 --gen-len 1 --prefill-seqs 9 | shape)"
tps="$(run --batch 4 --prompt-len 8 --gen-len 2 --prefill-seqs 4 |
  grep -o '"prefill_tokens_per_s": [0-9.]*' | grep -o '[0-9.]*$')"
if ! awk -v t="$tps" 'BEGIN { exit !(t > 0) }'; then
  echo "FAIL prefill rate: [$tps]"
  fails=$((fails + 1))
fi

status() { "$@" >/dev/null 2>&1; echo $?; }
expect "zero prompts a step" 2 "$(status run --prefill-seqs 0)"
expect "not a number" 2 "$(status run --prefill-seqs two)"
expect "unknown option" 2 "$(status run --prefill 2)"
expect "no model" 2 "$(status "$BIN" bench decode --prefill-seqs 2)"

# bench throughput: every request gets its output_len tokens, greedy or sampled
tp() { "$BIN" bench throughput --model "$MODEL" --device cpu --threads 1 --json "$@"; }
tshape() { grep -o '"num_prompts": [0-9]*, "input_len": [0-9]*, "output_len": [0-9]*, "prefix_len": [0-9]*, "temperature": [0-9.]*, "top_p": [0-9.]*, "output_tokens": [0-9]*'; }
expect "throughput greedy" \
  '"num_prompts": 3, "input_len": 8, "output_len": 5, "prefix_len": 0, "temperature": 0, "top_p": 1, "output_tokens": 15' \
  "$(tp --num-prompts 3 --input-len 8 --output-len 5 | tshape)"
expect "throughput sampled" \
  '"num_prompts": 4, "input_len": 6, "output_len": 7, "prefix_len": 0, "temperature": 0.8, "top_p": 0.9, "output_tokens": 28' \
  "$(tp --num-prompts 4 --input-len 6 --output-len 7 --temperature 0.8 --top-p 0.9 | tshape)"
expect "negative temperature" 2 "$(status tp --temperature -1)"
expect "top-p of 0" 2 "$(status tp --top-p 0)"
expect "top-p above 1" 2 "$(status tp --top-p 1.5)"

# bench make-model, MoE and hybrid: hidden 128, 4 layers (3 DeltaNet + 1 full attention on
# qwen3_5*), 4/2 heads of 32, 8 experts top 2 of width 64, shared expert 64, DeltaNet 2 key /
# 4 value heads of 32 (conv channels 2*64 + 128 = 256), vocab 512.
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mk() { # mk ARCH FORMAT [flags]: writes $TMP/ARCH-FORMAT
  local a="$1" f="$2"
  shift 2
  "$BIN" bench make-model --arch "$a" --format "$f" --hidden 128 --layers 4 --heads 4 \
    --kv-heads 2 --ffn 256 --vocab 512 "$@" "$TMP/$a-$f" >/dev/null
}
MOE=(--experts 8 --experts-per-tok 2 --expert-ffn 64)
LIN=(--linear-key-heads 2 --linear-value-heads 4 --linear-key-dim 32 --linear-value-dim 32)
header() { head -c 200000 "$TMP/$1/model.safetensors" | tr -d '\0'; }
has() { # has MODEL 'name' DTYPE 'shape': the header entry, exactly
  local got
  got="$(header "$1" | grep -ao "\"$2\":{\"dtype\":\"[A-Z0-9]*\",\"shape\":\[[0-9,]*\]")"
  expect "$1 $2" "\"$2\":{\"dtype\":\"$3\",\"shape\":[$4]}" "${got/\]/]\}}"
}
for f in bf16 mlx4; do
  mk qwen3_moe $f "${MOE[@]}" || { echo "FAIL make-model qwen3_moe $f"; fails=$((fails + 1)); }
  mk qwen3_5 $f "${LIN[@]}" || { echo "FAIL make-model qwen3_5 $f"; fails=$((fails + 1)); }
  mk qwen3_5_moe $f "${MOE[@]}" "${LIN[@]}" --shared-expert-ffn 64 ||
    { echo "FAIL make-model qwen3_5_moe $f"; fails=$((fails + 1)); }
done
# Hugging Face layout
has qwen3_moe-bf16 model.layers.3.mlp.experts.7.down_proj.weight BF16 128,64
has qwen3_moe-bf16 model.layers.0.mlp.gate.weight BF16 8,128
has qwen3_moe-bf16 model.layers.0.self_attn.q_proj.weight BF16 128,128
has qwen3_5-bf16 model.layers.0.linear_attn.conv1d.weight BF16 256,1,4
has qwen3_5-bf16 model.layers.0.linear_attn.in_proj_qkv.weight BF16 256,128
has qwen3_5-bf16 model.layers.0.linear_attn.in_proj_z.weight BF16 128,128
has qwen3_5-bf16 model.layers.0.linear_attn.in_proj_b.weight BF16 4,128
has qwen3_5-bf16 model.layers.0.linear_attn.in_proj_a.weight BF16 4,128
has qwen3_5-bf16 model.layers.0.linear_attn.out_proj.weight BF16 128,128
has qwen3_5-bf16 model.layers.2.linear_attn.A_log BF16 4
has qwen3_5-bf16 model.layers.2.linear_attn.dt_bias BF16 4
has qwen3_5-bf16 model.layers.2.linear_attn.norm.weight BF16 32
has qwen3_5-bf16 model.layers.3.self_attn.q_proj.weight BF16 256,128
has qwen3_5-bf16 model.layers.3.self_attn.q_norm.weight BF16 32
has qwen3_5-bf16 model.layers.3.mlp.down_proj.weight BF16 128,256
has qwen3_5_moe-bf16 model.layers.1.mlp.experts.0.gate_proj.weight BF16 64,128
has qwen3_5_moe-bf16 model.layers.1.mlp.shared_expert.up_proj.weight BF16 64,128
has qwen3_5_moe-bf16 model.layers.1.mlp.shared_expert_gate.weight BF16 1,128
# MLX layout: stacked experts, conv1d [C, K, 1], routers at 8 bits, vectors unquantized
has qwen3_moe-mlx4 model.layers.2.mlp.switch_mlp.up_proj.weight U32 8,64,16
has qwen3_moe-mlx4 model.layers.2.mlp.switch_mlp.down_proj.scales BF16 8,128,1
has qwen3_moe-mlx4 model.layers.2.mlp.gate.weight U32 8,32
has qwen3_5-mlx4 model.layers.0.linear_attn.conv1d.weight BF16 256,4,1
has qwen3_5-mlx4 model.layers.0.linear_attn.in_proj_qkv.weight U32 256,16
has qwen3_5-mlx4 model.layers.0.linear_attn.A_log BF16 4
has qwen3_5_moe-mlx4 model.layers.3.mlp.switch_mlp.gate_proj.biases BF16 8,64,2
has qwen3_5_moe-mlx4 model.layers.3.mlp.shared_expert_gate.weight U32 1,32
has qwen3_5_moe-mlx4 model.layers.3.mlp.shared_expert.down_proj.weight U32 128,8
expect "no per-expert tensors in MLX" 0 \
  "$(header qwen3_5_moe-mlx4 | grep -ac 'mlp\.experts\.' || true)"
expect "router override (quantization, quantization_config)" 2 "$(grep -c '"model.layers.3.mlp.gate":' "$TMP/qwen3_moe-mlx4/config.json")"
expect "layer types" '"layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],' \
  "$(tr -d '\t\n' <"$TMP/qwen3_5-bf16/config.json" | grep -o '"layer_types":[^]]*],' | sed 's/:/: /')"

# Parameter counts from the shape: embedding + head 2*512*128, final norm 128, per layer
# two norms 256; attention q (128 or gated 256) + k, v 64 + o 128 rows of 128 (+ q/k norms
# 64); DeltaNet qkv 256 + z 128 + b, a 4 + out 128 rows of 128, conv 256*4, A_log, dt_bias
# 4, norm 32; dense MLP 3*256*128; experts router 8*128 + 8*3*64*128, shared 3*64*128 + 128.
emb=$((2 * 512 * 128 + 128 + 4 * 256))
att=$(((128 + 64 + 64 + 128) * 128 + 64))
gatt=$(((256 + 64 + 64 + 128) * 128 + 64))
lin=$(((256 + 128 + 4 + 4 + 128) * 128 + 256 * 4 + 4 + 4 + 32))
mlp=$((3 * 256 * 128))
expert=$((3 * 64 * 128))
moe=$((8 * 128 + 8 * expert))
params() { "$BIN" info --model "$TMP/$1" --json | grep -o "\"$2\": [0-9]*" | head -1 | grep -o '[0-9]*$'; }
for f in bf16 mlx4; do
  expect "qwen3_moe $f parameters" $((emb + 4 * (att + moe))) "$(params qwen3_moe-$f parameters)"
  expect "qwen3_moe $f active" $((emb + 4 * (att + moe - 6 * expert))) \
    "$(params qwen3_moe-$f active_parameters)"
  expect "qwen3_5 $f parameters" $((emb + 3 * lin + gatt + 4 * mlp)) "$(params qwen3_5-$f parameters)"
  expect "qwen3_5_moe $f parameters" $((emb + 3 * lin + gatt + 4 * (moe + expert + 128))) \
    "$(params qwen3_5_moe-$f parameters)"
  for a in qwen3_moe qwen3_5 qwen3_5_moe; do
    # the output ids of --json (the folder has a tokenizer: plain output would be text)
    ids="$("$BIN" generate --model "$TMP/$a-$f" --prompt-ids "1 2 3" -n 8 --temperature 0 \
      --ignore-eos --threads 1 --json | grep -o '"ids": \[[0-9, ]*\]' | tr -d '",:[]a-z')"
    expect "$a $f generates 8 tokens" 8 "$(echo "$ids" | wc -w)"
  done
done
expect "info names the experts" 1 \
  "$("$BIN" info --model "$TMP/qwen3_5_moe-mlx4" | grep -c '^experts .*8 routed, 2 per token, width 64; shared expert 64')"
expect "experts on llama" 2 "$(status "$BIN" bench make-model --arch llama --experts 8 "$TMP/x")"
expect "more chosen than experts" 2 \
  "$(status "$BIN" bench make-model --arch qwen3_moe --experts 4 --experts-per-tok 5 "$TMP/x")"
# a checkpoint larger than any disk (1 PB of embeddings) is refused before anything is written
expect "no room" 1 "$(status "$BIN" bench make-model --hidden 1048576 --heads 8192 --kv-heads 8192 \
  --vocab 536870912 --layers 1 --ffn 64 "$TMP/huge")"
expect "no room leaves no directory" 0 "$(ls -d "$TMP/huge" 2>/dev/null | wc -l)"
expect "shared expert on qwen3_moe" 2 \
  "$(status "$BIN" bench make-model --arch qwen3_moe --shared-expert-ffn 64 "$TMP/x")"

# BitNet: every decoder linear packed ternary as microsoft/bitnet-b1.58-2B-4T stores it (uint8,
# four output rows a byte, a weight_scale each), the two sub-norms, the embedding tied as head.
mk bitnet bf16 || { echo "FAIL make-model bitnet"; fails=$((fails + 1)); }
has bitnet-bf16 model.layers.3.self_attn.k_proj.weight U8 16,128
has bitnet-bf16 model.layers.3.mlp.down_proj.weight U8 32,256
has bitnet-bf16 model.layers.0.mlp.gate_proj.weight_scale BF16 1
has bitnet-bf16 model.layers.0.self_attn.attn_sub_norm.weight BF16 128
has bitnet-bf16 model.layers.0.mlp.ffn_sub_norm.weight BF16 256
expect "bitnet: tied, no lm_head" 0 "$(header bitnet-bf16 | grep -ac 'lm_head' || true)"
expect "bitnet parameters" $((512 * 128 + 128 + 4 * (256 + 128 + 256 + 384 * 128 + mlp))) \
  "$(params bitnet-bf16 parameters)"
ids="$("$BIN" generate --model "$TMP/bitnet-bf16" --prompt-ids "1 2 3" -n 8 --temperature 0 \
  --ignore-eos --threads 1 --json | grep -o '"ids": \[[0-9, ]*\]' | tr -d '",:[]a-z')"
expect "bitnet generates 8 tokens" 8 "$(echo "$ids" | wc -w)"
expect "bitnet in mlx4" 2 "$(status "$BIN" bench make-model --arch bitnet --format mlx4 "$TMP/x")"

if [ "$fails" -ne 0 ]; then
  echo "bench_cli: $fails failed"
  exit 1
fi
echo "bench_cli: all passed"
