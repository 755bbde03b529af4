#!/usr/bin/env bash
# Transport test of `pagoda serve`: curl over HTTP/1.1, h2c (prior knowledge and Upgrade)
# and h2 over TLS (ALPN), h2load pushing many concurrent streams, /metrics through
# promtool, and a graceful shutdown that lets an in-flight stream finish.
# usage: transport.sh PAGODA TESTDATA
set -euo pipefail
PAGODA=$1
MODEL=$2/models/llama-tiny
TMP=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

start() { # start [serve options...]: sets PID and BASE
  "$PAGODA" serve --model "$MODEL" --port 0 --threads 2 --http-threads 2 "$@" 2>"$TMP/log" &
  PID=$!
  for _ in $(seq 100); do
    PORT=$(grep -o 'listening on [a-z]*://127.0.0.1:[0-9]*' "$TMP/log" | grep -o '[0-9]*$' || true)
    grep -q ready "$TMP/log" && [ -n "$PORT" ] && break
    sleep 0.1
  done
  [ -n "$PORT" ] || fail "server did not start: $(cat "$TMP/log")"
}
stop() { # SIGTERM, expect exit status 0
  kill -TERM "$PID"
  local rc=0
  wait "$PID" || rc=$?
  PID=
  [ "$rc" -eq 0 ] || fail "server exited with $rc: $(cat "$TMP/log")"
}

start
BASE=http://127.0.0.1:$PORT
BODY='{"model":"llama-tiny","prompt":[1,2,3],"max_tokens":6,"temperature":0,"ignore_eos":true}'

# HTTP/1.1 with keep-alive: two requests on one connection.
out=$(curl -sS --http1.1 -w '\n%{http_version} %{http_code} %{num_connects}\n' \
  "$BASE/v1/models" -H 'content-type: application/json' --next -sS --http1.1 \
  -w '\n%{http_version} %{http_code} %{num_connects}\n' "$BASE/v1/completions" -d "$BODY")
echo "$out" | grep -qx '1.1 200 1' || fail "HTTP/1.1: $out"
echo "$out" | grep -qx '1.1 200 0' || fail "HTTP/1.1 keep-alive: $out"
H1=$(curl -sS --http1.1 "$BASE/v1/completions" -d "$BODY" | sed 's/"id":"[^"]*","object":"text_completion","created":[0-9]*//')

# h2c with prior knowledge, and the same answer as over HTTP/1.1.
v=$(curl -sS --http2-prior-knowledge -o "$TMP/h2" -w '%{http_version} %{http_code}' \
  "$BASE/v1/completions" -d "$BODY")
[ "$v" = "2 200" ] || fail "h2c prior knowledge: $v"
H2=$(sed 's/"id":"[^"]*","object":"text_completion","created":[0-9]*//' "$TMP/h2")
[ "$H1" = "$H2" ] || fail "HTTP/1.1 and h2 answers differ: $H1 / $H2"

# h2c by Upgrade (curl upgrades a GET).
v=$(curl -sS --http2 -o /dev/null -w '%{http_version} %{http_code}' "$BASE/health")
[ "$v" = "2 200" ] || fail "h2c upgrade: $v"

# SSE over h2c: events end with [DONE].
curl -sSN --http2-prior-knowledge "$BASE/v1/chat/completions" \
  -d '{"model":"llama-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}' \
  >"$TMP/sse"
[ "$(tail -n 2 "$TMP/sse" | head -n 1)" = "data: [DONE]" ] || fail "SSE tail: $(tail -3 "$TMP/sse")"
grep -q '"finish_reason":"' "$TMP/sse" || fail "SSE without finish_reason"

# h2load: 400 requests over 8 connections x 16 concurrent streams, all 2xx.
echo "$BODY" >"$TMP/body.json"
h2load -n 400 -c 8 -m 16 -d "$TMP/body.json" -H 'content-type: application/json' \
  "$BASE/v1/completions" >"$TMP/h2load" 2>&1 || true
grep -q 'status codes: 400 2xx, 0 3xx, 0 4xx, 0 5xx' "$TMP/h2load" || fail "h2load: $(cat "$TMP/h2load")"

# /metrics passes promtool and counts what was served. promtool's one complaint allowed is
# its naming lint about the colon of vLLM's names (vllm:...), which vLLM's own output draws.
curl -sS "$BASE/metrics" >"$TMP/metrics"
if ! lint=$(promtool check metrics <"$TMP/metrics" 2>&1); then
  other=$(grep -v "^vllm:[a-z0-9_]* metric names should not contain ':'$" <<<"$lint" | grep -v '^$' || true)
  [ -z "$other" ] || fail "promtool: $lint"
  grep -q "^vllm:num_requests_waiting metric names" <<<"$lint" || fail "promtool: $lint"
fi
grep -q '^pagoda_http_requests_total{route="/v1/completions",status="200"} 40[3-9]$' "$TMP/metrics" ||
  fail "request counter: $(grep http_requests "$TMP/metrics")"
grep -q '^pagoda_time_to_first_token_seconds_count [1-9]' "$TMP/metrics" || fail "ttft histogram"

# An HTTP/1.1 client that hangs up on a long non-streaming request: the request is aborted
# and its KV blocks freed within a moment, not when it would have finished.
curl -s --http1.1 --max-time 0.5 "$BASE/v1/completions" \
  -d '{"model":"llama-tiny","prompt":[7,8,9],"max_tokens":4000,"temperature":0,"ignore_eos":true}' \
  >/dev/null && fail "the long request finished within 0.5 s"
ok=
for _ in $(seq 20); do
  curl -sS "$BASE/metrics" >"$TMP/metrics"
  if grep -q '^pagoda_requests_finished_total{reason="abort"} 1$' "$TMP/metrics" &&
    grep -q '^pagoda_kv_blocks{state="used"} 0$' "$TMP/metrics"; then ok=1; break; fi
  sleep 0.1
done
[ -n "$ok" ] || fail "hung-up HTTP/1.1 request not aborted: $(grep -E 'finished_total|kv_blocks' "$TMP/metrics")"

# Graceful shutdown: a stream in flight at SIGTERM still ends with [DONE]; new
# connections are refused; exit status 0.
curl -sSN "$BASE/v1/completions" -d '{"model":"llama-tiny","prompt":[5,6,7],"max_tokens":400,"temperature":0,"ignore_eos":true,"stream":true}' >"$TMP/long" &
CURL=$!
for _ in $(seq 100); do [ -s "$TMP/long" ] && break; sleep 0.05; done
[ -s "$TMP/long" ] || fail "long stream did not start"
stop
wait "$CURL" || fail "the in-flight stream failed"
[ "$(tail -n 2 "$TMP/long" | head -n 1)" = "data: [DONE]" ] || fail "in-flight stream cut: $(tail -c 300 "$TMP/long")"
[ "$(grep -c '"finish_reason":"length"' "$TMP/long")" -eq 1 ] || fail "in-flight stream did not finish by length"
curl -s -o /dev/null "$BASE/health" && fail "still accepting after shutdown"

# h2 over TLS with ALPN.
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost \
  -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null
start --tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem"
v=$(curl -sSk --http2 -o "$TMP/tls" -w '%{http_version} %{http_code}' \
  "https://127.0.0.1:$PORT/v1/completions" -d "$BODY")
[ "$v" = "2 200" ] || fail "h2 over TLS: $v"
v=$(curl -sSk --http1.1 -o /dev/null -w '%{http_version} %{http_code}' "https://127.0.0.1:$PORT/health")
[ "$v" = "1.1 200" ] || fail "HTTP/1.1 over TLS: $v"
stop
echo "transport: all checks passed"
