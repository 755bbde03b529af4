/* Prompt-lookup drafts (vLLM's ngram method): continue the context as it went on after an
 * earlier occurrence of its last few tokens. */
#include <string.h>

#include "sched/spec.h"

int spec_ngram_propose(const int32_t *tokens, int n_tokens, int min, int max, int k, int32_t *out)
{
    if (k <= 0 || min < 1) return 0;
    for (int n = max < n_tokens - 1 ? max : n_tokens - 1; n >= min; n--) {
        const int32_t *tail = tokens + n_tokens - n;
        /* latest first: an earlier match at start s is followed by tokens[s + n ...] */
        for (int s = n_tokens - n - 1; s >= 0; s--) {
            if (tokens[s + n - 1] != tail[n - 1] ||
                memcmp(tokens + s, tail, sizeof(int32_t) * (size_t)n))
                continue;
            int avail = n_tokens - (s + n), m = k < avail ? k : avail;
            memcpy(out, tokens + s + n, sizeof(int32_t) * (size_t)m);
            return m;
        }
    }
    return 0;
}
