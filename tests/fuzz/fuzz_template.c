/*
 * libFuzzer target for the chat-template renderer: arbitrary bytes are parsed as a
 * template and rendered against a fixed small chat context (messages with a tool call,
 * tools, special tokens). Property: parse and render never crash, leak or overrun; they
 * return output or an error, and an error always carries a message.
 * Built and run by tests/fuzz/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tmpl.h"

static cJSON *ctx;

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9 <b>\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5, \"y\": [true, null]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\":"
    " {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\","
    " \"eos_token\": \"</s>\", \"n\": 3}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    ctx = cJSON_Parse(CONTEXT);
    if (!ctx) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    struct err e = {{0}};
    struct tmpl *t = tmpl_parse((const char *)data, size, &e);
    if (!t) {
        if (!e.msg[0]) abort(); /* a failure must say why */
        return 0;
    }
    size_t len = 0;
    char *out = tmpl_render(t, ctx, &len, &e);
    if (!out && !e.msg[0]) abort();
    if (out && strlen(out) > len) abort(); /* NUL-terminated at len (text may hold NULs) */
    free(out);
    tmpl_destroy(t);
    return 0;
}
