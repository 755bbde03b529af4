/*
 * Constrained decoding: the JSON Schema compiler against a conformance set (each valid
 * instance accepted, each invalid one rejected, exactly), regular expressions, GBNF, bad
 * input refused with a message, and token masks equal to the brute-force answer (every
 * token's bytes tried on the matcher) over the Llama 3 vocabulary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "text/grammar.h"
#include "text/grammar_impl.h"
#include "text/toolcall.h"
#include "test_util.h"

static int accepts(struct gram *g, const char *s)
{
    struct gram_matcher *m = gram_matcher_create(g);
    int ok = gram_matcher_accept_bytes(m, s, strlen(s)) && gram_matcher_can_end(m);
    gram_matcher_destroy(m);
    return ok;
}

struct jcase {
    const char *schema;
    const char *inst;
    int valid;
};

#define PERSON                                                                                     \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"       \
    "\"integer\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}"
#define OPT3                                                                                       \
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"           \
    "\"string\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"],\"additionalProperties\":"     \
    "false}"
#define OPTALL                                                                                     \
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"           \
    "\"integer\"}},\"additionalProperties\":false}"
#define POINTS                                                                                     \
    "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":"   \
    "{\"type\":\"number\"}},\"required\":[\"x\",\"y\"],\"additionalProperties\":false}},"          \
    "\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/pt\"},\"b\":{\"$ref\":"         \
    "\"#/$defs/pt\"}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}"
#define TREE                                                                                       \
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"      \
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\","    \
    "\"kids\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}"
#define VARIANT                                                                                    \
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":" \
    "\"integer\"}},\"required\":[\"kind\",\"x\"],\"additionalProperties\":false},{\"type\":"       \
    "\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},"          \
    "\"required\":[\"kind\",\"y\"],\"additionalProperties\":false}]}"
#define INTS "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}"
#define TUPLE                                                                                      \
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"          \
    "\"items\":{\"type\":\"boolean\"}}"
#define TUPLE_CLOSED                                                                               \
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"          \
    "\"items\":false,\"minItems\":2}"
#define UNIT       "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}"
#define TUPLE_OPEN "{\"prefixItems\":[{\"type\":\"integer\"}]}"
#define TUPLE_MAX                                                                                  \
    "{\"type\":\"array\",\"prefixItems\":[{\"const\":1},{\"const\":2},{\"const\":3}],"             \
    "\"minItems\":2,\"maxItems\":2}"

static const struct jcase cases[] = {
    /* an object with two required properties */
    {PERSON, "{\"name\":\"Bob\",\"age\":30}", 1},
    {PERSON, "{\"name\": \"Bob\", \"age\": 30}", 1},
    {PERSON, "{\n  \"name\": \"Bob\",\n  \"age\": 30\n}", 1},
    {PERSON, "{\"name\":\"B\\\"ob\",\"age\":-3}", 1},
    {PERSON, "{\"name\":\"\\u00e9\",\"age\":0}", 1},
    {PERSON, "{\"name\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\",\"age\":0}", 1},
    {PERSON, "{\"name\":\"\",\"age\":123456789012}", 1},
    {PERSON, "{\"name\":\"Bob\"}", 0},
    {PERSON, "{\"age\":30}", 0},
    {PERSON, "{\"name\":\"Bob\",\"age\":30,\"x\":1}", 0},
    {PERSON, "{\"name\":\"Bob\",\"age\":30.5}", 0},
    {PERSON, "{\"name\":Bob,\"age\":30}", 0},
    {PERSON, "{\"name\":\"Bob\",\"age\":\"30\"}", 0},
    {PERSON, "{\"name\":\"Bob\",\"age\":30,}", 0},
    {PERSON, "{\"name\":\"a\nb\",\"age\":0}", 0},
    {PERSON, "{\"name\":\"Bob\",\"age\":030}", 0},
    {PERSON, "{\"name\":\"\\q\",\"age\":1}", 0},
    {PERSON, "{\"name\":\"Bob\",\"age\":30", 0},
    {PERSON, "{\"name\":\"\xff\",\"age\":1}", 0},
    {PERSON, "[\"Bob\",30]", 0},
    /* optional properties around a required one */
    {OPT3, "{\"b\":\"x\"}", 1},
    {OPT3, "{\"a\":1,\"b\":\"x\"}", 1},
    {OPT3, "{\"b\":\"x\",\"c\":true}", 1},
    {OPT3, "{\"a\":1,\"b\":\"x\",\"c\":false}", 1},
    {OPT3, "{ \"a\" : 1 , \"b\" : \"x\" }", 1},
    {OPT3, "{}", 0},
    {OPT3, "{\"a\":1}", 0},
    {OPT3, "{\"a\":1,\"c\":true}", 0},
    {OPT3, "{,\"b\":\"x\"}", 0},
    {OPT3, "{\"b\":\"x\",}", 0},
    {OPT3, "{\"a\":1,,\"b\":\"x\"}", 0},
    {OPT3, "{\"b\":\"x\",\"c\":null}", 0},
    /* every property optional */
    {OPTALL, "{}", 1},
    {OPTALL, "{ }", 1},
    {OPTALL, "{\"a\":1}", 1},
    {OPTALL, "{\"b\":2}", 1},
    {OPTALL, "{\"a\":1,\"b\":2}", 1},
    {OPTALL, "{\"c\":1}", 0},
    {OPTALL, "{\"a\":1,}", 0},
    /* enum, const */
    {"{\"enum\":[\"red\",\"green\",3,null]}", "\"red\"", 1},
    {"{\"enum\":[\"red\",\"green\",3,null]}", "\"green\"", 1},
    {"{\"enum\":[\"red\",\"green\",3,null]}", "3", 1},
    {"{\"enum\":[\"red\",\"green\",3,null]}", "null", 1},
    {"{\"enum\":[\"red\",\"green\",3,null]}", "\"blue\"", 0},
    {"{\"enum\":[\"red\",\"green\",3,null]}", "\"Red\"", 0},
    {"{\"enum\":[\"red\",\"green\",3,null]}", "4", 0},
    {"{\"enum\":[{\"a\":1},[1,2]]}", "{\"a\":1}", 1},
    {"{\"enum\":[{\"a\":1},[1,2]]}", "[1,2]", 1},
    {"{\"enum\":[{\"a\":1},[1,2]]}", "{\"a\":2}", 0},
    {"{\"const\":\"fixed\"}", "\"fixed\"", 1},
    {"{\"const\":\"fixed\"}", "\"fixe\"", 0},
    {"{\"const\":\"fixed\"}", "\"fixed2\"", 0},
    {"{\"const\":42}", "42", 1},
    {"{\"const\":42}", "43", 0},
    /* anyOf, oneOf, allOf, type lists */
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}]}", "5", 1},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}]}", "\"abc\"", 1},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}]}", "\"\"", 1},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}]}", "\"abcd\"", 0},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}]}", "true", 0},
    {VARIANT, "{\"kind\":\"a\",\"x\":1}", 1},
    {VARIANT, "{\"kind\":\"b\",\"y\":\"s\"}", 1},
    {VARIANT, "{\"kind\":\"a\",\"y\":\"s\"}", 0},
    {VARIANT, "{\"kind\":\"c\",\"x\":1}", 0},
    {"{\"allOf\":[{\"type\":\"integer\"}]}", "3", 1},
    {"{\"allOf\":[{\"type\":\"integer\"}]}", "\"3\"", 0},
    {"{\"type\":[\"string\",\"null\"]}", "\"x\"", 1},
    {"{\"type\":[\"string\",\"null\"]}", "null", 1},
    {"{\"type\":[\"string\",\"null\"]}", "1", 0},
    /* arrays */
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}", "[1]",
     1},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
     "[1,2,3]", 1},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
     "[ 1 , 2 ]", 1},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}", "[]",
     0},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
     "[1,2,3,4]", 0},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
     "[1,\"a\"]", 0},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}", "[1,]",
     0},
    {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}", "[]", 1},
    {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}", "[true,false,true]", 1},
    {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}", "[true false]", 0},
    {"{\"type\":\"array\",\"minItems\":2}", "[1,2]", 1},
    {"{\"type\":\"array\",\"minItems\":2}", "[1,\"x\",{},[],null]", 1},
    {"{\"type\":\"array\",\"minItems\":2}", "[1]", 0},
    {"{\"type\":\"array\",\"maxItems\":0}", "[]", 1},
    {"{\"type\":\"array\",\"maxItems\":0}", "[1]", 0},
    {"{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
     "\"minItems\":2,"
     "\"maxItems\":2}}",
     "[[\"a\",\"b\"],[\"c\",\"d\"]]", 1},
    {"{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
     "\"minItems\":2,"
     "\"maxItems\":2}}",
     "[[\"a\"]]", 0},
    /* $ref, $defs, recursion */
    {POINTS, "{\"a\":{\"x\":1,\"y\":2.5},\"b\":{\"x\":-1e5,\"y\":0}}", 1},
    {POINTS, "{\"a\":{\"x\":1},\"b\":{\"x\":1,\"y\":2}}", 0},
    {TREE, "{\"v\":1,\"kids\":[]}", 1},
    {TREE, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[]}]},{\"v\":4,\"kids\":[]}]}",
     1},
    {TREE, "{\"v\":1,\"kids\":[{\"v\":2}]}", 0},
    {"{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"array\",\"items\":{\"$ref\":"
     "\"#/definitions/s\"}}",
     "[\"a\",\"b\"]", 1},
    {"{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"array\",\"items\":{\"$ref\":"
     "\"#/definitions/s\"}}",
     "[1]", 0},
    /* strings: pattern, formats, lengths */
    {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3}$\"}", "\"AB-123\"", 1},
    {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3}$\"}", "\"AB-12\"", 0},
    {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3}$\"}", "\"ab-123\"", 0},
    {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3}$\"}", "\"AB-1234\"", 0},
    {"{\"type\":\"string\",\"pattern\":\"a\\\"b\"}", "\"a\\\"b\"", 1},
    {"{\"type\":\"string\",\"pattern\":\"a\\\"b\"}", "\"a\"b\"", 0},
    {"{\"type\":\"string\",\"pattern\":\"\\\\d+(\\\\.\\\\d+)?\"}", "\"3.14\"", 1},
    {"{\"type\":\"string\",\"pattern\":\"\\\\d+(\\\\.\\\\d+)?\"}", "\"3.\"", 0},
    {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"", 1},
    {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13-01\"", 0},
    {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-1-01\"", 0},
    {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-02-29T12:30:00Z\"", 1},
    {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-02-29T12:30:00.123+05:30\"", 1},
    {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-02-29 12:30:00Z\"", 0},
    {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-02-29T24:00:00Z\"", 0},
    {"{\"type\":\"string\",\"format\":\"time\"}", "\"23:59:59Z\"", 1},
    {"{\"type\":\"string\",\"format\":\"time\"}", "\"24:00:00Z\"", 0},
    {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", 1},
    {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567e89b12d3a456426614174000\"", 0},
    {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-42661417400g\"", 0},
    {"{\"type\":\"string\",\"format\":\"email\"}", "\"a.b@example.com\"", 1},
    {"{\"type\":\"string\",\"format\":\"email\"}", "\"a@b.co\"", 1},
    {"{\"type\":\"string\",\"format\":\"email\"}", "\"ab@example\"", 0},
    {"{\"type\":\"string\",\"format\":\"email\"}", "\"@x.com\"", 0},
    {"{\"type\":\"string\",\"format\":\"ipv4\"}", "\"192.168.1.1\"", 1},
    {"{\"type\":\"string\",\"format\":\"ipv4\"}", "\"256.1.1.1\"", 0},
    {"{\"type\":\"string\",\"format\":\"hostname\"}", "\"anything goes\"", 1},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}", "\"ab\"", 1},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}", "\"abcd\"", 1},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}", "\"\\n\\t\"", 1},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}", "\"\xc3\xa9\xc3\xa9\"", 1},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}", "\"a\"", 0},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}", "\"abcde\"", 0},
    {"{\"type\":\"string\"}", "\"\\u12AB\"", 1},
    {"{\"type\":\"string\"}", "\"\\u12G4\"", 0},
    {"{\"type\":\"string\"}", "\"\\x41\"", 0},
    {"{\"type\":\"string\"}", "\"\\/\\b\\f\\r\"", 1},
    /* integers in ranges */
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "1", 1},
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "5", 1},
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "99", 1},
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "100", 1},
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "120", 1},
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "0", 0},
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "121", 0},
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "-1", 0},
    {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}", "01", 0},
    {"{\"type\":\"integer\",\"minimum\":-50,\"maximum\":50}", "-50", 1},
    {"{\"type\":\"integer\",\"minimum\":-50,\"maximum\":50}", "-9", 1},
    {"{\"type\":\"integer\",\"minimum\":-50,\"maximum\":50}", "0", 1},
    {"{\"type\":\"integer\",\"minimum\":-50,\"maximum\":50}", "50", 1},
    {"{\"type\":\"integer\",\"minimum\":-50,\"maximum\":50}", "-51", 0},
    {"{\"type\":\"integer\",\"minimum\":-50,\"maximum\":50}", "51", 0},
    {"{\"type\":\"integer\",\"minimum\":-50,\"maximum\":50}", "-0", 0},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", "1", 1},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", "123456789", 1},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", "0", 0},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", "-5", 0},
    {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":255}", "199", 1},
    {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":255}", "200", 1},
    {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":255}", "249", 1},
    {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":255}", "255", 1},
    {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":255}", "256", 0},
    {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":255}", "300", 0},
    {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":2050}", "1000", 1},
    {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":2050}", "1999", 1},
    {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":2050}", "2049", 1},
    {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":2050}", "2050", 1},
    {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":2050}", "999", 0},
    {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":2050}", "2051", 0},
    {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":2050}", "10000", 0},
    {"{\"type\":\"integer\",\"maximum\":-10}", "-10", 1},
    {"{\"type\":\"integer\",\"maximum\":-10}", "-100", 1},
    {"{\"type\":\"integer\",\"maximum\":-10}", "-9", 0},
    {"{\"type\":\"integer\",\"maximum\":-10}", "5", 0},
    {"{\"type\":\"integer\",\"maximum\":7}", "-12345", 1},
    {"{\"type\":\"integer\",\"maximum\":7}", "8", 0},
    {"{\"type\":\"integer\",\"minimum\":95}", "95", 1},
    {"{\"type\":\"integer\",\"minimum\":95}", "100", 1},
    {"{\"type\":\"integer\",\"minimum\":95}", "94", 0},
    {"{\"type\":\"integer\",\"minimum\":95}", "9", 0},
    /* prefixItems: a tuple, then items for the rest (false: none, absent: any JSON) */
    {TUPLE, "[\"a\",1]", 1},
    {TUPLE, "[ \"a\" , 1 ]", 1},
    {TUPLE, "[\"a\"]", 1},
    {TUPLE, "[]", 1},
    {TUPLE, "[1]", 0},
    {TUPLE, "[\"a\",\"b\"]", 0},
    {TUPLE, "[\"a\",1,true,false]", 1},
    {TUPLE, "[\"a\",1,2]", 0},
    {TUPLE, "[\"a\",1,]", 0},
    {TUPLE_CLOSED, "[\"a\",1]", 1},
    {TUPLE_CLOSED, "[\"a\",1,true]", 0},
    {TUPLE_CLOSED, "[\"a\"]", 0},
    {TUPLE_CLOSED, "[]", 0},
    {TUPLE_OPEN, "[1,\"x\",{\"k\":[null]},3.5]", 1},
    {TUPLE_OPEN, "[\"x\"]", 0},
    {TUPLE_OPEN, "[]", 1},
    {TUPLE_MAX, "[1,2]", 1},
    {TUPLE_MAX, "[1]", 0},
    {TUPLE_MAX, "[1,2,3]", 0},
    {"{\"prefixItems\":[{\"const\":0}],\"minItems\":3,\"items\":{\"type\":\"null\"}}",
     "[0,null,null]", 1},
    {"{\"prefixItems\":[{\"const\":0}],\"minItems\":3,\"items\":{\"type\":\"null\"}}", "[0,null]",
     0},
    /* bounded numbers: exact, in plain decimal (an exponent is outside the grammar, though
     * 5e-1 is a valid instance: the digit-by-digit comparison needs the plain form) */
    {UNIT, "0.5", 1},
    {UNIT, "1.000", 1},
    {UNIT, "0", 1},
    {UNIT, "1.0001", 0},
    {UNIT, "-0.1", 0},
    {UNIT, "2", 0},
    {UNIT, "5e-1", 0},
    {"{\"type\":\"number\",\"exclusiveMinimum\":-1.5}", "-1.49", 1},
    {"{\"type\":\"number\",\"exclusiveMinimum\":-1.5}", "-1.5", 0},
    {"{\"type\":\"number\",\"exclusiveMinimum\":-1.5}", "123456.75", 1},
    {"{\"type\":\"number\",\"maximum\":0.3}", "0.30", 1},
    {"{\"type\":\"number\",\"maximum\":0.3}", "0.300001", 0},
    {"{\"type\":\"number\",\"maximum\":0.3}", "-1000.5", 1},
    /* numbers, booleans, null */
    {"{\"type\":\"number\"}", "1.5", 1},
    {"{\"type\":\"number\"}", "-0.25", 1},
    {"{\"type\":\"number\"}", "1e10", 1},
    {"{\"type\":\"number\"}", "1.5E-3", 1},
    {"{\"type\":\"number\"}", "0", 1},
    {"{\"type\":\"number\"}", ".5", 0},
    {"{\"type\":\"number\"}", "1.", 0},
    {"{\"type\":\"number\"}", "01", 0},
    {"{\"type\":\"number\"}", "\"1\"", 0},
    {"{\"type\":\"number\",\"minimum\":0}", "0.5", 1},
    {"{\"type\":\"number\",\"minimum\":0}", "-0.5", 0},
    {"{\"type\":\"boolean\"}", "true", 1},
    {"{\"type\":\"boolean\"}", "false", 1},
    {"{\"type\":\"boolean\"}", "True", 0},
    {"{\"type\":\"boolean\"}", "1", 0},
    {"{\"type\":\"null\"}", "null", 1},
    {"{\"type\":\"null\"}", "nul", 0},
    /* any value, maps */
    {"{}", "1", 1},
    {"{}", "\"s\"", 1},
    {"{}", "[1,[2,[3]]]", 1},
    {"{}", "{\"a\":{},\"b\":[{}]}", 1},
    {"{}", "nul", 0},
    {"{}", "{\"a\":1,}", 0},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"x\":1,\"y\":2}",
     1},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{}", 1},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"x\":\"a\"}", 0},
    {"{\"type\":\"object\",\"additionalProperties\":false}", "{}", 1},
    {"{\"type\":\"object\",\"additionalProperties\":false}", "{\"x\":1}", 0},
    /* whitespace: at most 20 bytes in a gap, none around the value */
    {INTS, "[                    1]", 1},
    {INTS, "[                     1]", 0},
    {INTS, "[\t\r\n1 ]", 1},
    {INTS, " [1]", 0},
    {INTS, "[1] ", 0},
};

