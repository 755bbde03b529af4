/*
 * Tool calls in output text, read incrementally (see toolcall.h). The parser holds the
 * text it cannot decide yet (a possible start of a tag, an unfinished JSON key) and moves
 * through states as markup is recognised. JSON is read one byte at a time with a small
 * scanner that knows only nesting, strings and the keys of the call object, so a push
 * costs O(bytes pushed) plus, for the tag searches, O(held * tag length).
 */
#include "text/toolcall.h"

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

static void str_puts(struct tcall_str *s, const char *p)
{
    tcall_str_append(s, p, strlen(p));
}

void tcall_str_dispose(struct tcall_str *s)
{
    free(s->p);
    memset(s, 0, sizeof *s);
}

static const char *const names[] = {"", "hermes", "qwen3_xml", "llama3_json", "mistral", "gemma4"};

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

#define GEMMA_QUOTE "<|\"|>" /* Gemma 4's string delimiter */

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
    default:
        return none;
    }
}

/* ---- the parser ----------------------------------------------------------------------- */

enum state {
    ST_TEXT,        /* content, looking for the format's start tag */
    ST_PLAIN,       /* content to the end (llama3_json: the output did not start with a call) */
    ST_LLAMA_START, /* llama3_json: the start of the output decides */
    ST_OBJ,         /* a JSON call object (or, bare, mistral's [ARGS] object) */
    ST_AFTER_OBJ,   /* after a JSON call: its end tag, a separator or the next call */
    ST_M_OPEN,      /* mistral after [TOOL_CALLS]: an array of calls or a name */
    ST_M_NAME,      /* mistral v11: the name up to [ARGS] */
    ST_X_FUNC,      /* qwen3_xml after <tool_call>: <function=NAME> */
    ST_X_BODY,      /* qwen3_xml: <parameter=KEY> or </function> */
    ST_X_VALUE,     /* qwen3_xml: a parameter's value up to </parameter> */
    ST_X_END,       /* qwen3_xml after </function>: </tool_call> */
    ST_G_NAME,      /* gemma4 after <|tool_call>: call:NAME up to '{' */
    ST_G_ARGS,      /* gemma4: the arguments, converted to JSON */
    ST_G_END,       /* gemma4 after the arguments: <tool_call|> */
};

enum { E_KEY, E_COLON, E_VALUE, E_SCALAR, E_COMMA };
enum { F_OTHER, F_NAME, F_ARGS };
enum { JR_MORE, JR_DONE, JR_BAD };

/* The JSON scanner's state for one call. */
struct jread {
    int bare; /* the value is the arguments themselves */
    int depth, in_str, esc;
    int expect, field; /* at depth 1 of a call object */
    int in_args;       /* bytes go to the call's arguments */
    struct tcall_str key, name;
};

struct tcall_parser {
    enum tcall_format f;
    const cJSON *tools;
    enum state st;
    struct tcall_str held; /* text not consumed yet */
    struct tcall_str raw;  /* the open call's markup so far (content if it proves malformed) */
    struct tcall *calls;
    int n_calls, cap_calls;
    int in_array;   /* mistral: inside [TOOL_CALLS][ ... ] */
    int after_call; /* whitespace between calls is dropped */
    struct jread j;
    /* qwen3_xml */
    int n_params, value_string, value_begun;
    /* gemma4: open containers ('{' or '['), whether a key is due, inside a string */
    char g_stack[64];
    int g_depth, g_key, g_str;
};

struct tcall_parser *tcall_parser_create(enum tcall_format f, const cJSON *tools)
{
    struct tcall_parser *p = xcalloc(1, sizeof *p);
    p->f = f;
    p->tools = tools;
    p->st = f == TCALL_LLAMA3_JSON ? ST_LLAMA_START : f == TCALL_NONE ? ST_PLAIN : ST_TEXT;
    tcall_str_append(&p->held, "", 0); /* never NULL: held.p + i is always defined */
    tcall_str_append(&p->raw, "", 0);
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

static struct tcall *cur(struct tcall_parser *p)
{
    return &p->calls[p->n_calls - 1];
}

static struct tcall *call_open(struct tcall_parser *p)
{
    if (p->n_calls == p->cap_calls) {
        p->cap_calls = p->cap_calls ? p->cap_calls * 2 : 4;
        p->calls = xrealloc(p->calls, sizeof *p->calls * (size_t)p->cap_calls);
    }
    struct tcall *c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof *c);
    return c;
}

