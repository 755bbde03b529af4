/*
 * msgpack: a MessagePack writer (the encoder side of the spec only: nil, booleans,
 * integers, float64, str, bin, array and map headers), each value in its shortest form as
 * the spec and msgpack encoders (msgspec, msgpack-python) write it.
 *
 *     struct msgpack_buf b = {0};
 *     msgpack_array(&b, 2);  msgpack_str(&b, "ts", 2);  msgpack_f64(&b, 1.5);
 *     ... send b.p[0..b.len) ...;  msgpack_buf_dispose(&b);
 *
 * The buffer grows by doubling; msgpack_buf_reset keeps its memory for the next message,
 * so a writer reused per message stops allocating once it has seen its largest one.
 */
#ifndef PAGODA_COMMON_MSGPACK_H
#define PAGODA_COMMON_MSGPACK_H

#include <stddef.h>
#include <stdint.h>

struct msgpack_buf {
    uint8_t *p;
    size_t len, cap;
};

void msgpack_buf_reset(struct msgpack_buf *b);
void msgpack_buf_dispose(struct msgpack_buf *b);

void msgpack_nil(struct msgpack_buf *b);
void msgpack_bool(struct msgpack_buf *b, int v);
/** Non-negative integers: positive fixint, uint8/16/32/64. */
void msgpack_uint(struct msgpack_buf *b, uint64_t v);
/** Signed integers: as msgpack_uint when >= 0, else negative fixint, int8/16/32/64. */
void msgpack_int(struct msgpack_buf *b, int64_t v);
/** float64 (0xcb). */
void msgpack_f64(struct msgpack_buf *b, double v);
/** UTF-8 text of n bytes (fixstr, str8/16/32). */
void msgpack_str(struct msgpack_buf *b, const char *s, size_t n);
/** NUL-terminated text. */
void msgpack_cstr(struct msgpack_buf *b, const char *s);
/** Raw bytes (bin8/16/32). */
void msgpack_bin(struct msgpack_buf *b, const void *p, size_t n);
/** The header of an array of n values (the values follow). */
void msgpack_array(struct msgpack_buf *b, uint32_t n);
/** The header of a map of n key/value pairs (keys and values follow, alternating). */
void msgpack_map(struct msgpack_buf *b, uint32_t n);

#endif