/* Property order is the schema's (as XGrammar and OpenAI emit it): reordered instances,
 * though valid JSON Schema instances, are outside the grammar. */
static const struct jcase order_cases[] = {
    {PERSON, "{\"age\":30,\"name\":\"Bob\"}", 0},
    {OPTALL, "{\"b\":2,\"a\":1}", 0},
};

static void test_schemas(void)
{
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        struct err e = {0};
        struct gram *g = gram_from_json_schema(cases[i].schema, strlen(cases[i].schema), &e);
        CHECK(g, "case %d: %s", i, e.msg);
        if (!g) continue;
        CHECK(accepts(g, cases[i].inst) == cases[i].valid, "case %d: %s on %s: expected %s", i,
              cases[i].inst, cases[i].schema, cases[i].valid ? "accept" : "reject");
        gram_unref(g);
    }
    for (size_t i = 0; i < sizeof order_cases / sizeof order_cases[0]; i++) {
        struct gram *g =
            gram_from_json_schema(order_cases[i].schema, strlen(order_cases[i].schema), NULL);
        CHECK(g && !accepts(g, order_cases[i].inst), "order case %zu", i);
        gram_unref(g);
    }
    printf("schema conformance: %d schema/instance pairs\n", n);
}

/* Number bounds against arithmetic: for each schema, decimals around and between its bounds
 * (integer parts -13..13, fractions of up to four digits, trailing zeros included) are
 * accepted exactly when strtod's value meets the bounds. "-0..." strings are left out (the
 * grammar writes zero without a sign), and so is the exponent form (a bounded number is
 * written in plain decimal: checked separately). */
