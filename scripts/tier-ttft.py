#!/usr/bin/env python3
"""TTFT of a long shared prefix: cold, from the pool, and from a tier below it.

    scripts/tier-ttft.py URL PREFIX_LEN PUSH_OUT

Against a pagoda server at URL (completions on token ids, greedy, max_tokens 1, so the
response time is the time to the first token): prompt A (PREFIX_LEN ids and a 16-id
suffix) cold; A again with another suffix (a pool hit); PUSH_OUT other prompts of the
same length, which push A's blocks out of a pool smaller than them; A with a third
suffix (a tier hit, or cold when there is no tier). Prints each time, the cached tokens
the server reports and the ratio of the tier hit to the cold run.
"""
import json
import sys
import time
import urllib.request


def complete(url, ids):
    body = json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.load(r)
    dt = time.monotonic() - t0
    cached = out["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return dt, cached, out["choices"][0]["text"]


def ids(n, seed):
    return [3 + (i * 7919 + 13 + seed * 104729) % 100000 for i in range(n)]


def main():
    url, n, push = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    prefix = ids(n, 0)
    cold, c0, t0 = complete(url, prefix + ids(16, 1000))
    print(f"cold:      {cold:8.3f} s  cached {c0}")
    pool, c1, _ = complete(url, prefix + ids(16, 1001))
    print(f"pool hit:  {pool:8.3f} s  cached {c1}")
    for k in range(push):
        complete(url, ids(n + 16, k + 1))
    tier, c2, _ = complete(url, prefix + ids(16, 1002))
    print(f"tier hit:  {tier:8.3f} s  cached {c2}")
    print(f"tier / cold: {tier / cold:.3f}")


if __name__ == "__main__":
    main()