static void set_name(struct tcall *c, const char *s, size_t n)
{
    while (n && (*s == ' ' || *s == '\n' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t')) n--;
    c->name = xmalloc(n + 1);
    memcpy(c->name, s, n);
    c->name[n] = 0;
}

static void consume(struct tcall_parser *p, size_t n)
{
    memmove(p->held.p, p->held.p + n, p->held.len - n);
    p->held.len -= n;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* Where tag first occurs in s[0..n), or -1. */
static long find(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t i = 0; i + t <= n; i++)
        if (s[i] == tag[0] && !memcmp(s + i, tag, t)) return (long)i;
    return -1;
}

/* The longest suffix of s[0..n) that is a proper prefix of tag: text to hold back. */
static size_t partial(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t l = t - 1 < n ? t - 1 : n; l > 0; l--)
        if (!memcmp(s + n - l, tag, l)) return l;
    return 0;
}

/* s[0..n) (n may be short of the tag) matches the start of tag. */
static int starts(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    return !memcmp(s, tag, n < t ? n : t);
}

/* The open call's markup proved malformed before its name: it was content after all. */
static void call_abandon(struct tcall_parser *p, struct tcall_str *content)
{
    struct tcall *c = cur(p);
    tcall_str_append(content, p->raw.p, p->raw.len);
    free(c->name);
    tcall_str_dispose(&c->args);
    p->n_calls--;
    p->raw.len = 0;
    p->in_array = 0;
    p->st = p->f == TCALL_LLAMA3_JSON ? ST_PLAIN : ST_TEXT;
}

static void call_close(struct tcall_parser *p)
{
    if (!cur(p)->args.len) str_puts(&cur(p)->args, "{}"); /* no arguments given */
    cur(p)->done = 1;
    p->raw.len = 0;
    p->after_call = 1;
}

static void json_begin(struct tcall_parser *p, int bare)
{
    struct jread *j = &p->j;
    j->bare = bare;
    j->depth = j->in_str = j->esc = j->in_args = 0;
    j->expect = E_KEY;
    j->field = F_OTHER;
    j->key.len = j->name.len = 0;
    if (!bare) call_open(p);
    p->st = ST_OBJ;
}

/* The end of a string at depth 1 of a call object: a key, or the value of a field. */
static void json_str_end(struct jread *j, struct tcall *c)
{
    if (j->expect == E_KEY) {
        j->expect = E_COLON;
        return;
    }
    if (j->field == F_NAME && !c->name) set_name(c, j->name.p ? j->name.p : "", j->name.len);
    j->in_args = 0;
    j->expect = E_COMMA;
}

static int key_is(const struct jread *j, const char *k)
{
    return j->key.len == strlen(k) && !memcmp(j->key.p, k, j->key.len);
}

/* One byte of a JSON call object (or bare arguments). */
static int json_byte(struct jread *j, struct tcall *c, char ch)
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
    if (is_ws(ch)) {
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
    struct tcall *c = cur(p);
    size_t i = 0;
    int r = JR_MORE;
    while (i < p->held.len && r == JR_MORE) r = json_byte(&p->j, c, p->held.p[i++]);
    if (r == JR_BAD) i--; /* the offending byte is read again as what follows */
    tcall_str_append(&p->raw, p->held.p, i);
    consume(p, i);
    if (r == JR_MORE) return 0;
    if (!c->name) {
        call_abandon(p, content);
        return 1;
    }
    call_close(p);
    p->st = ST_AFTER_OBJ;
    return 1;
}

/* After a JSON call: hermes wants </tool_call>, llama3_json a ';' before another call,
 * mistral's array a ',' or its ']'. Anything else ends the calls: it is content again. */
static int step_after_obj(struct tcall_parser *p, int at_end)
{
    size_t i = 0;
    while (i < p->held.len && is_ws(p->held.p[i])) i++;
    consume(p, i);
    if (!p->held.len) return 0;
    const char *h = p->held.p;
    size_t n = p->held.len;
    if (p->f == TCALL_HERMES) {
        const char *end = "</tool_call>";
        if (starts(h, n, end) && n < strlen(end) && !at_end) return 0;
        if (starts(h, n, end) && n >= strlen(end)) consume(p, strlen(end));
        p->st = ST_TEXT;
        return 1;
    }
    if (p->f == TCALL_LLAMA3_JSON) {
        char c0 = h[0];
        if (c0 == ';') consume(p, 1);
        if (c0 == ';' || c0 == '{') {
            p->st = ST_LLAMA_START;
            return 1;
        }
        p->st = ST_PLAIN;
        return 1;
    }
    /* mistral */
    if (p->in_array && h[0] == ',') {
        consume(p, 1);
        json_begin(p, 0);
        return 1;
    }
    if (p->in_array && h[0] == ']') consume(p, 1);
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
        while (i < p->held.len && is_ws(p->held.p[i])) i++;
        consume(p, i);
        if (!p->held.len) return 0;
        p->after_call = 0;
    }
    long k = find(p->held.p, p->held.len, tag);
    if (k < 0) {
        size_t keep = at_end ? 0 : partial(p->held.p, p->held.len, tag);
        tcall_str_append(content, p->held.p, p->held.len - keep);
        consume(p, p->held.len - keep);
        return 0;
    }
    tcall_str_append(content, p->held.p, (size_t)k);
    consume(p, (size_t)k + strlen(tag));
    p->raw.len = 0;
    str_puts(&p->raw, tag);
    if (p->f == TCALL_HERMES) {
        json_begin(p, 0);
    } else if (p->f == TCALL_QWEN3_XML) {
        call_open(p);
        p->st = ST_X_FUNC;
    } else if (p->f == TCALL_GEMMA4) {
        call_open(p);
        p->st = ST_G_NAME;
    } else {
        call_open(p); /* mistral: the array or the name decides how it is read */
        p->st = ST_M_OPEN;
    }
    return 1;
}

