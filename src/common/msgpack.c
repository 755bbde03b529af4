#include "common/msgpack.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

static uint8_t *room(struct msgpack_buf *b, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    uint8_t *w = b->p + b->len;
    b->len += n;
    return w;
}

/* The tag byte then v in `bytes` big-endian bytes. */
static void put_be(struct msgpack_buf *b, uint8_t tag, uint64_t v, int bytes)
{
    uint8_t *w = room(b, 1 + (size_t)bytes);
    w[0] = tag;
    for (int i = 0; i < bytes; i++) w[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}

void msgpack_buf_reset(struct msgpack_buf *b)
{
    b->len = 0;
}

void msgpack_buf_dispose(struct msgpack_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void msgpack_nil(struct msgpack_buf *b)
{
    *room(b, 1) = 0xc0;
}

void msgpack_bool(struct msgpack_buf *b, int v)
{
    *room(b, 1) = v ? 0xc3 : 0xc2;
}

void msgpack_uint(struct msgpack_buf *b, uint64_t v)
{
    if (v < 0x80)
        *room(b, 1) = (uint8_t)v;
    else if (v <= 0xff)
        put_be(b, 0xcc, v, 1);
    else if (v <= 0xffff)
        put_be(b, 0xcd, v, 2);
    else if (v <= 0xffffffffu)
        put_be(b, 0xce, v, 4);
    else
        put_be(b, 0xcf, v, 8);
}

void msgpack_int(struct msgpack_buf *b, int64_t v)
{
    if (v >= 0)
        msgpack_uint(b, (uint64_t)v);
    else if (v >= -32)
        *room(b, 1) = (uint8_t)(int8_t)v; /* negative fixint 0xe0..0xff */
    else if (v >= INT8_MIN)
        put_be(b, 0xd0, (uint64_t)v, 1);
    else if (v >= INT16_MIN)
        put_be(b, 0xd1, (uint64_t)v, 2);
    else if (v >= INT32_MIN)
        put_be(b, 0xd2, (uint64_t)v, 4);
    else
        put_be(b, 0xd3, (uint64_t)v, 8);
}

void msgpack_f64(struct msgpack_buf *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    put_be(b, 0xcb, u, 8);
}

static void header(struct msgpack_buf *b, size_t n, uint8_t fix, size_t fix_max, uint8_t t8,
                   uint8_t t16, uint8_t t32)
{
    if (n <= fix_max)
        *room(b, 1) = (uint8_t)(fix | n);
    else if (t8 && n <= 0xff)
        put_be(b, t8, n, 1);
    else if (n <= 0xffff)
        put_be(b, t16, n, 2);
    else
        put_be(b, t32, n, 4);
}

void msgpack_str(struct msgpack_buf *b, const char *s, size_t n)
{
    header(b, n, 0xa0, 31, 0xd9, 0xda, 0xdb);
    if (n) memcpy(room(b, n), s, n);
}

void msgpack_cstr(struct msgpack_buf *b, const char *s)
{
    msgpack_str(b, s, strlen(s));
}

void msgpack_bin(struct msgpack_buf *b, const void *p, size_t n)
{
    if (n <= 0xff)
        put_be(b, 0xc4, n, 1);
    else if (n <= 0xffff)
        put_be(b, 0xc5, n, 2);
    else
        put_be(b, 0xc6, n, 4);
    if (n) memcpy(room(b, n), p, n);
}

void msgpack_array(struct msgpack_buf *b, uint32_t n)
{
    header(b, n, 0x90, 15, 0, 0xdc, 0xdd);
}

void msgpack_map(struct msgpack_buf *b, uint32_t n)
{
    header(b, n, 0x80, 15, 0, 0xde, 0xdf);
}
