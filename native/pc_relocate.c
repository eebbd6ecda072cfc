/* pc_relocate.c — moving a blob's cells to other positions, re-rotating K for RoPE.
 *
 * Mirrors llama.cpp's K-shift (llama_kv_cache::build_rope_shift → ggml_rope_ext, CPU kernel
 * ggml_compute_forward_rope_flt in ggml-cpu/ops.cpp) with YaRN off: pair i of a head turns by
 * theta_i = freq_scale * delta * theta_scale^i, theta_scale = freq_base^(-2/n_rot), the power
 * taken by repeated float multiplication as ggml does. Differences from ggml, chosen so that the
 * numpy fallback can reproduce every byte: cos/sin and the power are computed in double and
 * rounded to float (ggml: cosf/sinf/powf), and products are never fused (build with
 * -ffp-contract=off). The result stays within an F16 ulp or two of llama.cpp's own shift. */
#include "pc_blob.h"

#include <math.h>

#define PC_MAX_ROT 1024    /* rotated dims per head; the angle table lives on the stack */
#define PC_MAX_HEAD 65536  /* bound on n_head_kv and head_dim, keeps row sizes far from overflow */
#define PC_TYPE_F32 0      /* ggml_type values */
#define PC_TYPE_F16 1

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu, bits;
    if (exp == 0 && man == 0) {
        bits = sign;
    } else if (exp == 0) { /* subnormal: normalise */
        int32_t e = -1;
        do { ++e; man <<= 1; } while (!(man & 0x400u));
        bits = sign | (uint32_t) (127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even, like numpy's astype(float16) and the F16C instruction. */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000u);
    const uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xff) return (uint16_t) (sign | 0x7c00u | (man ? 0x200u | man >> 13 : 0)); /* inf, quiet NaN */
    const int32_t e = (int32_t) exp - 127 + 15;
    if (e >= 31) return (uint16_t) (sign | 0x7c00u);
    if (e <= 0) { /* subnormal half, or zero */
        if (e < -10) return sign;
        const uint32_t m = man | 0x800000u, shift = (uint32_t) (14 - e);
        uint32_t half = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) ++half;
        return (uint16_t) (sign | half);
    }
    uint32_t half = (uint32_t) e << 10 | man >> 13;
    const uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half; /* a carry may reach inf: correct */
    return (uint16_t) (sign | half);
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

/* cos and sin of the angle of each rotated pair, for a shift of delta positions. */
static void rope_table(int32_t delta, const pc_rope_params *p, float *cos_t, float *sin_t) {
    const float theta_scale = (float) pow((double) p->freq_base, (double) (-2.0f / (float) p->n_rot));
    float theta = (float) delta;
    for (int32_t i = 0; i < p->n_rot / 2; ++i) {
        const float angle = p->freq_scale * theta;
        cos_t[i] = (float) cos((double) angle);
        sin_t[i] = (float) sin((double) angle);
        theta *= theta_scale;
    }
}

/* Element indices of pair i within a head. */
static void rope_pair(const pc_rope_params *p, int32_t i, int32_t *a, int32_t *b) {
    if (p->mode == PC_ROPE_NEOX) { *a = i; *b = i + p->n_rot / 2; }
    else { *a = 2 * i; *b = 2 * i + 1; }
}

static void rotate_row_f16(uint8_t *row, const pc_rope_params *p, const float *cos_t, const float *sin_t) {
    for (int32_t h = 0; h < p->n_head_kv; ++h) {
        uint8_t *head = row + (size_t) h * (size_t) p->head_dim * 2;
        for (int32_t i = 0; i < p->n_rot / 2; ++i) {
            int32_t a, b;
            rope_pair(p, i, &a, &b);
            const float x0 = f16_to_f32((uint16_t) (head[2 * a] | head[2 * a + 1] << 8));
            const float x1 = f16_to_f32((uint16_t) (head[2 * b] | head[2 * b + 1] << 8));
            const uint16_t y0 = f32_to_f16(x0 * cos_t[i] - x1 * sin_t[i]);
            const uint16_t y1 = f32_to_f16(x0 * sin_t[i] + x1 * cos_t[i]);
            head[2 * a] = (uint8_t) y0; head[2 * a + 1] = (uint8_t) (y0 >> 8);
            head[2 * b] = (uint8_t) y1; head[2 * b + 1] = (uint8_t) (y1 >> 8);
        }
    }
}