/* llama3_json: a call when the text starts with '{' or <|python_tag|>. */
static int step_llama_start(struct tcall_parser *p, int at_end)
{
    static const char tag[] = "<|python_tag|>";
    size_t i = 0;
    while (i < p->held.len && is_ws(p->held.p[i])) i++;
    const char *h = p->held.p + i;
    size_t n = p->held.len - i;
    if (!n) {
        if (at_end) p->st = ST_PLAIN;
        return at_end;
    }
    if (h[0] == '{') {
        consume(p, i);
        json_begin(p, 0);
        p->raw.len = 0;
        return 1;
    }
    if (starts(h, n, tag) && n >= sizeof tag - 1) {
        consume(p, i + sizeof tag - 1);
        p->raw.len = 0;
        str_puts(&p->raw, tag);
        return 1; /* the call's '{' follows */
    }
    if (starts(h, n, tag) && !at_end) return 0;
    p->st = ST_PLAIN;
    return 1;
}

/* mistral after [TOOL_CALLS]: '[' opens an array of call objects, else a name. */
static int step_m_open(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    size_t i = 0;
    while (i < p->held.len && is_ws(p->held.p[i])) i++;
    tcall_str_append(&p->raw, p->held.p, i);
    consume(p, i);
    if (!p->held.len) {
        if (at_end) call_abandon(p, content);
        return at_end;
    }
    if (p->held.p[0] == '[') {
        tcall_str_append(&p->raw, "[", 1);
        consume(p, 1);
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
    long k = find(h, n, "[ARGS]");
    size_t span = k >= 0 ? (size_t)k : n - partial(h, n, "[ARGS]");
    int bad = span > 256;
    for (size_t i = 0; i < span && i <= 256; i++) bad |= h[i] == '[' || h[i] == '\n' || h[i] == '{';
    if (!bad && k < 0 && !at_end) return 0;
    if (bad || k < 0) {
        call_abandon(p, content);
        return 1;
    }
    set_name(cur(p), h, (size_t)k);
    tcall_str_append(&p->raw, h, (size_t)k + 6);
    consume(p, (size_t)k + 6);
    json_begin(p, 1);
    return 1;
}

/* ---- qwen3_xml ------------------------------------------------------------------------ */

/* The JSON Schema type of parameter key of the call's tool: 1 when it is a string (or
 * unknown: vLLM's parser also keeps those as they are). */
static int param_is_string(const struct tcall_parser *p, const char *fn, const char *key)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, p->tools)
    {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(n) || strcmp(n->valuestring, fn)) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(f, "parameters"), "properties");
        const cJSON *ty =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
        if (cJSON_IsString(ty)) return !strcmp(ty->valuestring, "string");
        if (!cJSON_IsArray(ty)) return 1;
        const cJSON *x;
        cJSON_ArrayForEach(x,
                           ty) if (cJSON_IsString(x) && !strcmp(x->valuestring, "string")) return 1;
        return 0;
    }
    return 1;
}

