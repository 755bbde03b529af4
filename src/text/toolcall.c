/*
 * Tool calls in output text, read incrementally (see toolcall.h). The parser holds the
 * text it cannot decide yet (a possible start of a tag, an unfinished JSON key) and moves
 * through states as markup is recognised. JSON is read one byte at a time with a small
 * scanner that knows only nesting, strings and the keys of the call object, so a push
 * costs O(bytes pushed) plus, for the tag searches, O(held * tag length).
 */
#include "text/toolcall_impl.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void tcall_str_append(struct tcall_str *s, const char *p, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        s->p = xrealloc(s->p, s->cap);
    }
    if (n) memcpy(s->p + s->len, p, n);
    s->len += n;
    s->p[s->len] = 0;
}

void tcall_str_dispose(struct tcall_str *s)
{
    free(s->p);
    memset(s, 0, sizeof *s);
}

static const char *const names[] = {"",        "hermes", "qwen3_xml", "llama3_json",
                                    "mistral", "gemma4", "harmony"};

int tcall_format_from_name(const char *name)
{
    for (int i = 1; i < (int)(sizeof names / sizeof *names); i++)
        if (!strcmp(name, names[i])) return i;
    /* vLLM's name for the Qwen3-Coder format */
    if (!strcmp(name, "qwen3_coder")) return TCALL_QWEN3_XML;
    return -1;
}

const char *tcall_format_name(enum tcall_format f)
{
    return names[f];
}

enum tcall_format tcall_format_detect(const char *src)
{
    if (!src) return TCALL_NONE;
    if (strstr(src, "<tool_call>") && strstr(src, "<function=")) return TCALL_QWEN3_XML;
    if (strstr(src, "<tool_call>")) return TCALL_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return TCALL_MISTRAL;
    if (strstr(src, "<|tool_call>")) return TCALL_GEMMA4;
    if (strstr(src, "<|channel|>") && strstr(src, "<|message|>")) return TCALL_HARMONY;
    if (strstr(src, "<|python_tag|>") || strstr(src, "ipython")) return TCALL_LLAMA3_JSON;
    return TCALL_NONE;
}

const char *tcall_format_trigger(enum tcall_format f)
{
    switch (f) {
    case TCALL_HERMES:
    case TCALL_QWEN3_XML:
        return "<tool_call>";
    case TCALL_MISTRAL:
        return "[TOOL_CALLS]";
    case TCALL_GEMMA4:
        return "<|tool_call>";
    default:
        return NULL;
    }
}

const char *const *tcall_format_tags(enum tcall_format f)
{
    static const char *const hermes[] = {"<tool_call>", "</tool_call>", NULL};
    static const char *const llama[] = {"<|python_tag|>", NULL};
    static const char *const mistral[] = {"[TOOL_CALLS]", "[ARGS]", NULL};
    static const char *const gemma[] = {"<|tool_call>", "<tool_call|>", GEMMA_QUOTE, NULL};
    static const char *const none[] = {NULL};
    switch (f) {
    case TCALL_HERMES:
    case TCALL_QWEN3_XML:
        return hermes;
    case TCALL_LLAMA3_JSON:
        return llama;
    case TCALL_MISTRAL:
        return mistral;
    case TCALL_GEMMA4:
        return gemma;
    case TCALL_HARMONY:
        return harmony_tags;
    default:
        return none;
    }
}

/* ---- the parser ----------------------------------------------------------------------- */

enum { E_KEY, E_COLON, E_VALUE, E_SCALAR, E_COMMA };
enum { F_OTHER, F_NAME, F_ARGS };
enum { JR_MORE, JR_DONE, JR_BAD };

struct tcall_parser *tcall_parser_create(enum tcall_format f, const cJSON *tools)
{
    struct tcall_parser *p = xcalloc(1, sizeof *p);
    p->f = f;
    p->tools = tools;
    p->st = f == TCALL_LLAMA3_JSON ? ST_LLAMA_START : f == TCALL_NONE ? ST_PLAIN : ST_TEXT;
    tcall_str_append(&p->held, "", 0); /* never NULL: held.p + i is always defined */
    tcall_str_append(&p->raw, "", 0);
    harmony_init(&p->h, 0);
    return p;
}

