/*
 * http json: the small pieces every route shares: a growable byte buffer, typed access to
 * request fields that names the field when a value is wrong, the error record of a request
 * and its OpenAI / Anthropic bodies, and UTF-8 validation.
 *
 *     struct http_error he = {0};
 *     double t;
 *     if (http_json_num(body, "temperature", 0, 2, &t, &he) < 0) reply(he.status, ...);
 */
#ifndef PAGODA_HTTP_JSON_H
#define PAGODA_HTTP_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/** A growable byte buffer; zero-initialized is empty. */
struct http_buf {
    char *p;
    size_t len, cap;
};

void http_buf_append(struct http_buf *b, const void *s, size_t n);
void http_buf_puts(struct http_buf *b, const char *s);
void http_buf_printf(struct http_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/** Appends s as a JSON string literal (quotes included). */
void http_buf_json_str(struct http_buf *b, const char *s, size_t n);
void http_buf_dispose(struct http_buf *b);

/** Why a request failed: the HTTP status, a message naming the field, the field itself. */
struct http_error {
    int status;     /* 0: no error */
    char param[96]; /* the offending field ("messages[1].role"), "" when none */
    char code[40];  /* OpenAI error code ("context_length_exceeded"), "" for null */
    char msg[512];
};

/** Sets the error (status, field, message) and returns -1. */
int http_error_set(struct http_error *he, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** {"error":{"message","type","param","code"}}: heap string. */
char *http_error_openai(const struct http_error *he);
/** {"type":"error","error":{"type","message"}}: heap string. */
char *http_error_anthropic(const struct http_error *he);

/** 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF). */
int http_utf8_valid(const char *s, size_t n);
/** Length of the longest prefix of s[0..n) that does not end inside a UTF-8 sequence. */
size_t http_utf8_complete(const char *s, size_t n);

/*
 * Typed fields of a JSON object. Each returns 1 when the field is present and valid (*out
 * set), 0 when it is absent or null (*out untouched), -1 with a 400 naming the field when
 * it has the wrong type or is out of range. Integers must be integral numbers.
 */
int http_json_bool(const cJSON *o, const char *name, int *out, struct http_error *he);
int http_json_int(const cJSON *o, const char *name, long lo, long hi, long *out,
                  struct http_error *he);
int http_json_num(const cJSON *o, const char *name, double lo, double hi, double *out,
                  struct http_error *he);
int http_json_str(const cJSON *o, const char *name, const char **out, struct http_error *he);

/** Parses a request body: valid UTF-8, well-formed JSON, an object. NULL + 400 otherwise. */
cJSON *http_json_parse_body(const char *body, size_t len, struct http_error *he);

#endif