/* Appends s[0..n) to the arguments as the inside of a JSON string. */
static void args_escaped(struct tcall *c, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char buf[8];
        if (ch == '"' || ch == '\\') {
            buf[0] = '\\', buf[1] = (char)ch;
            tcall_str_append(&c->args, buf, 2);
        } else if (ch == '\n') {
            tcall_str_append(&c->args, "\\n", 2);
        } else if (ch == '\t') {
            tcall_str_append(&c->args, "\\t", 2);
        } else if (ch == '\r') {
            tcall_str_append(&c->args, "\\r", 2);
        } else if (ch < 0x20) {
            static const char hex[] = "0123456789abcdef";
            memcpy(buf, "\\u00", 4);
            buf[4] = hex[ch >> 4], buf[5] = hex[ch & 15];
            tcall_str_append(&c->args, buf, 6);
        } else {
            tcall_str_append(&c->args, s + i, 1);
        }
    }
}

/* Reads "<tag=VALUE>" at the start of held: 1 + *len (bytes) and the value's span, 0 when
 * more text is needed, -1 when held does not start so. */
static int xml_open(const struct tcall_parser *p, const char *tag, size_t *len, size_t *v0,
                    size_t *vn)
{
    const char *h = p->held.p;
    size_t n = p->held.len, t = strlen(tag);
    if (!starts(h, n, tag)) return -1;
    if (n <= t) return 0;
    for (size_t i = t; i < n; i++) {
        if (h[i] == '>') {
            *v0 = t, *vn = i - t, *len = i + 1;
            return 1;
        }
        if (h[i] == '<' || h[i] == '\n' || i - t > 256) return -1;
    }
    return 0;
}

static void skip_ws(struct tcall_parser *p)
{
    size_t i = 0;
    while (i < p->held.len && is_ws(p->held.p[i])) i++;
    tcall_str_append(&p->raw, p->held.p, i);
    consume(p, i);
}

static int step_x_func(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    skip_ws(p);
    size_t len, v0, vn;
    int r = xml_open(p, "<function=", &len, &v0, &vn);
    if (r == 0 && !at_end) return 0;
    if (r <= 0) {
        call_abandon(p, content);
        return 1;
    }
    set_name(cur(p), p->held.p + v0, vn);
    consume(p, len);
    p->n_params = 0;
    p->st = ST_X_BODY;
    return 1;
}

static int step_x_body(struct tcall_parser *p, int at_end)
{
    skip_ws(p);
    struct tcall *c = cur(p);
    if (!p->held.len) return 0;
    size_t len, v0, vn;
    int r = xml_open(p, "<parameter=", &len, &v0, &vn);
    if (r == 1) {
        tcall_str_append(&c->args, p->n_params ? "," : "{", 1);
        p->n_params++;
        char *key = xmalloc(vn + 1);
        memcpy(key, p->held.p + v0, vn);
        key[vn] = 0;
        tcall_str_append(&c->args, "\"", 1);
        args_escaped(c, key, vn);
        tcall_str_append(&c->args, "\":", 2);
        p->value_string = param_is_string(p, c->name, key);
        if (p->value_string) tcall_str_append(&c->args, "\"", 1);
        free(key);
        consume(p, len);
        p->value_begun = 0;
        p->st = ST_X_VALUE;
        return 1;
    }
    const char *end = "</function>";
    if (starts(p->held.p, p->held.len, end) && p->held.len < strlen(end) && !at_end) return 0;
    if (r == 0 && !at_end) return 0;
    /* </function>, or anything else: the call's arguments are complete */
    if (starts(p->held.p, p->held.len, end) && p->held.len >= strlen(end)) consume(p, strlen(end));
    str_puts(&c->args, p->n_params ? "}" : "{}");
    call_close(p);
    p->st = ST_X_END;
    return 1;
}

