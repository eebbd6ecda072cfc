/* pc_relocate.c — moving a blob's cells to other positions, re-rotating K for RoPE.
 *
 * Mirrors llama.cpp's K-shift (llama_kv_cache::build_rope_shift → ggml_rope_ext, CPU kernel
 * ggml_compute_forward_rope_flt in ggml-cpu/ops.cpp) with YaRN off: pair i of a head turns by
 * theta_i = freq_scale * delta * theta_scale^i, theta_scale = freq_base^(-2/n_rot), the power
 * taken by repeated float multiplication as ggml does. Differences from ggml, chosen so that the
 * numpy fallback can reproduce every byte: cos/sin and the power are computed in double and
 * rounded to float (ggml: cosf/sinf/powf), products are never fused (build with
 * -ffp-contract=off), and a NaN result is written as one canonical NaN. The result stays
 * within an F16 ulp of llama.cpp's own shift (measured: max 1 ulp, ~0.01% of elements differ). */
#include "pc_blob.h"

#include <math.h>

#define PC_MAX_HEAD 65536  /* bound on n_head_kv and head_dim, keeps row sizes far from overflow */
#define PC_TYPE_F32 0      /* ggml_type values */
#define PC_TYPE_F16 1

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The conversions below are written without branches (selects are masks), so that the loops
 * over a head's elements vectorize. */
static inline uint32_t select_u32(uint32_t take_a, uint32_t a, uint32_t b) {
    const uint32_t mask = 0u - take_a; /* take_a is 0 or 1 */
    return (a & mask) | (b & ~mask);
}

/* Exact F16 -> F32 (M. Maratyszcza's FP16 library, as ggml's scalar fallback). */
static inline float f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t) h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = f32_from_bits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
    const float denormalized = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    return f32_from_bits(sign | select_u32(two_w < (1u << 27), f32_bits(denormalized), f32_bits(normalized)));
}

/* F32 -> F16 rounding to nearest even, like numpy's astype(float16) and the F16C instruction;
 * a NaN becomes 0x7e00 with its sign (same source as f16_to_f32). */
static inline uint16_t f32_to_f16(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t bias = select_u32((shl1_w & 0xff000000u) < 0x71000000u, 0x71000000u, shl1_w & 0xff000000u);
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    return (uint16_t) ((sign >> 16) | select_u32(shl1_w > 0xff000000u, 0x7e00u, nonsign));
}

/* A NaN result becomes the one quiet NaN 0x7fc00000: which payload an operation on two NaNs
 * keeps depends on operand order, which compilers and numpy's SIMD loops choose freely. */
static inline float nan_canonical(float y) {
    return f32_from_bits(select_u32(y == y, f32_bits(y), 0x7fc00000u));
}

static int rope_valid(const pc_rope_params *p) {
    if (p->n_head_kv <= 0 || p->n_head_kv > PC_MAX_HEAD) return 0;
    if (p->head_dim <= 0 || p->head_dim > PC_MAX_HEAD) return 0;
    if (p->n_rot <= 0 || p->n_rot % 2 || p->n_rot > p->head_dim || p->n_rot > PC_MAX_ROT) return 0;
    if (p->mode != PC_ROPE_NORMAL && p->mode != PC_ROPE_NEOX) return 0;
    if (!isfinite(p->freq_base) || !(p->freq_base > 0.0f)) return 0;
    if (!isfinite(p->freq_scale) || !(p->freq_scale > 0.0f)) return 0;
    return 1;
}

/* Every K record must be F16/F32 with rows of n_head_kv * head_dim elements. */
static int k_layers_check(const uint8_t *blob, size_t size, const pc_section *sec, const pc_rope_params *p) {
    pc_reader r = { blob, size, sec->data_off + 8 };
    const uint64_t n_el = (uint64_t) p->n_head_kv * (uint64_t) p->head_dim;
    for (uint32_t il = 0; il < sec->n_layer; ++il) {
        pc_layer rec;
        if (pc_layer_read(&r, sec->n_cell, 0, &rec) != PC_OK) return PC_ERR_CORRUPT; /* parsed before */
        if (rec.type != PC_TYPE_F32 && rec.type != PC_TYPE_F16) return PC_ERR_UNSUPPORTED;
        if (rec.row_size != n_el * (rec.type == PC_TYPE_F16 ? 2u : 4u)) return PC_ERR_ARGUMENT;
    }
    return PC_OK;
}

