/* checkpoint/ safetensors: tensor dicts, round trips of every dtype and
 * layout, files built here byte by byte from the format's description (and
 * the reference implementation's own test vectors), and every way a file
 * can break the format's rules. */
#include "ct_test.h"

#include <ct/checkpoint.h>

#include <stdlib.h>
#include <unistd.h>

/* ------------------------------------------------------------ temp files */

/* A safetensors file: the 8-byte little-endian length of header, header,
 * then ndata bytes of data (zeros when data is NULL). */
static const char *st_file(char path[static 256], const char *name, const char *header,
                           const void *data, size_t ndata) {
    size_t hlen = strlen(header), n = 8 + hlen + ndata;
    unsigned char *b = calloc(1, n);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    if (data)
        memcpy(b + 8 + hlen, data, ndata);
    tt_put_file(path, name, b, n);
    free(b);
    return path;
}

/* ----------------------------------------------------------- test data */

/* Fills t's memory (all of it, t contiguous) with bytes from seed: every bit
 * pattern, NaN payloads included, so that a round trip must be bit-exact.
 * Bools get 0 and 1. */
static ct_tensor *fill_bytes(ct_tensor *t, uint64_t seed) {
    unsigned char *p = ct_data_ptr(t);
    size_t n = (size_t)ct_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    uint64_t x = seed * 0x9E3779B97F4A7C15u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = ct_tensor_dtype(t) == CT_BOOL ? (unsigned char)(x & 1) : (unsigned char)x;
    }
    return t;
}

static ct_tensor *filled(int ndim, const int64_t *sizes, ct_dtype dtype, uint64_t seed) {
    return fill_bytes(ct_empty(ndim, sizes, dtype), seed);
}

/* want's bytes in row-major order, gathered through its strides: not with
 * ct_contiguous, whose 16-bit float copies quiet NaN payloads. */
static unsigned char *row_major_bytes(ct_tensor *want) {
    const size_t es = ct_dtype_size(ct_tensor_dtype(want));
    const int64_t n = ct_numel(want);
    const int nd = ct_ndim(want);
    unsigned char *out = malloc((size_t)n * es + 1);
    int64_t idx[CT_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off += idx[d] * ct_stride(want, d);
        memcpy(out + (size_t)i * es, (const char *)ct_data_ptr(want) + off * (int64_t)es, es);
        for (int d = nd - 1; d >= 0 && ++idx[d] == ct_size(want, d); d--)
            idx[d] = 0;
    }
    return out;
}

/* Whether got (contiguous, as a load makes it) holds want's dtype, shape
 * and bytes; reports the first difference. */
static bool same_tensor(const char *name, ct_tensor *got, ct_tensor *want) {
    if (!got) {
        tt_fail(__FILE__, __LINE__, "%s: missing", name);
        return false;
    }
    bool shape = ct_ndim(got) == ct_ndim(want);
    for (int d = 0; shape && d < ct_ndim(want); d++)
        shape = ct_size(got, d) == ct_size(want, d);
    if (ct_tensor_dtype(got) != ct_tensor_dtype(want) || !shape || !ct_is_contiguous(got)) {
        tt_fail(__FILE__, __LINE__, "%s: got %s with %d dims (contiguous: %d), want %s with %d",
                name, ct_dtype_name(ct_tensor_dtype(got)), ct_ndim(got), ct_is_contiguous(got),
                ct_dtype_name(ct_tensor_dtype(want)), ct_ndim(want));
        return false;
    }
    size_t n = (size_t)ct_numel(want) * ct_dtype_size(ct_tensor_dtype(want));
    unsigned char *w = row_major_bytes(want);
    bool same = n == 0 || memcmp(ct_data_ptr(got), w, n) == 0;
    free(w);
    if (!same)
        tt_fail(__FILE__, __LINE__, "%s: the bytes differ", name);
    return same;
}

/* ---------------------------------------------------------- round trips */