/* A non-string parameter's text as JSON: parsed and printed compact, or as a string when
 * it is not JSON. */
static void args_typed(struct tcall *c, const char *s, size_t n)
{
    while (n && is_ws(*s)) s++, n--;
    while (n && is_ws(s[n - 1])) n--;
    cJSON *v = cJSON_ParseWithLength(s, n);
    if (v) {
        char *t = cJSON_PrintUnformatted(v);
        str_puts(&c->args, t);
        free(t);
        cJSON_Delete(v);
        return;
    }
    tcall_str_append(&c->args, "\"", 1);
    args_escaped(c, s, n);
    tcall_str_append(&c->args, "\"", 1);
}

static int step_x_value(struct tcall_parser *p, int at_end)
{
    static const char end[] = "</parameter>";
    struct tcall *c = cur(p);
    if (!p->value_begun) { /* the newline after <parameter=K> is markup */
        if (!p->held.len) return 0;
        if (p->held.p[0] == '\n') consume(p, 1);
        p->value_begun = 1;
    }
    const char *h = p->held.p;
    size_t n = p->held.len;
    long k = find(h, n, end);
    if (k < 0 && !at_end) {
        if (!p->value_string) return 0;
        /* hold what may be "\n</parameter>" (the newline before the tag is markup) */
        size_t keep = partial(h, n, "\n</parameter>");
        size_t keep2 = partial(h, n, end);
        if (keep2 > keep) keep = keep2;
        args_escaped(c, h, n - keep);
        consume(p, n - keep);
        return 0;
    }
    size_t vn = k < 0 ? n : (size_t)k;
    if (vn && h[vn - 1] == '\n') vn--;
    if (p->value_string) {
        args_escaped(c, h, vn);
        tcall_str_append(&c->args, "\"", 1);
    } else {
        args_typed(c, h, vn);
    }
    consume(p, k < 0 ? n : (size_t)k + sizeof end - 1);
    p->st = ST_X_BODY;
    return 1;
}

static int step_x_end(struct tcall_parser *p, int at_end)
{
    static const char end[] = "</tool_call>";
    size_t i = 0;
    while (i < p->held.len && is_ws(p->held.p[i])) i++;
    consume(p, i);
    if (!p->held.len) return 0;
    if (starts(p->held.p, p->held.len, end) && p->held.len < sizeof end - 1 && !at_end) return 0;
    if (starts(p->held.p, p->held.len, end) && p->held.len >= sizeof end - 1)
        consume(p, sizeof end - 1);
    p->st = ST_TEXT;
    return 1;
}

/* ---- gemma4 --------------------------------------------------------------------------- */

static int step_g_name(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
    static const char call[] = "call:";
    const char *h = p->held.p;
    size_t n = p->held.len;
    if (!starts(h, n, call) || (n < sizeof call - 1 && at_end)) {
        call_abandon(p, content);
        return 1;
    }
    const char *brace = memchr(h, '{', n);
    size_t span = brace ? (size_t)(brace - h) : n;
    int bad = span > 256 + sizeof call;
    for (size_t i = sizeof call - 1; i < span && !bad; i++) bad = h[i] == '<' || h[i] == '\n';
    if (!bad && !brace && !at_end) return 0;
    if (bad || !brace) {
        call_abandon(p, content);
        return 1;
    }
    set_name(cur(p), h + sizeof call - 1, span - (sizeof call - 1));
    tcall_str_append(&p->raw, h, span);
    consume(p, span);
    p->g_depth = 0;
    p->g_str = 0;
    p->st = ST_G_ARGS;
    return 1;
}

/* The arguments in Gemma 4's syntax, converted to compact JSON as they come: a bare key is
 * quoted when its ':' arrives, a string's text is escaped up to its closing mark (a possible
 * start of the mark held back), everything else is copied. */
