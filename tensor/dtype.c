/* dtypes: sizes, names, promotion, 16-bit float conversion and casts. */
#include "tensor_impl.h"

#include <math.h>

const size_t ct__tensor_dtype_sizes[CT_NDTYPES] = {
#define CT__DTYPE_SIZE(NAME, name, size) size,
    CT_DTYPE_MAP(CT__DTYPE_SIZE)
#undef CT__DTYPE_SIZE
};

static const char *const dtype_name[] = {
#define CT__DTYPE_NAME(NAME, name, size) #name,
    CT_DTYPE_MAP(CT__DTYPE_NAME)
#undef CT__DTYPE_NAME
};

size_t ct_dtype_size(ct_dtype dtype) {
    return (unsigned)dtype < CT_NDTYPES ? ct__tensor_dtype_sizes[dtype] : 0;
}

const char *ct_dtype_name(ct_dtype dtype) {
    return (unsigned)dtype < CT_NDTYPES ? dtype_name[dtype] : "invalid-dtype";
}

bool ct_dtype_is_float(ct_dtype dtype) {
    return dtype == CT_FLOAT32 || dtype == CT_FLOAT64 || dtype == CT_BFLOAT16 ||
           dtype == CT_FLOAT16;
}

/* Rank in the promotion lattice; the 16-bit floats share a rank. */
static int promote_rank(ct_dtype d) {
    static const int rank[] = {
        [CT_BOOL] = 0,     [CT_UINT8] = 1,   [CT_INT32] = 2,   [CT_INT64] = 3,
        [CT_BFLOAT16] = 4, [CT_FLOAT16] = 4, [CT_FLOAT32] = 5, [CT_FLOAT64] = 6,
    };
    return rank[d];
}

ct_dtype ct_promote_types(ct_dtype a, ct_dtype b) {
    if (a == b)
        return a;
    int ra = promote_rank(a), rb = promote_rank(b);
    if (ra == rb)
        return CT_FLOAT32; /* float16 with bfloat16 */
    return ra > rb ? a : b;
}

/* IEEE binary16 conversion with round-to-nearest-even, written for clarity;
 * hot loops over float16 data convert once per element. */
float ct__tensor_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else {
        /* Subnormal: renormalise. */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ct__tensor_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u)
        return sign | 0x7e00u; /* NaN */
    if (absu >= 0x477ff000u)
        return sign | 0x7c00u; /* overflow to inf (includes inf) */
    if (absu < 0x38800000u) {
        /* Result is subnormal or zero: shift the mantissa with rounding. */
        if (absu < 0x33000000u)
            return sign;
        uint32_t e = absu >> 23, m = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t half = 1u << (shift - 1), rem = m & ((1u << shift) - 1);
        uint32_t r = m >> shift;
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = absu - 0x38000000u; /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

double ct__tensor_load_double(ct_dtype dtype, const void *p) {
    switch (dtype) {
    case CT_FLOAT32: return *(const float *)p;
    case CT_FLOAT64: return *(const double *)p;
    case CT_BFLOAT16: return ct__bf16_to_f32(*(const uint16_t *)p);
    case CT_FLOAT16: return ct__tensor_f16_to_f32(*(const uint16_t *)p);
    case CT_INT64: return (double)*(const int64_t *)p;
    case CT_INT32: return *(const int32_t *)p;
    case CT_UINT8: return *(const uint8_t *)p;
    case CT_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    case CT_NDTYPES: break;
    }
    CT_ASSERT(!"bad dtype");
}

void ct__tensor_store_double(ct_dtype dtype, void *p, double v) {
    switch (dtype) {
    case CT_FLOAT32: *(float *)p = (float)v; return;
    case CT_FLOAT64: *(double *)p = v; return;
    case CT_BFLOAT16: *(uint16_t *)p = ct__f32_to_bf16((float)v); return;
    case CT_FLOAT16: *(uint16_t *)p = ct__tensor_f32_to_f16((float)v); return;
    case CT_INT64: *(int64_t *)p = (int64_t)v; return;
    case CT_INT32: *(int32_t *)p = (int32_t)v; return;
    case CT_UINT8: *(uint8_t *)p = (uint8_t)(int64_t)v; return;
    case CT_BOOL: *(uint8_t *)p = v != 0.0; return;
    case CT_NDTYPES: break;
    }
    CT_ASSERT(!"bad dtype");
}

/* One loop per (to, from) pair, through each dtype's compute type, so that
 * contiguous casts vectorize. */
#define CT__CAST_LOOP(TO, FROM)                                                                    \
    static void cast_##TO##_##FROM(void *ctx, char **data, const int64_t *strides, int64_t n) {    \
        (void)ctx;                                                                                 \
        char *out = data[0];                                                                       \
        const char *in = data[1];                                                                  \
        int64_t so = strides[0], si = strides[1];                                                  \
        for (int64_t i = 0; i < n; i++)                                                            \
            *(CT__T_##TO *)(out + i * so) =                                                        \
                CT__OUT_##TO(CT__IN_##FROM(*(const CT__T_##FROM *)(in + i * si)));                 \
    }

#define CT__CAST_ROW(FROM)                                                                         \
    CT__CAST_LOOP(FLOAT32, FROM)                                                                   \
    CT__CAST_LOOP(FLOAT64, FROM)                                                                   \
    CT__CAST_LOOP(BFLOAT16, FROM)                                                                  \
    CT__CAST_LOOP(FLOAT16, FROM)                                                                   \
    CT__CAST_LOOP(INT64, FROM)                                                                     \
    CT__CAST_LOOP(INT32, FROM)                                                                     \
    CT__CAST_LOOP(UINT8, FROM)                                                                     \
    CT__CAST_LOOP(BOOL, FROM)
CT__ALL_DTYPES(CT__CAST_ROW)

/* Rows in ct_dtype order: FLOAT32, FLOAT64, BFLOAT16, FLOAT16, INT64, INT32,
 * UINT8, BOOL. */
#define CT__CAST_ENTRIES(TO)                                                                       \
    {cast_##TO##_FLOAT32, cast_##TO##_FLOAT64, cast_##TO##_BFLOAT16, cast_##TO##_FLOAT16,          \
     cast_##TO##_INT64,   cast_##TO##_INT32,   cast_##TO##_UINT8,    cast_##TO##_BOOL},
static const ct__loop_fn cast_table[CT_NDTYPES][CT_NDTYPES] = {CT__ALL_DTYPES(CT__CAST_ENTRIES)};

/* A copy within one dtype moves bits: through the compute type, a 16-bit
 * NaN's payload would not survive. */
#define CT__COPY_LOOP(BITS)                                                                        \
    static void copy_##BITS(void *ctx, char **data, const int64_t *strides, int64_t n) {           \
        (void)ctx;                                                                                 \
        for (int64_t i = 0; i < n; i++)                                                            \
            *(uint##BITS##_t *)(data[0] + i * strides[0]) =                                        \
                *(const uint##BITS##_t *)(data[1] + i * strides[1]);                               \
    }
CT__COPY_LOOP(8)
CT__COPY_LOOP(16)
CT__COPY_LOOP(32)
CT__COPY_LOOP(64)

ct__loop_fn ct__cpu_cast_kernel(ct_dtype to, ct_dtype from) {
    if (to != from)
        return cast_table[to][from];
    switch (ct__esize(to)) {
    case 1: return copy_8;
    case 2: return copy_16;
    case 4: return copy_32;
    default: return copy_64;
    }
}