void pc_rope_plan_make(int32_t delta, const pc_rope_params *p, pc_rope_plan *pl) {
    const float theta_scale = (float) pow((double) p->freq_base, (double) (-2.0f / (float) p->n_rot));
    float theta = (float) delta;
    pl->n_pairs = p->n_rot / 2;
    pl->neox = p->mode == PC_ROPE_NEOX;
    for (int32_t i = 0; i < pl->n_pairs; ++i) {
        const float angle = p->freq_scale * theta;
        pl->cos_t[i] = (float) cos((double) angle);
        pl->sin_t[i] = (float) sin((double) angle);
        theta *= theta_scale;
    }
}

static inline uint16_t load_u16(const uint8_t *p) { return (uint16_t) (p[0] | p[1] << 8); }

static inline void store_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t) v; p[1] = (uint8_t) (v >> 8); }

/* Turns the pairs of one head held as floats, x into y. Each step is a loop over contiguous
 * elements with no branch, so that compilers vectorize it: rotation is the hot path of a
 * document prompt (measured: 4x faster than indexing the pairs one by one). */
static void rotate_floats(const float *x, float *y, const pc_rope_plan *pl) {
    const int32_t n = pl->n_pairs;
    if (pl->neox) {
        for (int32_t i = 0; i < n; ++i) {
            y[i] = x[i] * pl->cos_t[i] - x[i + n] * pl->sin_t[i];
            y[i + n] = x[i] * pl->sin_t[i] + x[i + n] * pl->cos_t[i];
        }
    } else {
        for (int32_t i = 0; i < n; ++i) {
            y[2 * i] = x[2 * i] * pl->cos_t[i] - x[2 * i + 1] * pl->sin_t[i];
            y[2 * i + 1] = x[2 * i] * pl->sin_t[i] + x[2 * i + 1] * pl->cos_t[i];
        }
    }
}

static void rotate_heads_f16(uint8_t *heads, size_t n_head, size_t head_bytes, const pc_rope_plan *pl) {
    float x[PC_MAX_ROT], y[PC_MAX_ROT];
    const int32_t n_rot = 2 * pl->n_pairs;
    for (size_t h = 0; h < n_head; ++h) {
        uint8_t *head = heads + h * head_bytes;
        for (int32_t j = 0; j < n_rot; ++j) x[j] = f16_to_f32(load_u16(head + 2 * j));
        rotate_floats(x, y, pl);
        for (int32_t j = 0; j < n_rot; ++j) store_u16(head + 2 * j, f32_to_f16(nan_canonical(y[j])));
    }
}

/* The F16C path (below): the software conversions were most of a relocation's time. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stdlib.h>
#define PC_F16C_PATH 1

/* Pairs side by side (rope "normal", as llama's): 8 elements are 4 pairs, turned in registers
 * against each pair's cos twice and its sin negated then kept, the pair's elements swapped:
 * x*c + y*(-s) is x*c - y*s exactly (a sign flip and IEEE subtraction), y*c + x*s is x*s + y*c. */
__attribute__((target("avx,f16c")))
static void rotate_pairs_f16c(uint8_t *heads, size_t n_head, size_t head_bytes, const pc_rope_plan *pl,
                              __m256 canonical_nan) {
    float cc[PC_MAX_ROT], ss[PC_MAX_ROT];
    const int32_t n_rot = 2 * pl->n_pairs;
    for (int32_t i = 0; i < pl->n_pairs; ++i) {
        cc[2 * i] = cc[2 * i + 1] = pl->cos_t[i];
        ss[2 * i] = -pl->sin_t[i];
        ss[2 * i + 1] = pl->sin_t[i];
    }
    for (size_t h = 0; h < n_head; ++h) {
        uint8_t *head = heads + h * head_bytes;
        for (int32_t j = 0; j < n_rot; j += 8) {
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (head + 2 * j)));
            const __m256 swapped = _mm256_permute_ps(x, 0xB1);
            const __m256 y = _mm256_add_ps(_mm256_mul_ps(x, _mm256_loadu_ps(cc + j)),
                                           _mm256_mul_ps(swapped, _mm256_loadu_ps(ss + j)));
            const __m256 canon = _mm256_blendv_ps(canonical_nan, y, _mm256_cmp_ps(y, y, _CMP_ORD_Q));
            _mm_storeu_si128((__m128i *) (head + 2 * j), _mm256_cvtps_ph(canon, _MM_FROUND_TO_NEAREST_INT));
        }
    }
}

