/* The MessagePack writer: every value in its shortest form, byte for byte as the spec
 * (and msgspec / msgpack-python) writes it. */
#include <stdint.h>
#include <string.h>

#include "common/msgpack.h"
#include "test_util.h"

/* Checks that what was written since the last reset is exactly want[0..n). */
#define BYTES(b, want, n)                                                                          \
    do {                                                                                           \
        CHECK((b)->len == (n) && !memcmp((b)->p, (want), (n)), "%zu bytes, want %zu (first %02x)", \
              (b)->len, (size_t)(n), (b)->len ? (b)->p[0] : 0);                                    \
        msgpack_buf_reset(b);                                                                      \
    } while (0)

static void test_ints(struct msgpack_buf *b)
{
    msgpack_uint(b, 0);
    BYTES(b, "\x00", 1);
    msgpack_uint(b, 127);
    BYTES(b, "\x7f", 1);
    msgpack_uint(b, 128);
    BYTES(b, "\xcc\x80", 2);
    msgpack_uint(b, 255);
    BYTES(b, "\xcc\xff", 2);
    msgpack_uint(b, 256);
    BYTES(b, "\xcd\x01\x00", 3);
    msgpack_uint(b, 65535);
    BYTES(b, "\xcd\xff\xff", 3);
    msgpack_uint(b, 65536);
    BYTES(b, "\xce\x00\x01\x00\x00", 5);
    msgpack_uint(b, 0xffffffffu);
    BYTES(b, "\xce\xff\xff\xff\xff", 5);
    msgpack_uint(b, 0x100000000ull);
    BYTES(b, "\xcf\x00\x00\x00\x01\x00\x00\x00\x00", 9);
    msgpack_uint(b, 0x8000000000000005ull);
    BYTES(b, "\xcf\x80\x00\x00\x00\x00\x00\x00\x05", 9);
    msgpack_int(b, 5);
    BYTES(b, "\x05", 1);
    msgpack_int(b, -1);
    BYTES(b, "\xff", 1);
    msgpack_int(b, -32);
    BYTES(b, "\xe0", 1);
    msgpack_int(b, -33);
    BYTES(b, "\xd0\xdf", 2);
    msgpack_int(b, -128);
    BYTES(b, "\xd0\x80", 2);
    msgpack_int(b, -129);
    BYTES(b, "\xd1\xff\x7f", 3);
    msgpack_int(b, -32768);
    BYTES(b, "\xd1\x80\x00", 3);
    msgpack_int(b, -32769);
    BYTES(b, "\xd2\xff\xff\x7f\xff", 5);
    msgpack_int(b, (int64_t)INT32_MIN - 1);
    BYTES(b, "\xd3\xff\xff\xff\xff\x7f\xff\xff\xff", 9);
    msgpack_int(b, INT64_MIN);
    BYTES(b, "\xd3\x80\x00\x00\x00\x00\x00\x00\x00", 9);
}

static void test_other(struct msgpack_buf *b)
{
    msgpack_nil(b);
    msgpack_bool(b, 0);
    msgpack_bool(b, 7);
    BYTES(b, "\xc0\xc2\xc3", 3);
    msgpack_f64(b, 1.5);
    BYTES(b, "\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00", 9);
    msgpack_cstr(b, "");
    BYTES(b, "\xa0", 1);
    msgpack_cstr(b, "GPU");
    BYTES(b, "\xa3GPU", 4);
    char s[300];
    memset(s, 'x', sizeof s);
    msgpack_str(b, s, 31);
    CHECK(b->len == 32 && b->p[0] == 0xbf, "fixstr 31: %02x", b->p[0]);
    msgpack_buf_reset(b);
    msgpack_str(b, s, 32);
    CHECK(b->len == 34 && b->p[0] == 0xd9 && b->p[1] == 32, "str8 32");
    msgpack_buf_reset(b);
    msgpack_str(b, s, 300);
    CHECK(b->len == 303 && b->p[0] == 0xda && b->p[1] == 1 && b->p[2] == 44, "str16 300");
    msgpack_buf_reset(b);
    msgpack_bin(b, "\x01\x02", 2);
    BYTES(b, "\xc4\x02\x01\x02", 4);
    msgpack_array(b, 0);
    msgpack_array(b, 15);
    msgpack_array(b, 16);
    BYTES(b, "\x90\x9f\xdc\x00\x10", 5);
    msgpack_array(b, 70000);
    BYTES(b, "\xdd\x00\x01\x11\x70", 5);
    msgpack_map(b, 1);
    msgpack_map(b, 15);
    msgpack_map(b, 16);
    msgpack_map(b, 65536);
    BYTES(b, "\x81\x8f\xde\x00\x10\xdf\x00\x01\x00\x00", 10);
}

/* A buffer grows past its first capacity and keeps its memory when reset. */
static void test_growth(struct msgpack_buf *b)
{
    for (int i = 0; i < 1000; i++) msgpack_uint(b, 0x100000000ull + (uint64_t)i);
    CHECK(b->len == 9000, "len %zu", b->len);
    CHECK(b->p[8991] == 0xcf && b->p[8999] == (uint8_t)(999 & 0xff), "last value");
    size_t cap = b->cap;
    msgpack_buf_reset(b);
    msgpack_nil(b);
    CHECK(b->cap == cap && b->len == 1, "reset keeps the memory");
    msgpack_buf_reset(b);
}

int main(void)
{
    struct msgpack_buf b = {0};
    test_ints(&b);
    test_other(&b);
    test_growth(&b);
    msgpack_buf_dispose(&b);
    TEST_DONE();
}
