/*
 * /metrics of the KV tiers: with the host tier alone, each tier metric has one
 * tier="host" line with the exact figures and no disk line (nor the disk-only metrics:
 * bypasses, writer time, faults); with both tiers, the host line comes before the disk
 * line under one HELP/TYPE head; a hybrid model's snapshots per tier (held, lookups, hits),
 * the host's snapshot slots' drops and evictions counted with its blocks'.
 */
#include <string.h>

#include "http/json.h"
#include "http/metrics.h"
#include "sched/engine.h"
#include "test_util.h"

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

int main(void)
{
    struct http_metrics *m = http_metrics_create("m");
    static struct engine_stats st;
    st.host_on = 1;
    st.host.blocks = 3;
    st.host.slots = 10;
    st.host.load_blocks = 2;
    st.host.stored_blocks = 5;
    st.host.store_dropped = 1;
    st.host.evicted_blocks = 4;
    st.host_used_bytes = 3 * 4096;
    st.host_budget_bytes = 10 * 4096;
    st.host_load_bytes = 2 * 4096;
    st.host_store_bytes = 5 * 4096;
    st.host_query_tokens = 64;
    st.host_hit_tokens = 32;
    st.host_load_seconds = 0.25;
    st.host_store_seconds = 0.5;
    st.host_snap.blocks = 2; /* a hybrid model's snapshots */
    st.host_snap.slots = 3;
    st.host_snap.store_dropped = 2;
    st.host_snap.evicted_blocks = 1;
    st.host_state_queries = 5;
    st.host_state_hits = 1;
    struct http_buf o = {0};
    http_metrics_render(m, &st, &o);
    http_buf_append(&o, "", 1);
    const char *t = o.p;
    static const char *const want[] = {
        "pagoda_kv_tier_blocks{tier=\"host\"} 3\n",
        "pagoda_kv_tier_bytes{tier=\"host\",kind=\"used\"} 12288\n",
        "pagoda_kv_tier_bytes{tier=\"host\",kind=\"budget\"} 40960\n",
        "pagoda_kv_tier_query_tokens_total{tier=\"host\"} 64\n",
        "pagoda_kv_tier_hit_tokens_total{tier=\"host\"} 32\n",
        "pagoda_kv_tier_load_bytes_total{tier=\"host\"} 8192\n",
        "pagoda_kv_tier_load_seconds_total{tier=\"host\"} 0.250000\n",
        "pagoda_kv_tier_store_bytes_total{tier=\"host\"} 20480\n",
        "pagoda_kv_tier_store_seconds_total{tier=\"host\"} 0.500000\n",
        "pagoda_kv_tier_store_dropped_total{tier=\"host\"} 3\n",
        "pagoda_kv_tier_evicted_blocks_total{tier=\"host\"} 5\n",
        "pagoda_kv_tier_state_snapshots{tier=\"host\"} 2\n",
        "pagoda_kv_tier_state_queries_total{tier=\"host\"} 5\n",
        "pagoda_kv_tier_state_hits_total{tier=\"host\"} 1\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK(strstr(t, want[i]), "missing %s", want[i]);
    CHECK(!strstr(t, "tier=\"disk\""), "no disk line without a disk tier");
    CHECK(!strstr(t, "pagoda_kv_tier_bypasses_total") && !strstr(t, "pagoda_kv_tier_faults_total"),
          "no disk-only metric");

    st.tier_on = 1;
    st.tier.disk.blocks = 7;
    o.len = 0;
    http_metrics_render(m, &st, &o);
    http_buf_append(&o, "", 1);
    t = o.p;
    const char *h = strstr(t, "pagoda_kv_tier_blocks{tier=\"host\"} 3\n");
    const char *d = strstr(t, "pagoda_kv_tier_blocks{tier=\"disk\"} 7\n");
    CHECK(h && d && h < d, "host line, then disk line");
    CHECK(count(t, "# TYPE pagoda_kv_tier_blocks ") == 1, "one head per metric");
    CHECK(count(t, "pagoda_kv_tier_faults_total{tier=\"disk\"") == 3, "disk faults by kind");
    st.tier.disk.states = 4;
    st.tier_state_queries = 4;
    st.tier_state_hits = 3;
    o.len = 0;
    http_metrics_render(m, &st, &o);
    http_buf_append(&o, "", 1);
    t = o.p;
    static const char *const snaps[] = {
        "pagoda_kv_tier_state_snapshots{tier=\"host\"} 2\n"
        "pagoda_kv_tier_state_snapshots{tier=\"disk\"} 4\n",
        "pagoda_kv_tier_state_queries_total{tier=\"host\"} 5\n"
        "pagoda_kv_tier_state_queries_total{tier=\"disk\"} 4\n",
        "pagoda_kv_tier_state_hits_total{tier=\"host\"} 1\n"
        "pagoda_kv_tier_state_hits_total{tier=\"disk\"} 3\n",
    };
    for (size_t i = 0; i < sizeof snaps / sizeof *snaps; i++)
        CHECK(strstr(t, snaps[i]), "missing %s", snaps[i]);
    CHECK(count(t, "# TYPE pagoda_kv_tier_state_snapshots ") == 1, "one head");
    http_buf_dispose(&o);
    http_metrics_destroy(m);
    TEST_DONE();
}