void tcall_parser_destroy(struct tcall_parser *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        tcall_str_dispose(&p->calls[i].args);
    }
    free(p->calls);
    tcall_str_dispose(&p->held);
    tcall_str_dispose(&p->raw);
    tcall_str_dispose(&p->j.key);
    tcall_str_dispose(&p->j.name);
    harmony_dispose(&p->h);
    free(p);
}

int tcall_parser_n_calls(const struct tcall_parser *p)
{
    return p->n_calls;
}

const struct tcall *tcall_parser_call(const struct tcall_parser *p, int i)
{
    return &p->calls[i];
}

struct tcall *tc_call_open(struct tcall_parser *p)
{
    if (p->n_calls == p->cap_calls) {
        p->cap_calls = p->cap_calls ? p->cap_calls * 2 : 4;
        p->calls = xrealloc(p->calls, sizeof *p->calls * (size_t)p->cap_calls);
    }
    struct tcall *c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof *c);
    tcall_str_append(&c->args, "", 0); /* args.p is never NULL */
    return c;
}

void tc_set_name(struct tcall *c, const char *s, size_t n)
{
    while (n && (*s == ' ' || *s == '\n' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t')) n--;
    c->name = xmalloc(n + 1);
    memcpy(c->name, s, n);
    c->name[n] = 0;
}

/* The open call's markup proved malformed before its name: it was content after all. */
void tc_call_abandon(struct tcall_parser *p, struct tcall_str *content)
{
    struct tcall *c = tc_cur(p);
    tcall_str_append(content, p->raw.p, p->raw.len);
    free(c->name);
    tcall_str_dispose(&c->args);
    p->n_calls--;
    p->raw.len = 0;
    p->in_array = 0;
    p->st = p->f == TCALL_LLAMA3_JSON ? ST_PLAIN : ST_TEXT;
}

void tc_call_close(struct tcall_parser *p)
{
    if (!tc_cur(p)->args.len) tc_puts(&tc_cur(p)->args, "{}"); /* no arguments given */
    tc_cur(p)->done = 1;
    p->raw.len = 0;
    p->after_call = 1;
}

static void json_begin(struct tcall_parser *p, int bare)
{
    struct tc_jread *j = &p->j;
    j->bare = bare;
    j->depth = j->in_str = j->esc = j->in_args = 0;
    j->expect = E_KEY;
    j->field = F_OTHER;
    j->key.len = j->name.len = 0;
    if (!bare) tc_call_open(p);
    p->st = ST_OBJ;
}

/* The end of a string at depth 1 of a call object: a key, or the value of a field. */
static void json_str_end(struct tc_jread *j, struct tcall *c)
{
    if (j->expect == E_KEY) {
        j->expect = E_COLON;
        return;
    }
    if (j->field == F_NAME && !c->name) tc_set_name(c, j->name.p ? j->name.p : "", j->name.len);
    j->in_args = 0;
    j->expect = E_COMMA;
}

static int key_is(const struct tc_jread *j, const char *k)
{
    return j->key.len == strlen(k) && !memcmp(j->key.p, k, j->key.len);
}

/* One byte of a JSON call object (or bare arguments). */
static int json_byte(struct tc_jread *j, struct tcall *c, char ch)
{
    if (j->in_str) {
        if (j->in_args) tcall_str_append(&c->args, &ch, 1);
        if (!j->esc && ch == '"') {
            j->in_str = 0;
            if (j->depth == 1 && !j->bare) json_str_end(j, c);
            return JR_MORE;
        }
        j->esc = !j->esc && ch == '\\';
        if (j->depth == 1 && !j->bare) {
            if (j->expect == E_KEY)
                tcall_str_append(&j->key, &ch, 1);
            else if (j->field == F_NAME)
                tcall_str_append(&j->name, &ch, 1);
        }
        return JR_MORE;
    }
    if (tc_is_ws(ch)) {
        if (j->depth == 1 && !j->bare && j->expect == E_SCALAR) j->in_args = 0, j->expect = E_COMMA;
        return JR_MORE;
    }
    if (j->depth == 0) {
        if (ch != '{') return JR_BAD;
        j->depth = 1;
        j->expect = E_KEY;
        if (j->bare) j->in_args = 1, tcall_str_append(&c->args, &ch, 1);
        return JR_MORE;
    }
    if (j->bare || j->depth > 1) {
        if (j->in_args) tcall_str_append(&c->args, &ch, 1);
        if (ch == '"') {
            j->in_str = 1;
        } else if (ch == '{' || ch == '[') {
            j->depth++;
        } else if (ch == '}' || ch == ']') {
            if (--j->depth == 0) return JR_DONE; /* bare: the arguments closed */
            if (j->depth == 1 && !j->bare) j->in_args = 0, j->expect = E_COMMA;
        }
        return JR_MORE;
    }
    /* depth 1 of the call object */
    if (j->expect == E_SCALAR) {
        if (ch != ',' && ch != '}') {
            if (j->in_args) tcall_str_append(&c->args, &ch, 1);
            return JR_MORE;
        }
        j->in_args = 0; /* the scalar ended at a comma or the object's end */
        j->expect = E_COMMA;
    }
    switch (j->expect) {
    case E_COMMA:
        if (ch == ',') {
            j->expect = E_KEY;
            return JR_MORE;
        }
        return ch == '}' ? (j->depth = 0, JR_DONE) : JR_BAD;
    case E_KEY:
        if (ch == '"') {
            j->in_str = 1;
            j->key.len = 0;
            return JR_MORE;
        }
        return ch == '}' ? (j->depth = 0, JR_DONE) : JR_BAD;
    case E_COLON:
        if (ch != ':') return JR_BAD;
        j->expect = E_VALUE;
        j->field = key_is(j, "name")                                   ? F_NAME
                   : key_is(j, "arguments") || key_is(j, "parameters") ? F_ARGS
                                                                       : F_OTHER;
        return JR_MORE;
    default: /* E_VALUE: the first byte of a field's value */
        j->in_args = j->field == F_ARGS && c->args.len == 0;
        if (j->in_args) tcall_str_append(&c->args, &ch, 1);
        if (ch == '"') {
            j->in_str = 1;
            j->name.len = 0;
        } else if (ch == '{' || ch == '[') {
            j->depth++;
        } else {
            j->expect = E_SCALAR;
        }
        return JR_MORE;
    }
}

/* ST_OBJ: feeds held bytes to the scanner until the value closes or more text is needed. */
static int step_obj(struct tcall_parser *p, struct tcall_str *content)
{
    struct tcall *c = tc_cur(p);
    size_t i = 0;
    int r = JR_MORE;
    while (i < p->held.len && r == JR_MORE) r = json_byte(&p->j, c, p->held.p[i++]);
    if (r == JR_BAD) i--; /* the offending byte is read again as what follows */
    tcall_str_append(&p->raw, p->held.p, i);
    tc_consume(p, i);
    if (r == JR_MORE) return 0;
    if (!c->name) {
        tc_call_abandon(p, content);
        return 1;
    }
    tc_call_close(p);
    p->st = ST_AFTER_OBJ;
    return 1;
}

/* After a JSON call: hermes wants </tool_call>, llama3_json a ';' before another call,
 * mistral's array a ',' or its ']'. Anything else ends the calls: it is content again. */
static int step_after_obj(struct tcall_parser *p, int at_end)
{
    size_t i = 0;
    while (i < p->held.len && tc_is_ws(p->held.p[i])) i++;
    tc_consume(p, i);
    if (!p->held.len) return 0;
    const char *h = p->held.p;
    size_t n = p->held.len;
    if (p->f == TCALL_HERMES) {
        const char *end = "</tool_call>";
        if (tc_starts(h, n, end) && n < strlen(end) && !at_end) return 0;
        if (tc_starts(h, n, end) && n >= strlen(end)) tc_consume(p, strlen(end));
        p->st = ST_TEXT;
        return 1;
    }
    if (p->f == TCALL_LLAMA3_JSON) {
        char c0 = h[0];
        if (c0 == ';') tc_consume(p, 1);
        if (c0 == ';' || c0 == '{') {
            p->st = ST_LLAMA_START;
            return 1;
        }
        p->st = ST_PLAIN;
        return 1;
    }
    /* mistral */
    if (p->in_array && h[0] == ',') {
        tc_consume(p, 1);
        json_begin(p, 0);
        return 1;
    }
    if (p->in_array && h[0] == ']') tc_consume(p, 1);
    p->in_array = 0;
    p->st = ST_TEXT;
    return 1;
}

/* ST_TEXT: content up to the start tag. */
static int step_text(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    const char *tag = tcall_format_trigger(p->f);
    if (p->after_call) {
        size_t i = 0;
        while (i < p->held.len && tc_is_ws(p->held.p[i])) i++;
        tc_consume(p, i);
        if (!p->held.len) return 0;
        p->after_call = 0;
    }
    long k = tc_find(p->held.p, p->held.len, tag);
    if (k < 0) {
        size_t keep = at_end ? 0 : tc_partial(p->held.p, p->held.len, tag);
        tcall_str_append(content, p->held.p, p->held.len - keep);
        tc_consume(p, p->held.len - keep);
        return 0;
    }
    tcall_str_append(content, p->held.p, (size_t)k);
    tc_consume(p, (size_t)k + strlen(tag));
    p->raw.len = 0;
    tc_puts(&p->raw, tag);
    if (p->f == TCALL_HERMES) {
        json_begin(p, 0);
    } else if (p->f == TCALL_QWEN3_XML) {
        tc_call_open(p);
        p->st = ST_X_FUNC;
    } else if (p->f == TCALL_GEMMA4) {
        tc_call_open(p);
        p->st = ST_G_NAME;
    } else {
        tc_call_open(p); /* mistral: the array or the name decides how it is read */
        p->st = ST_M_OPEN;
    }
    return 1;
}

/* llama3_json: a call when the text starts with '{' or <|python_tag|>. */
static int step_llama_start(struct tcall_parser *p, int at_end)
{
    static const char tag[] = "<|python_tag|>";
    size_t i = 0;
    while (i < p->held.len && tc_is_ws(p->held.p[i])) i++;
    const char *h = p->held.p + i;
    size_t n = p->held.len - i;
    if (!n) {
        if (at_end) p->st = ST_PLAIN;
        return at_end;
    }
    if (h[0] == '{') {
        tc_consume(p, i);
        json_begin(p, 0);
        p->raw.len = 0;
        return 1;
    }
    if (tc_starts(h, n, tag) && n >= sizeof tag - 1) {
        tc_consume(p, i + sizeof tag - 1);
        p->raw.len = 0;
        tc_puts(&p->raw, tag);
        return 1; /* the call's '{' follows */
    }
    if (tc_starts(h, n, tag) && !at_end) return 0;
    p->st = ST_PLAIN;
    return 1;
}

/* mistral after [TOOL_CALLS]: '[' opens an array of call objects, else a name. */
static int step_m_open(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    size_t i = 0;
    while (i < p->held.len && tc_is_ws(p->held.p[i])) i++;
    tcall_str_append(&p->raw, p->held.p, i);
    tc_consume(p, i);
    if (!p->held.len) {
        if (at_end) tc_call_abandon(p, content);
        return at_end;
    }
    if (p->held.p[0] == '[') {
        tcall_str_append(&p->raw, "[", 1);
        tc_consume(p, 1);
        tcall_str_dispose(&tc_cur(p)->args);
        p->n_calls--; /* json_begin opens each object's call */
        p->in_array = 1;
        json_begin(p, 0);
        return 1;
    }
    p->st = ST_M_NAME;
    return 1;
}

static int step_m_name(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    /* a name is short and has no markup: a '[' other than [ARGS], a '{' or a newline before
     * [ARGS] means this was not a call (checked on the same span whatever the chunking) */
    const char *h = p->held.p;
    size_t n = p->held.len;
    long k = tc_find(h, n, "[ARGS]");
    size_t span = k >= 0 ? (size_t)k : n - tc_partial(h, n, "[ARGS]");
    int bad = span > 256;
    for (size_t i = 0; i < span && i <= 256; i++) bad |= h[i] == '[' || h[i] == '\n' || h[i] == '{';
    if (!bad && k < 0 && !at_end) return 0;
    if (bad || k < 0) {
        tc_call_abandon(p, content);
        return 1;
    }
    tc_set_name(tc_cur(p), h, (size_t)k);
    tcall_str_append(&p->raw, h, (size_t)k + 6);
    tc_consume(p, (size_t)k + 6);
    json_begin(p, 1);
    return 1;
}

/* ---- harmony: the messages are read by harmony.c, the calls' JSON by the scanner ---- */

struct h_ctx {
    struct tcall_parser *p;
    struct tcall_str *content;
};

static void h_text(void *ctx, const char *s, size_t n)
{
    tcall_str_append(((struct h_ctx *)ctx)->content, s, n);
}

static void h_call_open(void *ctx, const char *name, size_t n)
{
    struct tcall_parser *p = ((struct h_ctx *)ctx)->p;
    tc_set_name(tc_call_open(p), name, n);
    memset(&p->j, 0, offsetof(struct tc_jread, key));
    p->j.bare = 1;
    p->j_over = 0;
}

/* The body of a call: its JSON up to the value's end; the rest of the body is dropped. */
static void h_call_args(void *ctx, const char *s, size_t n)
{
    struct tcall_parser *p = ((struct h_ctx *)ctx)->p;
    for (size_t i = 0; i < n && !p->j_over; i++)
        p->j_over = json_byte(&p->j, tc_cur(p), s[i]) != JR_MORE;
}

static void h_call_end(void *ctx)
{
    tc_call_close(((struct h_ctx *)ctx)->p);
}

static const struct harmony_sink h_sink = {h_text, h_text, h_call_open, h_call_args, h_call_end};

/* ---- driving -------------------------------------------------------------------------- */

static void run(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    if (p->f == TCALL_HARMONY) {
        struct h_ctx c = {p, content};
        harmony_run(&p->h, &p->held, at_end, &h_sink, &c);
        return;
    }
    for (;;) {
        int progressed = 0;
        switch (p->st) {
        case ST_PLAIN:
            tcall_str_append(content, p->held.p, p->held.len);
            p->held.len = 0;
            break;
        case ST_TEXT:
            progressed = step_text(p, content, at_end);
            break;
        case ST_LLAMA_START:
            progressed = step_llama_start(p, at_end);
            break;
        case ST_OBJ:
            progressed = step_obj(p, content);
            break;
        case ST_AFTER_OBJ:
            progressed = step_after_obj(p, at_end);
            break;
        case ST_M_OPEN:
            progressed = step_m_open(p, content, at_end);
            break;
        case ST_M_NAME:
            progressed = step_m_name(p, content, at_end);
            break;
        case ST_X_FUNC:
            progressed = tc_step_x_func(p, content, at_end);
            break;
        case ST_X_BODY:
            progressed = tc_step_x_body(p, at_end);
            break;
        case ST_X_VALUE:
            progressed = tc_step_x_value(p, at_end);
            break;
        case ST_X_END:
            progressed = tc_step_x_end(p, at_end);
            break;
        case ST_G_NAME:
            progressed = tc_step_g_name(p, content, at_end);
            break;
        case ST_G_ARGS:
            progressed = tc_step_g_args(p, at_end);
            break;
        case ST_G_END:
            progressed = tc_step_g_end(p, at_end);
            break;
        }
        if (!progressed) return;
    }
}

void tcall_parser_push(struct tcall_parser *p, const char *s, size_t n, struct tcall_str *content)
{
    tcall_str_append(&p->held, s, n);
    run(p, content, 0);
}

void tcall_parser_finish(struct tcall_parser *p, struct tcall_str *content)
{
    run(p, content, 1);
    /* a call cut short: without a name it was never a call; with one it keeps what it has */
    if (p->n_calls && !tc_cur(p)->done) {
        if (!tc_cur(p)->name) {
            tcall_str_append(&p->raw, p->held.p, p->held.len);
            p->held.len = 0;
            tc_call_abandon(p, content);
        } else {
            tc_cur(p)->done = 1;
        }
    }
    tcall_str_append(content, p->held.p, p->held.len);
    p->held.len = 0;
}