static int step_g_args(struct tcall_parser *p, int at_end)
{
    struct tcall *c = cur(p);
    static const char q[] = GEMMA_QUOTE;
    const size_t ql = sizeof q - 1;
    for (;;) {
        const char *h = p->held.p;
        size_t n = p->held.len;
        if (!n) return 0;
        if (p->g_str) {
            long k = find(h, n, q);
            size_t take = k >= 0 ? (size_t)k : n - (at_end ? 0 : partial(h, n, q));
            args_escaped(c, h, take);
            consume(p, take);
            if (k < 0) return 0;
            tcall_str_append(&c->args, "\"", 1);
            consume(p, ql);
            p->g_str = 0;
            continue;
        }
        if (is_ws(h[0])) {
            consume(p, 1);
            continue;
        }
        if (starts(h, n, q) && n < ql && !at_end) return 0;
        if (starts(h, n, q) && n >= ql) { /* a string (a value, or an escaped key) */
            tcall_str_append(&c->args, "\"", 1);
            consume(p, ql);
            p->g_str = 1;
            p->g_key = 0;
            continue;
        }
        char ch = h[0];
        int in_obj = p->g_depth > 0 && p->g_stack[p->g_depth - 1] == '{';
        if (p->g_key && in_obj && ch != '}') { /* a bare key, up to ':' */
            /* a key is at most 256 bytes: the same cut in any chunking */
            const char *colon = memchr(h, ':', n < 256 ? n : 256);
            if (!colon && !at_end && n < 256) return 0;
            size_t kn = colon ? (size_t)(colon - h) : n < 256 ? n : 256;
            tcall_str_append(&c->args, "\"", 1);
            args_escaped(c, h, kn);
            tcall_str_append(&c->args, "\":", 2);
            consume(p, colon ? kn + 1 : kn);
            p->g_key = 0;
            continue;
        }
        tcall_str_append(&c->args, &ch, 1);
        consume(p, 1);
        if (ch == '{' || ch == '[') {
            if (p->g_depth == (int)sizeof p->g_stack) { /* too deep: the call ends here */
                call_close(p);
                p->st = ST_G_END;
                return 1;
            }
            p->g_stack[p->g_depth++] = ch;
            p->g_key = ch == '{';
        } else if ((ch == '}' || ch == ']') && p->g_depth > 0) {
            if (--p->g_depth == 0) {
                call_close(p);
                p->st = ST_G_END;
                return 1;
            }
        } else if (ch == ',') {
            p->g_key = in_obj;
        }
    }
}

static int step_g_end(struct tcall_parser *p, int at_end)
{
    static const char end[] = "<tool_call|>";
    size_t i = 0;
    while (i < p->held.len && is_ws(p->held.p[i])) i++;
    consume(p, i);
    if (!p->held.len) return 0;
    if (starts(p->held.p, p->held.len, end) && p->held.len < sizeof end - 1 && !at_end) return 0;
    if (starts(p->held.p, p->held.len, end) && p->held.len >= sizeof end - 1)
        consume(p, sizeof end - 1);
    p->st = ST_TEXT;
    return 1;
}

/* ---- driving -------------------------------------------------------------------------- */

static void run(struct tcall_parser *p, struct tcall_str *content, int at_end)
{
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
            progressed = step_x_func(p, content, at_end);
            break;
        case ST_X_BODY:
            progressed = step_x_body(p, at_end);
            break;
        case ST_X_VALUE:
            progressed = step_x_value(p, at_end);
            break;
        case ST_X_END:
            progressed = step_x_end(p, at_end);
            break;
        case ST_G_NAME:
            progressed = step_g_name(p, content, at_end);
            break;
        case ST_G_ARGS:
            progressed = step_g_args(p, at_end);
            break;
        case ST_G_END:
            progressed = step_g_end(p, at_end);
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
    if (p->n_calls && !cur(p)->done) {
        if (!cur(p)->name) {
            tcall_str_append(&p->raw, p->held.p, p->held.len);
            p->held.len = 0;
            call_abandon(p, content);
        } else {
            cur(p)->done = 1;
        }
    }
    tcall_str_append(content, p->held.p, p->held.len);
    p->held.len = 0;
}