static void test_number_bounds(void)
{
    static const char *const schemas[] = {
        "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
        "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
        "{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":3.25}",
        "{\"type\":\"number\",\"exclusiveMinimum\":-2.5,\"exclusiveMaximum\":-0.125}",
        "{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.15}",
        "{\"type\":\"number\",\"minimum\":0.105,\"exclusiveMaximum\":0.11}",
        "{\"type\":\"number\",\"minimum\":1.5}",
        "{\"type\":\"number\",\"exclusiveMinimum\":-1.05}",
        "{\"type\":\"number\",\"maximum\":-0.5}",
        "{\"type\":\"number\",\"exclusiveMaximum\":10}",
        "{\"type\":\"number\",\"minimum\":7.25,\"maximum\":7.25}",
        "{\"type\":\"number\",\"minimum\":-12,\"exclusiveMaximum\":0}",
        "{\"type\":\"number\",\"minimum\":0,\"exclusiveMinimum\":0.5,\"maximum\":9,"
        "\"exclusiveMaximum\":8.75}",
    };
    static const char *const fracs[] = {"",    ".0",   ".00", ".05",   ".1",  ".10",  ".105",
                                        ".11", ".125", ".15", ".1501", ".2",  ".25",  ".2500",
                                        ".3",  ".5",   ".50", ".7",    ".75", ".999", ".9999"};
    int n = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        struct err e = {0};
        struct gram *g = gram_from_json_schema(schemas[i], strlen(schemas[i]), &e);
        CHECK(g, "%s: %s", schemas[i], e.msg);
        if (!g) continue;
        cJSON *sc = cJSON_Parse(schemas[i]);
        const cJSON *mn = cJSON_GetObjectItem(sc, "minimum"),
                    *mx = cJSON_GetObjectItem(sc, "maximum");
        const cJSON *xmn = cJSON_GetObjectItem(sc, "exclusiveMinimum");
        const cJSON *xmx = cJSON_GetObjectItem(sc, "exclusiveMaximum");
        for (int ip = -13; ip <= 13; ip++)
            for (size_t f = 0; f < sizeof fracs / sizeof *fracs; f++)
                for (int neg = 0; neg < 2; neg++) {
                    if (neg && ip > 0) continue;
                    if (!neg && ip < 0) continue;
                    char inst[32];
                    snprintf(inst, sizeof inst, "%s%d%s", neg && ip == 0 ? "-" : "", ip, fracs[f]);
                    double v = strtod(inst, NULL);
                    if (inst[0] == '-' && v == 0) continue;
                    int ok = (!mn || v >= mn->valuedouble) && (!mx || v <= mx->valuedouble) &&
                             (!xmn || v > xmn->valuedouble) && (!xmx || v < xmx->valuedouble);
                    CHECK(accepts(g, inst) == ok, "%s on %s: expected %s", inst, schemas[i],
                          ok ? "accept" : "reject");
                    n++;
                }
        cJSON_Delete(sc);
        gram_unref(g);
    }
    printf("number bounds: %d schema/instance pairs against arithmetic\n", n);
}