static float load_f32(const uint8_t *p) {
    const uint32_t u = pc_le32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void store_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    pc_put_le32(p, u);
}

static void rotate_row_f32(uint8_t *row, const pc_rope_params *p, const float *cos_t, const float *sin_t) {
    for (int32_t h = 0; h < p->n_head_kv; ++h) {
        uint8_t *head = row + (size_t) h * (size_t) p->head_dim * 4;
        for (int32_t i = 0; i < p->n_rot / 2; ++i) {
            int32_t a, b;
            rope_pair(p, i, &a, &b);
            const float x0 = load_f32(head + 4 * a), x1 = load_f32(head + 4 * b);
            store_f32(head + 4 * a, x0 * cos_t[i] - x1 * sin_t[i]);
            store_f32(head + 4 * b, x0 * sin_t[i] + x1 * cos_t[i]);
        }
    }
}

/* Rotates every K row of a checked section. */
static void k_layers_rotate(uint8_t *blob, size_t size, const pc_section *sec, const pc_rope_params *p,
                            int32_t delta) {
    float cos_t[PC_MAX_ROT / 2], sin_t[PC_MAX_ROT / 2];
    rope_table(delta, p, cos_t, sin_t);
    pc_reader r = { blob, size, sec->data_off + 8 };
    for (uint32_t il = 0; il < sec->n_layer; ++il) {
        pc_layer rec;
        pc_layer_read(&r, sec->n_cell, 0, &rec);
        uint8_t *rows = blob + (rec.data - blob); /* the same bytes, writable */
        for (uint32_t c = 0; c < sec->n_cell; ++c) {
            uint8_t *row = rows + (size_t) c * rec.row_size;
            if (rec.type == PC_TYPE_F16) rotate_row_f16(row, p, cos_t, sin_t);
            else rotate_row_f32(row, p, cos_t, sin_t);
        }
    }
}

static void positions_shift(uint8_t *blob, const pc_layout *lay, int32_t delta) {
    const pc_section *sec = &lay->sec[0];
    const size_t rec = pc_cell_bytes(lay->cell_ext);
    for (uint32_t i = 0; i < sec->n_cell; ++i) {
        uint8_t *p = blob + sec->cells_off + (size_t) i * rec;
        pc_put_le32(p, (uint32_t) ((int32_t) pc_le32(p) + delta));
    }
}

int pc_state_relocate(uint8_t *blob, size_t size, int32_t delta, const pc_rope_params *rope) {
    pc_layout lay;
    int rc;
    if (!blob) return PC_ERR_ARGUMENT;
    if ((rc = pc_layout_parse(blob, size, &lay)) != PC_OK) return rc;
    if (lay.n_section > 1 || lay.cell_ext) return PC_ERR_UNSUPPORTED;
    if (!rope || !rope_valid(rope)) return PC_ERR_ARGUMENT;
    const pc_section *sec = &lay.sec[0];
    if (sec->n_cell == 0) return PC_OK;
    if ((int64_t) sec->pos_min + delta < 0 || (int64_t) sec->pos_max + delta > INT32_MAX) return PC_ERR_ARGUMENT;
    if ((rc = k_layers_check(blob, size, sec, rope)) != PC_OK) return rc;
    if (delta == 0) return PC_OK;
    positions_shift(blob, &lay, delta);
    k_layers_rotate(blob, size, sec, rope, delta);
    return PC_OK;
}