TEST(every_dtype_and_layout_round_trips_bit_exact_in_order) {
    ct_tensor_dict *d = ct_tensor_dict_new();
    ASSERT_TRUE(d);
    for (int dt = 0; dt < CT_NDTYPES; dt++) {
        char name[64];
        const char *dn = ct_dtype_name((ct_dtype)dt);
        const uint64_t seed = 8 * (uint64_t)dt;
        ct_tensor *views[] = {
            filled(CT_SHAPE(3, 5), (ct_dtype)dt, seed + 1),
            filled(0, NULL, (ct_dtype)dt, seed + 2),
            ct_empty(CT_SHAPE(2, 0, 3), (ct_dtype)dt),
            ct_transpose(filled(CT_SHAPE(4, 6), (ct_dtype)dt, seed + 3), 0, 1),
            ct_slice(filled(CT_SHAPE(5, 8), (ct_dtype)dt, seed + 4), 1, 1, 7, 2),
            ct_narrow(filled(CT_SHAPE(6, 4, 3), (ct_dtype)dt, seed + 5), 0, 2, 3),
            ct_select(
                ct_permute(filled(CT_SHAPE(2, 3, 4), (ct_dtype)dt, seed + 6), (int[]){2, 0, 1}), 1,
                1),
            ct_expand(filled(CT_SHAPE(1, 5), (ct_dtype)dt, seed + 7), CT_SHAPE(3, 5)),
        };
        static const char *const kinds[] = {"contiguous", "0d",     "empty",  "transposed",
                                            "sliced",     "narrow", "select", "expanded"};
        for (size_t k = 0; k < sizeof views / sizeof *views; k++) {
            snprintf(name, sizeof name, "%s.%s", kinds[k], dn);
            ASSERT_EQ(ct_tensor_dict_add(d, name, views[k]), 0);
        }
    }
    ASSERT_EQ(ct_is_contiguous(ct_tensor_dict_find(d, "transposed.float32")), 0);
    char path[256];
    ASSERT_EQ(ct_safetensors_save(tt_tmp_path(path, "all.safetensors"), d), 0);
    ct_tensor_dict *got = NULL;
    ASSERT_EQ(ct_safetensors_load(path, &got), 0);
    ASSERT_EQ(ct_tensor_dict_count(got), ct_tensor_dict_count(d));
    for (int i = 0; i < ct_tensor_dict_count(d); i++) {
        const char *name = ct_tensor_dict_name(d, i);
        ASSERT_TRUE(strcmp(ct_tensor_dict_name(got, i), name) == 0);
        if (!same_tensor(name, ct_tensor_dict_tensor(got, i), ct_tensor_dict_tensor(d, i)))
            break;
    }
    ASSERT_EQ(ct_tensor_dict_num_meta(got), 0);
    ct_tensor_dict_free(got);
    ct_tensor_dict_free(d);
}

TEST(large_strided_views_round_trip_through_the_write_buffer) {
    /* Bigger than the 1 MiB write buffer: element by element, in rows, and
     * a contiguous tensor written straight from memory. */
    ct_tensor_dict *d = ct_tensor_dict_new();
    ct_tensor *views[] = {
        ct_transpose(filled(CT_SHAPE(700, 600), CT_FLOAT32, 1), 0, 1),
        ct_slice(filled(CT_SHAPE(1000, 800), CT_BFLOAT16, 2), 1, 3, 797, 1),
        ct_expand(filled(CT_SHAPE(1, 300), CT_FLOAT64, 3), CT_SHAPE(500, 300)),
        filled(CT_SHAPE(3, 1 << 18), CT_INT32, 4),
        filled(CT_SHAPE(5), CT_UINT8, 5),
    };
    const char *names[] = {"t", "s", "e", "c", "small"};
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(ct_tensor_dict_add(d, names[i], views[i]), 0);
    char path[256];
    ASSERT_EQ(ct_safetensors_save(tt_tmp_path(path, "large.safetensors"), d), 0);
    ct_tensor_dict *got = NULL;
    ASSERT_EQ(ct_safetensors_load(path, &got), 0);
    for (int i = 0; i < 5; i++)
        if (!same_tensor(names[i], ct_tensor_dict_find(got, names[i]), views[i]))
            break;
    ct_tensor_dict_free(got);
    ct_tensor_dict_free(d);
}

TEST(metadata_round_trips_in_order_with_any_text) {
    ct_tensor_dict *d = ct_tensor_dict_new();
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "format", "np"), 0);
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "unicode",
                                      "na\xc3\xafve \xe2\x80\x93 \xe6\x97\xa5 "
                                      "\xf0\x9f\x98\x80"),
              0);
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "quotes", "a \"b\" \\ c\n\t\x01/"), 0);
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "gone", "soon"), 0);
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "", "empty key"), 0);
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "empty", ""), 0);
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "format", "pt"), 0); /* replaced in place */
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "gone", NULL), 0);
    ASSERT_EQ(ct_tensor_dict_set_meta(d, "never there", NULL), 0);
    ASSERT_EQ(ct_tensor_dict_add(d, "w", ct_ones(CT_SHAPE(2), CT_FLOAT32)), 0);
    const char *keys[] = {"format", "unicode", "quotes", "", "empty"};
    const char *values[] = {"pt", "na\xc3\xafve \xe2\x80\x93 \xe6\x97\xa5 \xf0\x9f\x98\x80",
                            "a \"b\" \\ c\n\t\x01/", "empty key", ""};
    char path[256];
    ASSERT_EQ(ct_safetensors_save(tt_tmp_path(path, "meta.safetensors"), d), 0);
    ct_tensor_dict *got = NULL;
    ASSERT_EQ(ct_safetensors_load(path, &got), 0);
    for (ct_tensor_dict *x = d; x; x = x == d ? got : NULL) {
        ASSERT_EQ(ct_tensor_dict_num_meta(x), 5);
        for (int i = 0; i < 5; i++) {
            const char *k, *v;
            ASSERT_EQ(ct_tensor_dict_meta_at(x, i, &k, &v), 0);
            ASSERT_TRUE(strcmp(k, keys[i]) == 0 && strcmp(v, values[i]) == 0);
            ASSERT_TRUE(strcmp(ct_tensor_dict_meta(x, keys[i]), values[i]) == 0);
        }
        ASSERT_TRUE(ct_tensor_dict_meta(x, "gone") == NULL);
    }
    ct_tensor_dict_free(got);
    ct_tensor_dict_free(d);
}