/* Halves apart (rope "neox", as Qwen's): element i pairs with i + n_pairs, 8 pairs at a time,
 * in rotate_floats' order of operations. */
__attribute__((target("avx,f16c")))
static void rotate_halves_f16c(uint8_t *heads, size_t n_head, size_t head_bytes, const pc_rope_plan *pl,
                               __m256 canonical_nan) {
    const int32_t n = pl->n_pairs;
    for (size_t h = 0; h < n_head; ++h) {
        uint8_t *head = heads + h * head_bytes;
        for (int32_t i = 0; i < n; i += 8) {
            const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (head + 2 * i)));
            const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (head + 2 * (i + n))));
            const __m256 c = _mm256_loadu_ps(pl->cos_t + i), s = _mm256_loadu_ps(pl->sin_t + i);
            const __m256 y_lo = _mm256_sub_ps(_mm256_mul_ps(lo, c), _mm256_mul_ps(hi, s));
            const __m256 y_hi = _mm256_add_ps(_mm256_mul_ps(lo, s), _mm256_mul_ps(hi, c));
            const __m256 canon_lo = _mm256_blendv_ps(canonical_nan, y_lo, _mm256_cmp_ps(y_lo, y_lo, _CMP_ORD_Q));
            const __m256 canon_hi = _mm256_blendv_ps(canonical_nan, y_hi, _mm256_cmp_ps(y_hi, y_hi, _CMP_ORD_Q));
            _mm_storeu_si128((__m128i *) (head + 2 * i), _mm256_cvtps_ph(canon_lo, _MM_FROUND_TO_NEAREST_INT));
            _mm_storeu_si128((__m128i *) (head + 2 * (i + n)), _mm256_cvtps_ph(canon_hi, _MM_FROUND_TO_NEAREST_INT));
        }
    }
}

/* The rotation with the F16 conversions done by the F16C instructions, 8 elements at a time,
 * where the CPU has them (every x86-64 CPU since 2012): they round to nearest even and convert
 * exactly, as f16_to_f32/f32_to_f16 do, and products stay unfused (no FMA in this target), so
 * the bytes are the same. Heads whose rotated part is a whole number of 8-element steps turn
 * in registers (rotate_pairs_f16c, rotate_halves_f16c): the scalar pair loop was most of an
 * assemble's time (a ~4K-token SmolLM2 prompt: 79 ms on one thread, bench/RESULTS.md). */
__attribute__((target("avx,f16c")))
static void rotate_heads_f16_f16c(uint8_t *heads, size_t n_head, size_t head_bytes, const pc_rope_plan *pl) {
    float x[PC_MAX_ROT], y[PC_MAX_ROT];
    const int32_t n_rot = 2 * pl->n_pairs;
    const __m256 canonical_nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    if (!pl->neox && n_rot % 8 == 0) {
        rotate_pairs_f16c(heads, n_head, head_bytes, pl, canonical_nan);
        return;
    }
    if (pl->neox && pl->n_pairs % 8 == 0) {
        rotate_halves_f16c(heads, n_head, head_bytes, pl, canonical_nan);
        return;
    }
    for (size_t h = 0; h < n_head; ++h) {
        uint8_t *head = heads + h * head_bytes;
        int32_t j = 0;
        for (; j + 8 <= n_rot; j += 8)
            _mm256_storeu_ps(x + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (head + 2 * j))));
        for (; j < n_rot; ++j) x[j] = f16_to_f32(load_u16(head + 2 * j));
        rotate_floats(x, y, pl);
        for (j = 0; j + 8 <= n_rot; j += 8) {
            const __m256 v = _mm256_loadu_ps(y + j);
            const __m256 canon = _mm256_blendv_ps(canonical_nan, v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
            _mm_storeu_si128((__m128i *) (head + 2 * j), _mm256_cvtps_ph(canon, _MM_FROUND_TO_NEAREST_INT));
        }
        for (; j < n_rot; ++j) store_u16(head + 2 * j, f32_to_f16(nan_canonical(y[j])));
    }
}

/* True when the F16C path may run: the CPU (and OS) support it and PC_NATIVE_PORTABLE is not set
 * (the tests set it to check that both paths write the same bytes). */
static int use_f16c(void) {
    static int supported = -1;
    const char *portable = getenv("PC_NATIVE_PORTABLE");
    if (portable && *portable && strcmp(portable, "0") != 0) return 0;
    if (supported < 0) {
        __builtin_cpu_init();
        supported = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    }
    return supported;
}
#endif

