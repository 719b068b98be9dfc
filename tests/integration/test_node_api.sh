#!/usr/bin/env bash
# test_node_api.sh -- pdlink-node serving alone: every endpoint, streaming and not, bad inputs (4xx with a
# message naming the field, node stays alive), determinism across TP sizes and layouts, clean SIGTERM.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"

start_node A --model tiny -tp 4 --seed 7 --trust-remote-code --language-model-only --attention-backend TRITON_ATTN \
    --no-enable-prefix-caching --gpu-memory-utilization 0.90 --tool-call-parser x --reasoning-parser x \
    --enable-auto-tool-choice --max-model-len 512 --log-level info || exit 1
P=$A_PORT
PROMPT="Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."

# ---- GET endpoints
check_eq "GET /health is 200" "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$P/health)" 200
models=$(curl -s http://127.0.0.1:$P/v1/models)
check_eq "GET /v1/models lists the served model" "$(jq -r '.data[0].id' <<<"$models")" tiny
check_eq "GET /v1/models object is list" "$(jq -r '.object' <<<"$models")" list
metrics=$(curl -s http://127.0.0.1:$P/metrics)
for name in pdlink_transfers_total pdlink_kv_bytes_total pdlink_descriptors_total pdlink_read_seconds_total \
    pdlink_releases_sent_total pdlink_releases_received_total pdlink_releases_duplicate_total \
    pdlink_releases_late_total pdlink_releases_parked_total pdlink_releases_failed_total \
    pdlink_dropped_malformed_total pdlink_expired_total pdlink_handshakes_total pdlink_handshake_failures_total \
    pdlink_read_failures_total; do
    check_contains "/metrics has $name for rank 3" "$metrics" "$name{rank=\"3\",role=\"both\"} 0"
done
for name in pdlink_held_transfers pdlink_held_blocks pdlink_free_blocks pdlink_total_blocks \
    pdlink_kv_bytes_verified_total pdlink_kv_bytes_mismatched_total 'pdlink_requests_total{role="both",status="ok"}' \
    'pdlink_requests_total{role="both",status="failed"}' pdlink_transfer_seconds_bucket pdlink_transfer_seconds_sum \
    pdlink_transfer_seconds_count pdlink_transfer_bytes_bucket pdlink_transfer_bytes_count; do
    check_contains "/metrics has $name" "$metrics" "$name"
done
check_contains "/metrics histogram has +Inf" "$metrics" 'pdlink_transfer_seconds_bucket{role="both",le="+Inf"} 0'

# ---- completions, non-streaming
body=$(jq -cn --arg p "$PROMPT" '{model:"tiny", prompt:$p, max_tokens:8, temperature:0}')
r=$(post $P /v1/completions "$body" -H 'X-Request-Id: req-123')
code=${r%% *}
json=${r#* }
check_eq "completion is 200" "$code" 200
check_eq "completion id is cmpl-<X-Request-Id>" "$(jq -r .id <<<"$json")" cmpl-req-123
check_eq "completion object" "$(jq -r .object <<<"$json")" text_completion
check_eq "completion finish_reason length" "$(jq -r '.choices[0].finish_reason' <<<"$json")" length
check_eq "completion logprobs null" "$(jq -r '.choices[0].logprobs' <<<"$json")" null
check_eq "completion usage.completion_tokens" "$(jq -r '.usage.completion_tokens' <<<"$json")" 8
check_eq "completion usage.prompt_tokens (BOS + 20 words)" "$(jq -r '.usage.prompt_tokens' <<<"$json")" 21
check_eq "completion usage.total_tokens" "$(jq -r '.usage.total_tokens' <<<"$json")" 29
check_eq "completion kv_transfer_params null when serving alone" "$(jq -c '.kv_transfer_params' <<<"$json")" null
text=$(jq -r '.choices[0].text' <<<"$json")
check_eq "completion text has 8 words" "$(wc -w <<<"$text")" 8
echo "  sample: \"$text\""
check_eq "same prompt, same text" "$(completion_text $P "$PROMPT" 8)" "$text"
check "different prompt, different text" [ "$(completion_text $P "$PROMPT Then" 8)" != "$text" ]
short=$(completion_text $P "$PROMPT" 3)
check "max_tokens 3 is a prefix of max_tokens 8" [ "${text#"$short"}" != "$text" ]
arr=$(curl -s -d "$(jq -cn --arg p "$PROMPT" '{prompt:[$p], max_tokens:8}')" http://127.0.0.1:$P/v1/completions |
    jq -r '.choices[0].text')
check_eq "prompt as [string] equals prompt as string" "$arr" "$text"
dflt=$(curl -s -d "$(jq -cn --arg p "$PROMPT" '{prompt:$p}')" http://127.0.0.1:$P/v1/completions |
    jq -r '.usage.completion_tokens')
check_eq "default max_tokens is 16" "$dflt" 16

# ---- completions, streaming
curl -sN -d "$(jq -cn --arg p "$PROMPT" '{prompt:$p, max_tokens:8, stream:true}')" \
    http://127.0.0.1:$P/v1/completions >"$TMP/sse"
check_eq "stream: 8 chunks + [DONE]" "$(grep -c '^data: ' "$TMP/sse")" 9
check_eq "stream ends with data: [DONE]" "$(grep '^data: ' "$TMP/sse" | tail -1)" "data: [DONE]"
stext=$(grep '^data: {' "$TMP/sse" | sed 's/^data: //' | jq -j '.choices[0].text')
check_eq "stream text equals non-stream text" "$stext" "$text"
check_eq "stream last chunk finish_reason" "$(grep '^data: {' "$TMP/sse" | tail -1 | sed 's/^data: //' |
    jq -r '.choices[0].finish_reason')" length
check_eq "stream chunks are separated by blank lines" "$(grep -c '^$' "$TMP/sse")" 9
ctype=$(curl -sN -o /dev/null -w '%{content_type}' -d '{"prompt":"x","max_tokens":1,"stream":true}' \
    http://127.0.0.1:$P/v1/completions)
check_contains "stream content type" "$ctype" text/event-stream
curl -sN -d '{"prompt":"a b c","max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}' \
    http://127.0.0.1:$P/v1/completions >"$TMP/sse2"
check_eq "stream include_usage: usage chunk" "$(grep '^data: {' "$TMP/sse2" | tail -1 | sed 's/^data: //' |
    jq -c '[.choices, .usage.completion_tokens, .usage.prompt_tokens]')" '[[],2,4]'

# ---- chat
chat='{"model":"tiny","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"How many clips?"}],"max_tokens":5}'
r=$(post $P /v1/chat/completions "$chat")
json=${r#* }
check_eq "chat is 200" "${r%% *}" 200
check_eq "chat object" "$(jq -r .object <<<"$json")" chat.completion
check_contains "chat id prefix" "$(jq -r .id <<<"$json")" chatcmpl-
check_eq "chat message role" "$(jq -r '.choices[0].message.role' <<<"$json")" assistant
ctext=$(jq -r '.choices[0].message.content' <<<"$json")
check_eq "chat content has 5 words" "$(wc -w <<<"$ctext")" 5
echo "  chat sample: \"$ctext\""
curl -sN -d "$(jq -c '.stream=true' <<<"$chat")" http://127.0.0.1:$P/v1/chat/completions >"$TMP/csse"
check_eq "chat stream object" "$(grep '^data: {' "$TMP/csse" | head -1 | sed 's/^data: //' | jq -r .object)" \
    chat.completion.chunk
check_eq "chat stream first delta has the role" "$(grep '^data: {' "$TMP/csse" | head -1 | sed 's/^data: //' |
    jq -r '.choices[0].delta.role')" assistant
cstext=$(grep '^data: {' "$TMP/csse" | sed 's/^data: //' | jq -j '.choices[0].delta.content // ""')
check_eq "chat stream content equals non-stream content" "$cstext" "$ctext"
check_eq "chat stream ends with [DONE]" "$(grep '^data: ' "$TMP/csse" | tail -1)" "data: [DONE]"
parts='{"messages":[{"role":"user","content":[{"type":"text","text":"How many clips?"}]}],"max_tokens":2}'
check_eq "chat content as parts is 200" "$(post $P /v1/chat/completions "$parts" | cut -d' ' -f1)" 200

# ---- bad inputs: 4xx with a message naming the field
expect_4xx() { # expect_4xx DESCRIPTION WANT_CODE PATH BODY NEEDLE [curl args]
    local what=$1 want=$2 path=$3 body=$4 needle=$5
    shift 5
    local r
    r=$(post $P "$path" "$body" "$@")
    local code=${r%% *} json=${r#* }
    local msg
    msg=$(jq -r '.error.message' <<<"$json" 2>/dev/null)
    if [[ $code == "$want" && $msg == *"$needle"* ]]; then ok "$what → $code: $msg"; else bad "$what: got $code $json"; fi
}
BAD=0
bad_req() { BAD=$((BAD + 1)); expect_4xx "$@"; }
bad_req "malformed JSON" 400 /v1/completions '{"prompt": "x",' "invalid JSON"
bad_req "empty body" 400 /v1/completions '' "empty"
bad_req "body not an object" 400 /v1/completions '[1,2]' "JSON object"
bad_req "prompt missing" 400 /v1/completions '{"max_tokens":3}' "prompt"
bad_req "prompt wrong type" 400 /v1/completions '{"prompt":42}' "prompt"
bad_req "prompt batch of mixed kinds" 400 /v1/completions '{"prompt":["a",[1,2]]}' "prompt[1]"
bad_req "prompt token id negative" 400 /v1/completions '{"prompt":[1,-2]}' "prompt[1]"
bad_req "prompt empty array" 400 /v1/completions '{"prompt":[]}' "prompt"
bad_req "stop wrong type" 400 /v1/completions '{"prompt":"x","stop":5}' "stop"
bad_req "logprobs out of range" 400 /v1/completions '{"prompt":"x","logprobs":21}' "logprobs"
bad_req "seed wrong type" 400 /v1/completions '{"prompt":"x","seed":"s"}' "seed"
bad_req "stream with n = 2" 400 /v1/completions '{"prompt":"x","n":2,"stream":true}' "stream"
bad_req "max_tokens wrong type" 400 /v1/completions '{"prompt":"x","max_tokens":"5"}' "max_tokens"
bad_req "max_tokens zero" 400 /v1/completions '{"prompt":"x","max_tokens":0}' "max_tokens"
bad_req "max_tokens beyond max-model-len" 400 /v1/completions '{"prompt":"x","max_tokens":600}' "maximum context length"
bad_req "n = 0" 400 /v1/completions '{"prompt":"x","n":0}' "n:"
bad_req "stream wrong type" 400 /v1/completions '{"prompt":"x","stream":"yes"}' "stream"
bad_req "temperature wrong type" 400 /v1/completions '{"prompt":"x","temperature":"hot"}' "temperature"
bad_req "unknown model" 400 /v1/completions '{"model":"gpt-9","prompt":"x"}' "model"
bad_req "model wrong type" 400 /v1/completions '{"model":7,"prompt":"x"}' "model"
bad_req "kv_transfer_params wrong type" 400 /v1/completions '{"prompt":"x","kv_transfer_params":"x"}' "kv_transfer_params"
bad_req "kv_transfer_params field wrong type" 400 /v1/completions \
    '{"prompt":"x","kv_transfer_params":{"do_remote_decode":true,"remote_block_ids":["a"]}}' "remote_block_ids"
bad_req "chat messages missing" 400 /v1/chat/completions '{"max_tokens":2}' "messages"
bad_req "chat message role wrong type" 400 /v1/chat/completions '{"messages":[{"role":1,"content":"x"}]}' \
    "messages[0].role"
bad_req "chat content wrong type" 400 /v1/chat/completions '{"messages":[{"role":"user","content":5}]}' \
    "messages[0].content"
bad_req "X-Request-Id too long" 400 /v1/completions '{"prompt":"x"}' "X-Request-Id" \
    -H "X-Request-Id: $(head -c 700 /dev/zero | tr '\0' a)"
code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$P/v1/completions)
check_eq "GET /v1/completions is 405" "$code" 405
code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$P/nope)
check_eq "unknown route is 404" "$code" 404
head -c 17000000 /dev/zero | tr '\0' ' ' >"$TMP/big"
code=$(curl -s -o /dev/null -w '%{http_code}' --data-binary @"$TMP/big" http://127.0.0.1:$P/v1/completions)
check_eq "17 MB body is 413" "$code" 413
BAD=$((BAD + 1))
check_eq "node alive after bad inputs" "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$P/health)" 200
check_eq "failed requests counted" "$(metric $P 'pdlink_requests_total{role="both",status="failed"}')" "$BAD"
check_eq "no block leaked (free == total)" "$(metric $P pdlink_free_blocks)" "$(metric $P pdlink_total_blocks)"

# ---- determinism across TP sizes, layouts, and the seed
start_node B --model tiny -tp 1 --seed 7 || exit 1
start_node C --model tiny -tp 8 --seed 7 --kv-layout nhd --block-size 4 || exit 1
start_node D --model tiny -tp 16 --seed 7 --kv-interleaved --block-size 128 || exit 1
start_node E --model tiny -tp 4 --seed 8 || exit 1
check_eq "TP1 output equals TP4 output" "$(completion_text $B_PORT "$PROMPT" 8)" "$text"
check_eq "TP8 NHD block 4 output equals TP4 output" "$(completion_text $C_PORT "$PROMPT" 8)" "$text"
check_eq "TP16 (replicated heads) interleaved block 128 output equals TP4 output" \
    "$(completion_text $D_PORT "$PROMPT" 8)" "$text"
check "another seed gives another output" [ "$(completion_text $E_PORT "$PROMPT" 8)" != "$text" ]

# ---- KV cache exhaustion
start_node F --model tiny --num-gpu-blocks 2 --block-size 4 --kv-wait-timeout 0 || exit 1
expect_P=$P
P=$F_PORT
expect_4xx "prompt larger than the KV cache → 503" 503 /v1/completions "$(jq -cn --arg p "$PROMPT" '{prompt:$p}')" \
    "KV blocks"
P=$expect_P

# ---- big preset, fast enough
start_node G --model meta-llama/Llama-3.1-8B-Instruct -tp 8 --num-gpu-blocks 64 --block-size 16 || exit 1
long=$(for i in $(seq 1 300); do printf 'w%d ' $i; done)
t0=$(date +%s%N)
r=$(post $G_PORT /v1/completions "$(jq -cn --arg p "$long" '{prompt:$p, max_tokens:4}')")
t1=$(date +%s%N)
check_eq "llama-3.1-8b TP8, 301-token prompt is 200" "${r%% *}" 200
echo "  llama-3.1-8b TP8: 301 tokens (128 KiB of KV per token written and verified) in $(((t1 - t0) / 1000000)) ms"

# ---- clean shutdown
stop_node A
check_eq "SIGTERM exits 0" "$STOP_RC" 0
check "shutdown logged" grep -q "shutting down" "$TMP/A.log"
check "startup line names model, TP and KV bytes" grep -q "ready: model tiny.*TP 4.*KV .*/rank" "$TMP/A.log"
finish