static void test_bad_schemas(void)
{
    static const char *const bad[][2] = {
        {"{\"type\":", "not valid JSON"},
        {"{\"type\":\"foo\"}", "unknown type 'foo'"},
        {"{\"not\":{}}", "'not' is not supported"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "only local $ref"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":1}", "is empty"},
        {"{\"type\":\"string\",\"pattern\":\"(ab\"}", "missing ')'"},
        {"{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", "lookaround"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":1}", "below 'minItems'"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"]}",
         "'x' is not in 'properties'"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems' is not supported"},
        {"{\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "above the 1 items"},
        {"{\"prefixItems\":{}}", "'prefixItems' must be an array"},
        {"{\"type\":\"number\",\"minimum\":2,\"exclusiveMaximum\":2}",
         "number range 2..2 is empty"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":1e-40}", "more than 30 decimal places"},
        {"{\"type\":\"string\",\"maxLength\":-1}", "'maxLength'"},
        {"[1]", "must be an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct err e = {0};
        struct gram *g = gram_from_json_schema(bad[i][0], strlen(bad[i][0]), &e);
        CHECK(!g, "bad schema %zu compiled", i);
        CHECK(strstr(e.msg, bad[i][1]), "bad schema %zu: message '%s' lacks '%s'", i, e.msg,
              bad[i][1]);
        gram_unref(g);
    }
}

static void test_regex(void)
{
    static const struct {
        const char *re, *s;
        int ok;
    } rc[] = {
        {"a|b", "a", 1},
        {"a|b", "b", 1},
        {"a|b", "ab", 0},
        {"(ab)+", "ababab", 1},
        {"(ab)+", "", 0},
        {"(?:ab)*c", "c", 1},
        {"\\d{3}-\\d{4}", "555-1234", 1},
        {"\\d{3}-\\d{4}", "55-1234", 0},
        {"\\w+@\\w+", "x_1@y", 1},
        {"\\s*x", " \t\nx", 1},
        {"[^0-9]+", "abc", 1},
        {"[^0-9]+", "a1", 0},
        {"[a-c-]+", "a-c", 1},
        {"a.c", "abc", 1},
        {"a.c", "a\nc", 0},
        {"a.c",
         "a\xc3\xa9"
         "c",
         1},
        {"colou?r", "color", 1},
        {"colou?r", "colour", 1},
        {"colou?r", "colouur", 0},
        {"x{2,3}", "xx", 1},
        {"x{2,3}", "xxxx", 0},
        {"x{2,}", "xxxxx", 1},
        {"\\.\\*", ".*", 1},
        {"[\\d\\s]+", "1 2", 1},
        {"\\D", "5", 0},
        {"(a?)*b", "aab", 1},
        {"(a|)*b", "b", 1},
        {"^abc$", "abc", 1},
        {"[\\u00e0-\\u00ff]+", "\xc3\xa0\xc3\xbf", 1},
        {"[\\u00e0-\\u00ff]", "\xc3\x9f", 0},
        {"a+?", "aaa", 1},
        {"\\x41", "A", 1},
    };
    for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++) {
        struct err e = {0};
        struct gram *g = gram_from_regex(rc[i].re, strlen(rc[i].re), &e);
        CHECK(g, "regex %zu (%s): %s", i, rc[i].re, e.msg);
        if (!g) continue;
        CHECK(accepts(g, rc[i].s) == rc[i].ok, "regex %s on '%s'", rc[i].re, rc[i].s);
        gram_unref(g);
    }
    /* regression: an empty class "[]" sorted a NULL range list (UBSan); now an error */
    struct err ec = {0};
    struct gram *g0 = gram_from_regex("[]-z]", 5, &ec);
    CHECK(!g0 && strstr(ec.msg, "empty character class"), "empty class: %s", ec.msg);
    g0 = gram_from_regex("[^\\x00-\\x7f]", 12, &ec);
    CHECK(g0 && accepts(g0, "\xc3\xa9") && !accepts(g0, "a"), "negated ASCII class: %s", ec.msg);
    gram_unref(g0);
    /* a grammar that would hold 10^8 symbols is refused, not built */
    struct err big = {0};
    struct gram *gb = gram_from_regex("(a{9999}){9999}", 15, &big);
    CHECK(!gb && strstr(big.msg, "nested repetitions at 9 allow more than 128 ways"),
          "nested repetition: %s", big.msg);
    char seq[2048] = "";
    for (int i = 0; i < 110; i++) strcat(seq, "a{9999}");
    big = (struct err){0};
    gb = gram_from_regex(seq, strlen(seq), &big);
    CHECK(!gb && strstr(big.msg, "grammar too large"), "long sequence: %s", big.msg);
    /* regression (stacked_bounded_repetitions): a{0,2} stacked seven times (17 bytes)
     * compiled, and matching 200 bytes under it ran past 20 s; nested bounded repetitions
     * are refused past a product of 128, stacked or through groups */
    static const char *const nested[] = {"a{0,2}{0,2}{0,2}{0,2}{0,2}{0,2}{0,2}",
                                         "a{1,100}{1,100}",
                                         "(a?){0,600}",
                                         "((a|b){0,10}){0,10}{0,10}",
                                         "(x(a{1,40}){1,40})",
                                         "a{1,30}{1,30}",
                                         "(a+ ?){1,50}"};
    for (size_t i = 0; i < sizeof nested / sizeof nested[0]; i++) {
        struct err e = {0};
        struct gram *g = gram_from_regex(nested[i], strlen(nested[i]), &e);
        CHECK(!g && strstr(e.msg, "nested repetitions at") && strstr(e.msg, "more than 128"),
              "'%s': %s", nested[i], e.msg);
        gram_unref(g);
    }
    static const char *const fine[] = {"a{1,10}{1,10}",
                                       "(a?){0,60}",
                                       "a{0,5000}",
                                       "(\\d{1,3}\\.){3}\\d{1,3}",
                                       "a{2}b{3}c{4}d{5}e{6}f{7}",
                                       "((a{0,3}b){0,3}c){0,3}",
                                       "(a+ ?){1,40}"};
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        struct err e = {0};
        struct gram *g = gram_from_regex(fine[i], strlen(fine[i]), &e);
        CHECK(g, "'%s': %s", fine[i], e.msg);
        gram_unref(g);
    }
    static const char *const bad[] = {"(a", "a)", "*a", "a\\1", "a{3,1}", "[a-", "[z-a]", "a^b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct err e = {0};
        struct gram *g = gram_from_regex(bad[i], strlen(bad[i]), &e);
        CHECK(!g && e.msg[0], "bad regex '%s' compiled", bad[i]);
        gram_unref(g);
    }
}

static void test_gbnf(void)
{
    const char *arith = "# arithmetic\n"
                        "root ::= expr\n"
                        "expr ::= term (\"+\" term)*\n"
                        "term ::= factor (\"*\" factor)*\n"
                        "factor ::= [0-9]+ | \"(\" expr \")\"\n";
    struct err e = {0};
    struct gram *g = gram_from_gbnf(arith, strlen(arith), &e);
    CHECK(g, "%s", e.msg);
    if (g) {
        CHECK(accepts(g, "1+2*(3+4)"), "arith");
        CHECK(accepts(g, "((7))"), "parens");
        CHECK(!accepts(g, "1+"), "dangling +");
        CHECK(!accepts(g, "(1"), "open paren");
        gram_unref(g);
    }
    const char *multi = "root ::= \"a\"\n  | \"b\" x{2}\nx ::= [^\\n\\x00] # any but newline\n";
    g = gram_from_gbnf(multi, strlen(multi), &e);
    CHECK(g, "%s", e.msg);
    if (g) {
        CHECK(accepts(g, "a") && accepts(g, "bxy") && !accepts(g, "bx") && !accepts(g, "b\nx"),
              "multi-line rule");
        gram_unref(g);
    }
    /* stacked and grouped quantifiers (a fuzzer's input: twenty of them took the matcher
     * seconds a byte, one stack per way of nesting them) are one repetition */
    static const struct {
        const char *src, *yes[3], *no[2];
    } stacked[] = {
        {"root ::= \"ab\"+??+++++??++++++++++", {"", "ab", "abababab"}, {"a", "aba"}},
        {"root ::= ((\"ab\")?)+ \"c\"", {"c", "abc", "ababc"}, {"ab", "abac"}},
        {"root ::= (\"ab\"+)+ \"c\"", {"abc", "ababc", "abababc"}, {"c", "abab"}},
        {"root ::= (\"a\"? \"b\"?)+", {"", "ab", "bab"}, {"c", "ac"}},
    };
    for (size_t i = 0; i < sizeof stacked / sizeof stacked[0]; i++) {
        g = gram_from_gbnf(stacked[i].src, strlen(stacked[i].src), &e);
        CHECK(g, "%s: %s", stacked[i].src, e.msg);
        if (!g) continue;
        for (int j = 0; j < 3; j++)
            CHECK(accepts(g, stacked[i].yes[j]), "%s: '%s' refused", stacked[i].src,
                  stacked[i].yes[j]);
        for (int j = 0; j < 2; j++)
            CHECK(!accepts(g, stacked[i].no[j]), "%s: '%s' accepted", stacked[i].src,
                  stacked[i].no[j]);
        gram_unref(g);
    }
    static const char *const bad[][2] = {
        {"root ::= a\na ::= a \"x\" | \"y\"\n", "left-recursive"},
        {"root ::= foo\n", "'foo' is used but not defined"},
        {"x ::= \"a\"\n", "no 'root'"},
        {"root ::= \"a\nx", "unterminated"},
        {"root ::= (\"a\"\n", "missing ')'"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"},
        {"root ::= \"a\" }", "unexpected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct err e2 = {0};
        struct gram *b = gram_from_gbnf(bad[i][0], strlen(bad[i][0]), &e2);
        CHECK(!b, "bad gbnf %zu compiled", i);
        CHECK(strstr(e2.msg, bad[i][1]), "bad gbnf %zu: '%s' lacks '%s'", i, e2.msg, bad[i][1]);
        gram_unref(b);
    }
}

static void test_choices(void)
{
    const char *s[] = {"yes", "no", "maybe"};
    size_t l[] = {3, 2, 5};
    struct gram *g = gram_from_choices(s, l, 3, NULL);
    CHECK(accepts(g, "yes") && accepts(g, "maybe") && !accepts(g, "ye") && !accepts(g, "yesno"),
          "choices");
    struct gram_matcher *m = gram_matcher_create(g);
    gram_matcher_accept_bytes(m, "no", 2);
    CHECK(gram_matcher_is_terminated(m), "after a full choice nothing may follow");
    gram_matcher_destroy(m);
    gram_unref(g);
}

/* A compile past the bound fails with an error naming it; within it, it succeeds. */
static void test_compile_timeout(void)
{
    struct err e = {0};
    char re[1024] = ""; /* about 900K symbols */
    for (int i = 0; i < 45; i++) strcat(re, "a{1,9999}");
    gram_set_compile_timeout(1);
    struct gram *g = gram_from_regex(re, strlen(re), &e);
    CHECK(!g, "compiled within 1 ms");
    CHECK(strstr(e.msg, "compiling took longer than 1 ms (--grammar-compile-timeout)"), "%s",
          e.msg);
    gram_unref(g);
    gram_set_compile_timeout(0);
    e = (struct err){0};
    g = gram_from_regex("a{1,999}", 8, &e);
    CHECK(g, "%s", e.msg);
    gram_unref(g);
    gram_set_compile_timeout(GRAM_COMPILE_TIMEOUT_MS);
}

/* Masks against the brute force: every token's bytes tried on the matcher. */
static void test_masks(const char *testdata)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tokenizers/llama3", testdata);
    struct err e = {0};
    struct tok *t = tok_load(dir, &e);
    CHECK(t, "%s", e.msg);
    if (!t) return;
    int32_t V = tok_vocab_size(t), eos = tok_eos_id(t);
    struct gram_vocab *v = gram_vocab_create(t, V, &eos, 1, NULL, &e);
    int words = (V + 31) / 32;
    uint32_t *mask = xmalloc(sizeof *mask * (size_t)words);
    /* later instances of a schema reuse its grammar: states met for the first time there
     * are built from the token sets of positions met before (masks by state and by
     * position: grammar_match.c) */
    static const char *const sch[][3] = {
        {PERSON, "{\"name\": \"Bo\\\"b \xc3\xa9\", \"age\": -30}",
         "{ \"name\" : \"\\u00e9x\" , \"age\" : 7 }"},
        {TREE, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]}]}",
         "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}]}"},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-02-29T12:30:00Z\"",
         "\"1999-12-31T23:59:59.5+01:00\""},
        {"gbnf:root ::= item (\",\" ws item)*\n"
         "item ::= [a-z]+ | \"\\\"\" [^\"]* \"\\\"\" | \"(\" ws root ws \")\"\n"
         "ws ::= \" \"*\n",
         "ab, \"q r\",( c )", "x,((y, \"z\")),w"},
        {"re:(ab|a)*c[0-9]{2,4}", "abac12", "aababc1234"},
    };
    int states = 0;
    for (size_t k = 0; k < sizeof sch / sizeof sch[0]; k++) {
        const char *src = sch[k][0];
        struct gram *g = !strncmp(src, "gbnf:", 5) ? gram_from_gbnf(src + 5, strlen(src + 5), &e)
                         : !strncmp(src, "re:", 3) ? gram_from_regex(src + 3, strlen(src + 3), &e)
                                                   : gram_from_json_schema(src, strlen(src), &e);
        CHECK(g, "grammar %zu: %s", k, e.msg);
        if (!g) continue;
        for (int pass = 0; pass < 5; pass++) {
            /* the third and fourth passes drop the masks cached by state: each state's mask
             * is then built from the token sets its positions got in the first two; the
             * last runs a fresh grammar whose positions were all made ahead (gram_prepare) */
            int r = 1 + pass % 2;
            if (pass == 2) gram_forget_states(g);
            if (pass == 4) {
                struct gram *g2 =
                    !strncmp(src, "gbnf:", 5) ? gram_from_gbnf(src + 5, strlen(src + 5), &e)
                    : !strncmp(src, "re:", 3) ? gram_from_regex(src + 3, strlen(src + 3), &e)
                                              : gram_from_json_schema(src, strlen(src), &e);
                gram_unref(g);
                g = g2;
                gram_prepare(g, v);
            }
            struct gram_matcher *m = gram_matcher_create(g);
            const char *inst = sch[k][r];
            size_t n = strlen(inst);
            for (size_t pos = 0; pos <= n; pos++) {
                gram_matcher_fill_mask(m, v, mask);
                int bad = 0;
                for (int32_t id = 0; id < V && bad < 3; id++) {
                    size_t len;
                    const char *b = gram_vocab_token(v, id, &len);
                    int want = id == eos ? gram_matcher_can_end(m)
                               : b       ? gram_matcher_try_bytes(m, b, len)
                                         : 0;
                    int got = mask[id >> 5] >> (id & 31) & 1;
                    if (want != got) bad++;
                    CHECK(want == got,
                          "schema %zu after %zu bytes: token %d ('%.*s') mask %d, matcher %d", k,
                          pos, id, (int)len, b ? b : "", got, want);
                }
                states++;
                if (pos < n)
                    CHECK(gram_matcher_accept_bytes(m, inst + pos, 1), "instance byte %zu", pos);
            }
            CHECK(gram_matcher_can_end(m), "instance %zu/%d complete", k, r);
            gram_matcher_destroy(m);
        }
        gram_unref(g);
    }
    printf("masks: %d states x %d tokens equal to brute force\n", states, V);
    free(mask);
    gram_vocab_destroy(v);
    tok_destroy(t);
}