static void rotate_heads_f32(uint8_t *heads, size_t n_head, size_t head_bytes, const pc_rope_plan *pl) {
    float x[PC_MAX_ROT], y[PC_MAX_ROT];
    const int32_t n_rot = 2 * pl->n_pairs;
    for (size_t h = 0; h < n_head; ++h) {
        uint8_t *head = heads + h * head_bytes;
        for (int32_t j = 0; j < n_rot; ++j) x[j] = f32_from_bits(pc_le32(head + 4 * j));
        rotate_floats(x, y, pl);
        for (int32_t j = 0; j < n_rot; ++j) pc_put_le32(head + 4 * j, f32_bits(nan_canonical(y[j])));
    }
}

void pc_rotate_rows(uint8_t *rows, size_t n_cell, int32_t k_type, const pc_rope_params *p,
                    const pc_rope_plan *plan) {
    const size_t el = k_type == PC_TYPE_F16 ? 2 : 4;
    const size_t n_head = n_cell * (size_t) p->n_head_kv;
#ifdef PC_F16C_PATH
    if (el == 2 && use_f16c()) {
        rotate_heads_f16_f16c(rows, n_head, (size_t) p->head_dim * el, plan);
        return;
    }
#endif
    if (el == 2) rotate_heads_f16(rows, n_head, (size_t) p->head_dim * el, plan);
    else rotate_heads_f32(rows, n_head, (size_t) p->head_dim * el, plan);
}

/* Rotates every head of every K row of a checked section. */
static void k_layers_rotate(uint8_t *blob, size_t size, const pc_section *sec, const pc_rope_params *p,
                            int32_t delta) {
    pc_rope_plan plan;
    pc_rope_plan_make(delta, p, &plan);
    pc_reader r = { blob, size, sec->data_off + 8 };
    for (uint32_t il = 0; il < sec->n_layer; ++il) {
        pc_layer rec;
        pc_layer_read(&r, sec->n_cell, 0, &rec);
        pc_rotate_rows(blob + (rec.data - blob), sec->n_cell, rec.type, p, &plan); /* the same bytes, writable */
    }
}

static void positions_shift(uint8_t *blob, const pc_layout *lay, const pc_section *sec, int32_t delta) {
    const size_t rec = pc_cell_bytes(lay->cell_ext);
    for (uint32_t i = 0; i < sec->n_cell; ++i) {
        uint8_t *p = blob + sec->cells_off + (size_t) i * rec;
        pc_put_le32(p, (uint32_t) ((int32_t) pc_le32(p) + delta));
    }
}

int pc_relocate_check(const uint8_t *blob, size_t size, const pc_layout *lay, int32_t delta,
                      const pc_rope_params *ropes, uint32_t n_ropes) {
    int rc;
    if (lay->cell_ext) return PC_ERR_UNSUPPORTED;
    if (n_ropes == 1 && lay->n_section > 1) return PC_ERR_UNSUPPORTED; /* one rope cannot serve two caches */
    if (!ropes || n_ropes != lay->n_section) return PC_ERR_ARGUMENT;
    for (uint32_t s = 0; s < lay->n_section; ++s) {
        const pc_section *sec = &lay->sec[s];
        if (!rope_valid(&ropes[s])) return PC_ERR_ARGUMENT;
        if (sec->n_cell == 0) continue;
        if ((int64_t) sec->pos_min + delta < 0 || (int64_t) sec->pos_max + delta > INT32_MAX) return PC_ERR_ARGUMENT;
        if ((rc = k_layers_check(blob, size, sec, &ropes[s])) != PC_OK) return rc;
    }
    return PC_OK;
}

int pc_state_relocate(uint8_t *blob, size_t size, int32_t delta, const pc_rope_params *ropes, uint32_t n_ropes) {
    pc_layout lay;
    int rc;
    if (!blob) return PC_ERR_ARGUMENT;
    if ((rc = pc_layout_parse(blob, size, &lay)) != PC_OK) return rc;
    /* Validate every section before changing a byte. */
    if ((rc = pc_relocate_check(blob, size, &lay, delta, ropes, n_ropes)) != PC_OK) return rc;
    if (delta == 0) return PC_OK;
    for (uint32_t s = 0; s < lay.n_section; ++s) {
        const pc_section *sec = &lay.sec[s];
        if (sec->n_cell == 0) continue;
        positions_shift(blob, &lay, sec, delta);
        k_layers_rotate(blob, size, sec, &ropes[s], delta);
    }
    return PC_OK;
}