/* -------------------------------------------------- files built by hand */

/* The reference implementation's test vectors (safetensors/src/tensor.rs:
 * test_serialization, test_serialization_forced_alignement, test_empty):
 * ct reads them and writes the same bytes. */
TEST(the_reference_test_vectors_read_and_write_byte_for_byte) {
    static const float v[] = {0, 1, 2, 3, 4, 5};
    static const struct {
        const char *header;
        const char *name;
        int ndim;
        int64_t sizes[4];
        const char *meta;
    } cases[] = {
        {"{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}",
         "attn.0",
         3,
         {1, 2, 3},
         NULL},
        {"{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ",
         "attn0",
         4,
         {1, 1, 2, 3},
         NULL},
        {"{\"__metadata__\":{\"framework\":\"pt\"}}     ", NULL, 0, {0}, "pt"},
        {"{}      ", NULL, 0, {0}, NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char path[256], mine[256], fname[32];
        snprintf(fname, sizeof fname, "vector%zu", c);
        size_t ndata = cases[c].name ? sizeof v : 0;
        st_file(path, fname, cases[c].header, v, ndata);
        ct_tensor_dict *d = NULL;
        ASSERT_EQ(ct_safetensors_load(path, &d), 0);
        ASSERT_EQ(ct_tensor_dict_count(d), cases[c].name ? 1 : 0);
        if (cases[c].name) {
            ct_tensor *t = ct_tensor_dict_find(d, cases[c].name);
            ASSERT_TRUE(t);
            ASSERT_EQ(ct_tensor_dtype(t), CT_FLOAT32);
            ASSERT_EQ(ct_ndim(t), cases[c].ndim);
            for (int k = 0; k < cases[c].ndim; k++)
                ASSERT_EQ(ct_size(t, k), cases[c].sizes[k]);
            for (int i = 0; i < 6; i++)
                ASSERT_EQ(tt_at(t, i), v[i]);
        }
        const char *meta = ct_tensor_dict_meta(d, "framework");
        ASSERT_TRUE(cases[c].meta ? meta && strcmp(meta, cases[c].meta) == 0 : !meta);

        snprintf(fname, sizeof fname, "vector%zu.mine", c);
        ASSERT_EQ(ct_safetensors_save(tt_tmp_path(mine, fname), d), 0);
        size_t n1 = 0, n2 = 0;
        unsigned char *a = tt_read_file(path, &n1), *b = tt_read_file(mine, &n2);
        bool same = a && b && n1 == n2 && memcmp(a, b, n1) == 0;
        if (!same)
            tt_fail(__FILE__, __LINE__, "vector %zu: ct wrote %zu bytes, the reference %zu: %.*s",
                    c, n2, n1, b ? (int)(n2 > 8 ? n2 - 8 : 0) : 0, b ? (const char *)b + 8 : "");
        free(a);
        free(b);
        ct_tensor_dict_free(d);
        if (!same)
            return;
    }
}

/* Every dtype ct reads, tensors listed in another order than their data,
 * an empty tensor between two others, a 0-d one, an unknown field and
 * padding of mixed whitespace. */
TEST(a_file_built_by_hand_reads_as_the_format_describes) {
    const char *header =
        "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]},"
        "\"__metadata__\":{\"who\":\"hand\"},"
        "\"a\":{\"data_offsets\":[0,8],\"shape\":[],\"dtype\":\"F64\"},"
        "\"empty\":{\"dtype\":\"I32\",\"shape\":[0,3],\"data_offsets\":[12,12]},"
        "\"i\":{\"dtype\":\"I64\",\"shape\":[1,2],\"data_offsets\":[12,28],\"extra\":[1,{}]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[28,30]},"
        "\"f\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[30,34]},"
        "\"j\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[34,38]},"
        "\"u\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[38,40]},"
        "\"q\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[40,43]}"
        "} \n\t\r ";
    static const unsigned char data[43] = {
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0xbf, /* a: -1.5 */
        0x80, 0x3f, 0x40, 0xc0,                         /* b: 1.0, -3.0 in bfloat16 */
        0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* i: -2 */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, /* i: 2^62 */
        0x00, 0x3c,                                     /* h: 1.0 in float16 */
        0x00, 0x00, 0x20, 0x41,                         /* f: 10.0 */
        0x2a, 0x00, 0x00, 0x80,                         /* j: INT32_MIN + 42 */
        0xff, 0x07,                                     /* u: 255, 7 */
        0x01, 0x00, 0x01,                               /* q */
    };
    char path[256];
    ct_tensor_dict *d = NULL;
    ASSERT_EQ(ct_safetensors_load(st_file(path, "hand", header, data, sizeof data), &d), 0);
    static const char *const order[] = {"b", "a", "empty", "i", "h", "f", "j", "u", "q"};
    ASSERT_EQ(ct_tensor_dict_count(d), 9);
    for (int i = 0; i < 9; i++)
        ASSERT_TRUE(strcmp(ct_tensor_dict_name(d, i), order[i]) == 0);
    ct_tensor *a = ct_tensor_dict_find(d, "a"), *b = ct_tensor_dict_find(d, "b"),
              *e = ct_tensor_dict_find(d, "empty"), *in = ct_tensor_dict_find(d, "i");
    ASSERT_EQ(ct_ndim(a), 0);
    ASSERT_EQ(ct_tensor_dtype(a), CT_FLOAT64);
    ASSERT_EQ(ct_item(a), -1.5);
    ASSERT_EQ(ct_tensor_dtype(b), CT_BFLOAT16);
    ASSERT_EQ(tt_at(b, 0), 1.0);
    ASSERT_EQ(tt_at(b, 1), -3.0);
    ASSERT_EQ(ct_ndim(e), 2);
    ASSERT_EQ(ct_size(e, 1), 3);
    ASSERT_EQ(ct_numel(e), 0);
    ASSERT_EQ(ct_tensor_dtype(in), CT_INT64);
    ASSERT_EQ(((int64_t *)ct_data_ptr(in))[0], -2);
    ASSERT_EQ(((int64_t *)ct_data_ptr(in))[1], (int64_t)1 << 62);
    ASSERT_EQ(ct_item(ct_tensor_dict_find(d, "h")), 1.0);
    ASSERT_EQ(ct_item(ct_tensor_dict_find(d, "f")), 10.0);
    ASSERT_EQ(ct_item_int64(ct_tensor_dict_find(d, "j")), INT32_MIN + 42);
    ASSERT_EQ(tt_at(ct_tensor_dict_find(d, "u"), 0), 255);
    ASSERT_EQ(tt_at(ct_tensor_dict_find(d, "u"), 1), 7);
    ASSERT_EQ(ct_tensor_dtype(ct_tensor_dict_find(d, "q")), CT_BOOL);
    ASSERT_TRUE(memcmp(ct_data_ptr(ct_tensor_dict_find(d, "q")), "\x01\x00\x01", 3) == 0);
    ASSERT_TRUE(strcmp(ct_tensor_dict_meta(d, "who"), "hand") == 0);
    ct_tensor_dict_free(d);
}

TEST(empty_tensors_may_share_any_boundary) {
    const char *header = "{\"e0\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                         "\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                         "\"e1\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
                         "\"e2\":{\"dtype\":\"F64\",\"shape\":[0,9223372036854775807],"
                         "\"data_offsets\":[4,4]},"
                         "\"e3\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}";
    char path[256];
    ct_tensor_dict *d = NULL;
    ASSERT_EQ(ct_safetensors_load(st_file(path, "empties", header, "abcd", 4), &d), 0);
    ASSERT_EQ(ct_tensor_dict_count(d), 5);
    ASSERT_EQ(ct_size(ct_tensor_dict_find(d, "e2"), 1), INT64_MAX);
    ct_tensor_dict_free(d);
}

/* --------------------------------------------------------- broken files */

typedef struct bad_header {
    const char *file;
    const char *header;
    size_t ndata;
    int code;
    const char *says[3];
} bad_header;

#define F32_1(offs) "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":" offs "}"

static const bad_header bad_headers[] = {
    /* JSON */
    {"unclosed", "{\"w\":" F32_1("[0,4]"), 4, CT_ECORRUPT, {"not valid JSON"}},
    {"array", "[1, 2]", 0, CT_ECORRUPT, {"JSON object", "begin with '{'"}},
    {"leading_space", " {}", 0, CT_ECORRUPT, {"begin with '{'"}},
    {"empty_header", "", 0, CT_ECORRUPT, {"is empty"}},
    {"garbage_after", "{} x", 0, CT_ECORRUPT, {"header byte 3", "only whitespace"}},
    {"two_objects", "{}{}", 0, CT_ECORRUPT, {"only whitespace"}},
    {"bad_utf8", "{\"w\xff\":" F32_1("[0,4]") "}", 4, CT_ECORRUPT, {"UTF-8", "0xff"}},
    {"overlong_utf8", "{\"\xc0\xaf\":" F32_1("[0,4]") "}", 4, CT_ECORRUPT, {"UTF-8"}},
    {"surrogate_utf8", "{\"\xed\xa0\x80\":" F32_1("[0,4]") "}", 4, CT_ECORRUPT, {"UTF-8"}},
    {"cut_utf8", "{\"w\":" F32_1("[0,4]") "}\xe6\x97", 4, CT_ECORRUPT, {"UTF-8"}},
    {"raw_control", "{\"w\x01x\":" F32_1("[0,4]") "}", 4, CT_ECORRUPT, {"control character 0x01"}},
    {"control_outside", "{\x02}", 0, CT_ECORRUPT, {"control character 0x02"}},
    {"nul_escape", "{\"w\\u0000x\":" F32_1("[0,4]") "}", 4, CT_ENOTSUP, {"\\u0000"}},
    {"bad_escape", "{\"w\\uzz12\":" F32_1("[0,4]") "}", 4, CT_ECORRUPT, {"4 hex digits"}},
    {"lone_surrogate", "{\"w\\udc00\":" F32_1("[0,4]") "}", 4, CT_ECORRUPT, {"not valid JSON"}},
    /* entries */
    {"entry_number", "{\"w\":5}", 0, CT_ECORRUPT, {"tensor 'w'", "a number", "expected an object"}},
    {"no_dtype",
     "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "'dtype' is missing"}},
    {"no_shape",
     "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "'shape' is missing"}},
    {"no_offsets",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "'data_offsets' is missing"}},
    {"dtype_number",
     "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "dtype is a number"}},
    {"dtype_twice",
     "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "'dtype' appears twice"}},
    {"unknown_dtype",
     "{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "unknown dtype \"F33\""}},
    {"lowercase_dtype",
     "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "unknown dtype"}},
    {"f8",
     "{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}",
     4,
     CT_ENOTSUP,
     {"tensor 'w'", "F8_E4M3", "not supported"}},
    {"f8_e5m2",
     "{\"w\":{\"dtype\":\"F8_E5M2\",\"shape\":[4],\"data_offsets\":[0,4]}}",
     4,
     CT_ENOTSUP,
     {"tensor 'w'", "F8_E5M2"}},
    {"u16",
     "{\"w\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
     4,
     CT_ENOTSUP,
     {"tensor 'w'", "U16"}},
    {"i8",
     "{\"w\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
     4,
     CT_ENOTSUP,
     {"tensor 'w'", "I8"}},
    {"u64",
     "{\"w\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
     8,
     CT_ENOTSUP,
     {"tensor 'w'", "U64"}},
    /* shapes */
    {"shape_number",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "shape is a number"}},
    {"shape_negative",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "shape entry 0 is -1 (negative)"}},
    {"shape_fraction",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "shape entry 1 is 1.5 (not an integer)"}},
    {"shape_point_zero",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "1.0 (not an integer)"}},
    {"shape_exponent",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "1e0 (not an integer)"}},
    {"shape_leading_zero",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "leading zero"}},
    {"shape_string",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "shape entry 0 is a string"}},
    {"shape_over_int64",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775808],\"data_offsets\":[0,0]}}",
     0,
     CT_ECORRUPT,
     {"tensor 'w'", "9223372036854775808 (over 2^63 - 1)"}},
    {"shape_huge_digits",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":["
     "1000000000000000000000000000000000000000000000000000000000"
     "0000000000000000000000000000],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "(over 2^63 - 1)"}},
    {"numel_overflow",
     "{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}",
     0,
     CT_ECORRUPT,
     {"tensor 'w'", "more than 2^63 bytes"}},
    {"bytes_overflow",
     "{\"w\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}",
     0,
     CT_ECORRUPT,
     {"tensor 'w'", "more than 2^63 bytes"}},
    {"nine_dims",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
     4,
     CT_ENOTSUP,
     {"tensor 'w'", "9 dims", "at most 8"}},
    {"too_big_for_ct",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1073741824,1073741824,0],\"data_offsets\":[0,0]}}",
     0,
     CT_ENOTSUP,
     {"tensor 'w'", "too large"}},
    /* offsets */
    {"offsets_number",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":0}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "data_offsets is a number"}},
    {"offsets_three",
     "{\"w\":" F32_1("[0,4,4]") "}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "another length"}},
    {"offsets_one", "{\"w\":" F32_1("[4]") "}", 4, CT_ECORRUPT, {"tensor 'w'", "another length"}},
    {"offsets_negative",
     "{\"w\":" F32_1("[-4,0]") "}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "data_offsets[0] is -4 (negative)"}},
    {"offsets_null",
     "{\"w\":" F32_1("[0,null]") "}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "data_offsets[1] is null"}},
    {"offsets_over_int64",
     "{\"w\":" F32_1("[18446744073709551612,18446744073709551616]") "}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "over 2^63 - 1"}},
    {"begin_after_end",
     "{\"w\":" F32_1("[8,4]") "}",
     8,
     CT_ECORRUPT,
     {"tensor 'w'", "[8, 4]", "begin after they end"}},
    {"size_mismatch",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "hold 4 bytes but F32[2] needs 8"}},
    {"past_the_end",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     4,
     CT_ECORRUPT,
     {"tensor 'w'", "end past the 4 bytes"}},
    {"hole_at_start",
     "{\"w\":" F32_1("[4,8]") "}",
     8,
     CT_ECORRUPT,
     {"tensor 'w'", "must begin at byte 0", "hole of 4 bytes"}},
    {"hole_between",
     "{\"a\":" F32_1("[0,4]") ",\"b\":" F32_1("[8,12]") "}",
     12,
     CT_ECORRUPT,
     {"tensor 'b'", "bytes [4, 8) after tensor 'a'", "hole"}},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":" F32_1("[4,8]") "}",
     8,
     CT_ECORRUPT,
     {"tensor 'b'", "overlap tensor 'a'"}},
    {"same_range",
     "{\"a\":" F32_1("[0,4]") ",\"b\":" F32_1("[0,4]") "}",
     4,
     CT_ECORRUPT,
     {"overlap tensor"}},
    {"empty_inside",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
     8,
     CT_ECORRUPT,
     {"tensor 'e'", "overlap tensor 'a'"}},
    {"trailing", "{\"w\":" F32_1("[0,4]") "}", 6, CT_ECORRUPT, {"2 trailing bytes", "tensor 'w'"}},
    {"data_without_tensors", "{}", 3, CT_ECORRUPT, {"3 bytes", "lists no tensors"}},
    /* keys */
    {"duplicate_tensor",
     "{\"a\":" F32_1("[0,4]") ",\"a\":" F32_1("[4,8]") "}",
     8,
     CT_ECORRUPT,
     {"tensor 'a'", "twice"}},
    {"duplicate_metadata",
     "{\"__metadata__\":{},\"__metadata__\":{}}",
     0,
     CT_ECORRUPT,
     {"'__metadata__' twice"}},
    {"duplicate_meta_key",
     "{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}",
     0,
     CT_ECORRUPT,
     {"__metadata__", "'k' twice"}},
    {"metadata_array", "{\"__metadata__\":[]}", 0, CT_ECORRUPT, {"__metadata__ is an array"}},
    {"metadata_null", "{\"__metadata__\":null}", 0, CT_ECORRUPT, {"__metadata__ is null"}},
    {"metadata_number",
     "{\"__metadata__\":{\"k\":1}}",
     0,
     CT_ECORRUPT,
     {"__metadata__ key 'k'", "a number"}},
    {"metadata_nested",
     "{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}",
     0,
     CT_ECORRUPT,
     {"__metadata__ key 'k'", "an object"}},
    {"empty_name", "{\"\":" F32_1("[0,4]") "}", 4, CT_ENOTSUP, {"empty name"}},
};

TEST(every_broken_header_is_refused_naming_the_file_the_tensor_and_the_rule) {
    for (size_t c = 0; c < sizeof bad_headers / sizeof *bad_headers; c++) {
        const bad_header *b = &bad_headers[c];
        char path[256];
        st_file(path, b->file, b->header, NULL, b->ndata);
        ct_tensor_dict *d = (ct_tensor_dict *)&d; /* must be reset */
        ct_errclear();
        int rc = ct_safetensors_load(path, &d);
        const char *msg = ct_errmsg();
        if (rc != b->code || d != NULL) {
            tt_fail(__FILE__, __LINE__, "%s: returned %s (dict %p), expected %s: %s", b->file,
                    ct_errname(rc), (void *)d, ct_errname(b->code), msg);
            continue;
        }
        if (!strstr(msg, path))
            tt_fail(__FILE__, __LINE__, "%s: the message does not name the file: %s", b->file, msg);
        for (int k = 0; k < 3 && b->says[k]; k++)
            if (!strstr(msg, b->says[k]))
                tt_fail(__FILE__, __LINE__, "%s: \"%s\" does not contain \"%s\"", b->file, msg,
                        b->says[k]);
    }
}

TEST(deep_nesting_and_long_names_are_refused_or_read_without_crashing) {
    /* cJSON stops at 1000 levels; the message shows where. */
    size_t depth = 5000;
    char *deep = malloc(2 * depth + 16);
    size_t n = 0;
    n += (size_t)sprintf(deep, "{\"w\":");
    for (size_t i = 0; i < depth; i++)
        deep[n++] = '[';
    for (size_t i = 0; i < depth; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = 0;
    char path[256];
    ASSERT_RC(ct_safetensors_load(st_file(path, "deep", deep, NULL, 0), &(ct_tensor_dict *){NULL}),
              CT_ECORRUPT, path, "not valid JSON");
    free(deep);

    /* A 100 kB name works, and messages show only its start. */
    size_t len = 100000;
    char *header = malloc(len + 128);
    header[0] = '{', header[1] = '"';
    memset(header + 2, 'x', len);
    strcpy(header + 2 + len, "\":" F32_1("[0,4]") "}");
    ct_tensor_dict *d = NULL;
    ASSERT_EQ(ct_safetensors_load(st_file(path, "long", header, NULL, 4), &d), 0);
    ASSERT_EQ(strlen(ct_tensor_dict_name(d, 0)), len);
    ct_tensor_dict_free(d);
    strcpy(header + 2 + len, "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
    ASSERT_RC(ct_safetensors_load(st_file(path, "long_bad", header, NULL, 4), &d), CT_ECORRUPT,
              path, "tensor 'xxxxxxxx", "end past");
    free(header);
}

/* The 8-byte size and what follows it. */
TEST(bad_sizes_and_truncated_files_are_refused) {
    char path[256];
    ct_tensor_dict *d = NULL;
    ASSERT_RC(ct_safetensors_load(tt_put_file(path, "zero", "", 0), &d), CT_ECORRUPT, path,
              "is 0 bytes", "8-byte header size");
    ASSERT_RC(ct_safetensors_load(tt_put_file(path, "three", "\x02\x00\x00", 3), &d), CT_ECORRUPT,
              path, "is 3 bytes");
    ASSERT_TRUE(d == NULL);

    static const struct {
        const char *file;
        uint64_t n;
        const char *says;
    } sizes[] = {
        {"size_2_63", (uint64_t)1 << 63, "9223372036854775808 bytes, over the format's limit"},
        {"size_max", UINT64_MAX, "18446744073709551615 bytes, over"},
        {"size_100MB_plus_1", 100000001, "100000001 bytes, over the format's limit of 100000000"},
        {"size_100MB", 100000000, "100000000 bytes but the file holds only 4"},
        {"size_past_end", 5, "5 bytes but the file holds only 4"},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char b[12] = "........{}  ";
        for (int k = 0; k < 8; k++)
            b[k] = (unsigned char)(sizes[i].n >> (8 * k));
        ASSERT_RC(ct_safetensors_load(tt_put_file(path, sizes[i].file, b, sizeof b), &d),
                  CT_ECORRUPT, path, sizes[i].says);
    }

    /* A file we wrote, cut short anywhere: never a crash, always a clear
     * error. */
    ct_tensor_dict *w = ct_tensor_dict_new();
    ASSERT_EQ(ct_tensor_dict_add(w, "a", filled(CT_SHAPE(3, 4), CT_FLOAT32, 7)), 0);
    ASSERT_EQ(ct_tensor_dict_add(w, "b", filled(CT_SHAPE(5), CT_INT64, 8)), 0);
    ASSERT_EQ(ct_safetensors_save(tt_tmp_path(path, "whole"), w), 0);
    ct_tensor_dict_free(w);
    size_t n;
    unsigned char *whole = tt_read_file(path, &n);
    ASSERT_TRUE(whole && n > 100);
    for (size_t cut = 0; cut < n; cut++) {
        tt_put_file(path, "cut", whole, cut);
        ct_errclear();
        int rc = ct_safetensors_load(path, &d);
        if (rc != CT_ECORRUPT || d || !strstr(ct_errmsg(), path)) {
            tt_fail(__FILE__, __LINE__, "cut at %zu of %zu: %s: %s", cut, n, ct_errname(rc),
                    ct_errmsg());
            break;
        }
    }
    ASSERT_RC(ct_safetensors_load(tt_put_file(path, "cut", whole, n - 1), &d), CT_ECORRUPT, path,
              "tensor 'b'", "end past");
    free(whole);
}

TEST(unreadable_paths_and_bad_arguments_are_reported) {
    char path[256];
    ct_tensor_dict *d = NULL;
    ASSERT_RC(ct_safetensors_load(tt_tmp_path(path, "missing"), &d), CT_EIO, path, "cannot open");
    ASSERT_RC(ct_safetensors_load(tt_tmp_path(path, "."), &d), CT_EIO, path, "not a regular file");
    ASSERT_RC(ct_safetensors_load(NULL, &d), CT_EINVAL, "path is NULL");
    ASSERT_RC(ct_safetensors_load(path, NULL), CT_EINVAL, "out is NULL");

    d = ct_tensor_dict_new();
    ASSERT_EQ(ct_tensor_dict_add(d, "w", ct_ones(CT_SHAPE(2), CT_FLOAT32)), 0);
    ASSERT_RC(ct_safetensors_save(tt_tmp_path(path, "no/such/dir/x.safetensors"), d), CT_EIO, path,
              "cannot create");
    ASSERT_RC(ct_safetensors_save(NULL, d), CT_EINVAL, "path is NULL");
    ASSERT_RC(ct_safetensors_save(tt_tmp_path(path, "x"), NULL), CT_EINVAL, "dict is NULL");
    /* Saving over a file replaces it and leaves no temporary behind. */
    ASSERT_EQ(ct_safetensors_save(tt_tmp_path(path, "again"), d), 0);
    ASSERT_EQ(ct_tensor_dict_add(d, "v", ct_zeros(CT_SHAPE(3), CT_INT32)), 0);
    ASSERT_EQ(ct_safetensors_save(path, d), 0);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ASSERT_TRUE(access(tmp, F_OK) != 0);
    ct_tensor_dict *got = NULL;
    ASSERT_EQ(ct_safetensors_load(path, &got), 0);
    ASSERT_EQ(ct_tensor_dict_count(got), 2);
    ct_tensor_dict_free(got);
    ct_tensor_dict_free(d);
}

/* ----------------------------------------------------------- tensor dict */

TEST(a_dict_checks_its_handle_names_and_tensors) {
    ct_tensor_dict *d = ct_tensor_dict_new();
    ct_tensor *t = ct_ones(CT_SHAPE(2), CT_FLOAT32);
    ASSERT_RC(ct_tensor_dict_add(NULL, "w", t), CT_EINVAL, "tensor_dict_add", "NULL");
    ASSERT_RC(ct_tensor_dict_count(NULL), CT_EINVAL, "NULL");
    long junk[16] = {0};
    ct_tensor_dict *foreign = (ct_tensor_dict *)junk;
    ASSERT_RC(ct_tensor_dict_count(foreign), CT_EINVAL, "not a live tensor dict");
    ASSERT_RC(ct_tensor_dict_set_meta(foreign, "k", "v"), CT_EINVAL, "not a live tensor dict");
    ASSERT_FAILS(ct_tensor_dict_name(foreign, 0), CT_EINVAL, "not a live tensor dict");
    ASSERT_RC(ct_tensor_dict_add(d, NULL, t), CT_EINVAL, "name is NULL");
    ASSERT_RC(ct_tensor_dict_add(d, "", t), CT_EINVAL, "name is empty");
    ASSERT_RC(ct_tensor_dict_add(d, "__metadata__", t), CT_EINVAL, "reserved");
    ASSERT_RC(ct_tensor_dict_add(d, "bad\xff", t), CT_EINVAL, "not valid UTF-8");
    ASSERT_RC(ct_tensor_dict_add(d, "w", NULL), CT_EINVAL, "'w' is NULL");
    ASSERT_RC(ct_tensor_dict_add(d, "w", (ct_tensor *)junk), CT_EINVAL, "not a live tensor");
    ASSERT_EQ(ct_tensor_dict_add(d, "w", t), 0);
    ASSERT_RC(ct_tensor_dict_add(d, "w", t), CT_EINVAL, "already has a tensor named 'w'");
    /* A failed op's NULL keeps the op's error. */
    ct_errclear();
    ASSERT_EQ(ct_tensor_dict_add(d, "v", ct_view(t, CT_SHAPE(3))), CT_ESHAPE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "view");
    ASSERT_EQ(ct_tensor_dict_count(d), 1);
    ASSERT_FAILS(ct_tensor_dict_name(d, 1), CT_ERANGE, "index 1", "has 1 tensors");
    ASSERT_FAILS(ct_tensor_dict_tensor(d, -1), CT_ERANGE, "index -1");
    ASSERT_RC(ct_tensor_dict_meta_at(d, 0, NULL, NULL), CT_ERANGE, "0 metadata entries");
    ASSERT_RC(ct_tensor_dict_set_meta(d, NULL, "v"), CT_EINVAL, "key is NULL");
    ASSERT_RC(ct_tensor_dict_set_meta(d, "k", "\xc0\x80"), CT_EINVAL, "value", "UTF-8");
    ct_errclear();
    ASSERT_TRUE(ct_tensor_dict_find(d, "nope") == NULL);
    ASSERT_TRUE(ct_tensor_dict_meta(d, "nope") == NULL);
    ASSERT_EQ(ct_errcode(), CT_OK);
    ct_tensor_dict_free(d);
    ct_tensor_dict_free(NULL);
}

TEST(a_dict_keeps_its_tensors_alive_and_finds_many_names) {
    ct_tensor_dict *d = ct_tensor_dict_new();
    ct_scope_begin();
    ASSERT_EQ(ct_tensor_dict_add(d, "kept", ct_full(CT_SHAPE(3), 2.5, CT_FLOAT32)), 0);
    ct_scope_end();
    ASSERT_EQ(tt_at(ct_tensor_dict_find(d, "kept"), 2), 2.5);

    ct_tensor *one = ct_scalar(1, CT_INT64);
    enum { N = 5000 };
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer.%d.weight", i);
        ASSERT_EQ(ct_tensor_dict_add(d, name, one), 0);
    }
    ASSERT_EQ(ct_tensor_dict_count(d), N + 1);
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer.%d.weight", i);
        ASSERT_TRUE(ct_tensor_dict_find(d, name) == one);
        ASSERT_TRUE(strcmp(ct_tensor_dict_name(d, i + 1), name) == 0);
    }
    for (int i = 0; i < N; i++) {
        char k[32], v[32];
        snprintf(k, sizeof k, "k%d", i);
        snprintf(v, sizeof v, "v%d", i);
        ASSERT_EQ(ct_tensor_dict_set_meta(d, k, v), 0);
    }
    for (int i = 0; i < N; i += 2) {
        char k[32];
        snprintf(k, sizeof k, "k%d", i);
        ASSERT_EQ(ct_tensor_dict_set_meta(d, k, NULL), 0);
    }
    ASSERT_EQ(ct_tensor_dict_num_meta(d), N / 2);
    for (int i = 0; i < N; i++) {
        char k[32], v[32];
        snprintf(k, sizeof k, "k%d", i);
        snprintf(v, sizeof v, "v%d", i);
        const char *got = ct_tensor_dict_meta(d, k);
        ASSERT_TRUE(i % 2 ? got && strcmp(got, v) == 0 : got == NULL);
    }
    const char *k;
    ASSERT_EQ(ct_tensor_dict_meta_at(d, 0, &k, NULL), 0);
    ASSERT_TRUE(strcmp(k, "k1") == 0);

    /* Saved and loaded, the order and every name survive. */
    char path[256];
    ASSERT_EQ(ct_safetensors_save(tt_tmp_path(path, "many"), d), 0);
    ct_tensor_dict *got = NULL;
    ASSERT_EQ(ct_safetensors_load(path, &got), 0);
    ASSERT_EQ(ct_tensor_dict_count(got), N + 1);
    ASSERT_EQ(ct_tensor_dict_num_meta(got), N / 2);
    for (int i = 0; i <= N; i++)
        ASSERT_TRUE(strcmp(ct_tensor_dict_name(got, i), ct_tensor_dict_name(d, i)) == 0);
    ct_tensor_dict_free(got);
    ct_tensor_dict_free(d);
}