/* Masks of states met for the first time under a prepared grammar (gram_prepare: every
 * position's token sets made ahead) against a walk of the whole trie from the state, bit
 * for bit, over every prefix of the conformance suite's valid instances; and no mask
 * computes a position's sets that gram_prepare did not. */
static void test_prepared_masks(const char *testdata)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tokenizers/llama3", testdata);
    struct err e = {0};
    struct tok *t = tok_load(dir, &e);
    CHECK(t, "%s", e.msg);
    if (!t) return;
    int32_t V = tok_vocab_size(t), eos = tok_eos_id(t);
    struct gram_vocab *v = gram_vocab_create(t, V, &eos, 1, NULL, &e);
    int words = (V + 31) / 32;
    uint32_t *mask = xmalloc(sizeof *mask * (size_t)words);
    uint32_t *ref = xmalloc(sizeof *ref * (size_t)words);
    int n_cases = (int)(sizeof cases / sizeof cases[0]), states = 0, grams = 0, worst = -1;
    int largest = -1;
    double worst_ms = 0, largest_ms = 0;
    for (int i = 0; i < n_cases; i++) {
        if (!cases[i].valid) continue;
        struct gram *g = gram_from_json_schema(cases[i].schema, strlen(cases[i].schema), &e);
        CHECK(g, "case %d: %s", i, e.msg);
        if (!g) continue;
        double t0 = util_now();
        gram_prepare(g, v);
        double ms = 1e3 * (util_now() - t0);
        if (ms > worst_ms) worst_ms = ms, worst = i;
        if (largest < 0 || strlen(cases[i].schema) > strlen(cases[largest].schema))
            largest = i, largest_ms = ms;
        int n_pos = gram_n_positions(g, v);
        CHECK(gram_prepare(g, v) == 0, "case %d: prepared twice", i);
        struct gram_matcher *m = gram_matcher_create(g);
        const char *inst = cases[i].inst;
        size_t n = strlen(inst);
        for (size_t k = 0; k <= n; k++) {
            gram_matcher_fill_mask(m, v, mask);
            gram_matcher_walk_mask(m, v, ref);
            CHECK(!memcmp(mask, ref, sizeof *mask * (size_t)words),
                  "case %d after %zu bytes: prepared mask differs from the walk", i, k);
            states++;
            if (k < n) CHECK(gram_matcher_accept_bytes(m, inst + k, 1), "case %d byte %zu", i, k);
        }
        gram_matcher_destroy(m);
        CHECK(gram_n_positions(g, v) == n_pos, "case %d: %d positions made after prepare", i,
              gram_n_positions(g, v) - n_pos);
        gram_unref(g);
        grams++;
    }
    /* a prepare cut short by the compile timeout leaves the rest to the first masks that
     * meet them: still exact, and a later call goes on */
    gram_set_compile_timeout(1);
    struct gram *g = gram_from_json_schema("{}", 2, &e);
    CHECK(g, "{}: %s", e.msg);
    gram_prepare(g, v);
    int cut = gram_n_positions(g, v);
    struct gram_matcher *m = gram_matcher_create(g);
    const char *inst = "{\"a\": [1, \"x\\\"y\", {\"b\": null}], \"c\": -2.5e3}";
    for (size_t k = 0, n = strlen(inst); k <= n; k++) {
        gram_matcher_fill_mask(m, v, mask);
        gram_matcher_walk_mask(m, v, ref);
        CHECK(!memcmp(mask, ref, sizeof *mask * (size_t)words),
              "cut prepare after %zu bytes: mask differs from the walk", k);
        if (k < n) CHECK(gram_matcher_accept_bytes(m, inst + k, 1), "cut prepare byte %zu", k);
    }
    gram_matcher_destroy(m);
    gram_set_compile_timeout(0);
    gram_prepare(g, v);
    printf("prepare cut at 1 ms: %d entries, %d once completed\n", cut, gram_n_positions(g, v));
    gram_unref(g);
    gram_set_compile_timeout(GRAM_COMPILE_TIMEOUT_MS);
    printf("prepared masks: %d states of %d grammars equal to the walk; token sets made in at "
           "most %.1f ms (case %d), %.1f ms for the largest schema (case %d, %zu bytes)\n",
           states, grams, worst_ms, worst, largest_ms, largest,
           largest >= 0 ? strlen(cases[largest].schema) : 0);
    free(mask), free(ref);
    gram_vocab_destroy(v);
    tok_destroy(t);
}

/* Tool specs in Gemma 4's argument syntax: what the grammar accepts, read back by the gemma4
 * tool-call parser, is the JSON the schema describes. */
static void test_gemma_spec(void)
{
    static const char *const spec =
        "{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":2,\"syntax\":\"gemma4\","
        "\"calls\":[{\"prefix\":\"<|tool_call>call:f\",\"suffix\":\"<tool_call|>\",\"schema\":{"
        "\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"a b\",{\"x y\":[1,\"z\"]}]},"
        "\"m\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}},\"arr\":{"
        "\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":0}},\"any\":{}},"
        "\"required\":[\"k\"],\"additionalProperties\":false}}]}";
    static const struct {
        const char *out, *json; /* json NULL: refused */
    } cases[] = {
        {"<|tool_call>call:f{k:<|\"|>a b<|\"|>}<tool_call|>", "{\"k\":\"a b\"}"},
        {"<|tool_call>call:f{k:{<|\"|>x y<|\"|>:[1,<|\"|>z<|\"|>]},m:{<|\"|>any key<|\"|>:<|\"|>v"
         "<|\"|>},arr:[0.5,2],any:{<|\"|>q<|\"|>:[null,true]}}<tool_call|>",
         "{\"k\":{\"x y\":[1,\"z\"]},\"m\":{\"any key\":\"v\"},\"arr\":[0.5,2],\"any\":{\"q\":"
         "[null,true]}}"},
        {"<|tool_call>call:f{\"k\":<|\"|>a b<|\"|>}<tool_call|>", NULL},
        {"<|tool_call>call:f{k:\"a b\"}<tool_call|>", NULL},
        {"<|tool_call>call:f{k:<|\"|>a b<|\"|>, arr:[]}<tool_call|>", NULL},
        {"<|tool_call>call:f{k:<|\"|>a b<|\"|>,arr:[-1]}<tool_call|>", NULL},
    };
    struct err e = {0};
    struct gram *g = gram_from_tool_spec(spec, strlen(spec), &e);
    CHECK(g, "gemma spec: %s", e.msg);
    if (!g) return;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(accepts(g, cases[i].out) == !!cases[i].json, "gemma spec on %s", cases[i].out);
        if (!cases[i].json) continue;
        struct tcall_parser *p = tcall_parser_create(TCALL_GEMMA4, NULL);
        struct tcall_str content = {0};
        tcall_parser_push(p, cases[i].out, strlen(cases[i].out), &content);
        tcall_parser_finish(p, &content);
        CHECK(tcall_parser_n_calls(p) == 1 &&
                  !strcmp(tcall_parser_call(p, 0)->args.p, cases[i].json),
              "gemma read back %s", tcall_parser_n_calls(p) ? tcall_parser_call(p, 0)->args.p : "");
        tcall_str_dispose(&content);
        tcall_parser_destroy(p);
    }
    gram_unref(g);
}

int main(int argc, char **argv)
{
    const char *testdata = argc > 1 ? argv[1] : "../shared/testdata";
    test_schemas();
    test_number_bounds();
    test_bad_schemas();
    test_regex();
    test_gbnf();
    test_choices();
    test_gemma_spec();
    test_compile_timeout();
    test_masks(testdata);
    test_prepared_masks(testdata);
    TEST_DONE();
}
