/* pc_blob.h — internal to pc_native: the bounds-checked reader and the parsed layout of a
 * sequence-state blob, shared by scan (pc_state.c), splice (pc_splice.c), relocate
 * (pc_relocate.c) and restream/order (pc_stream.c). Not installed; the format itself is described in pc_state.h. */
#ifndef PC_BLOB_H
#define PC_BLOB_H

#include "pc_state.h"

#include <stdint.h>
#include <string.h>

#define PC_MAGIC 0xaf143cd8u
#define PC_MAX_SECTION 4   /* KV caches per blob we accept (llama.cpp writes 1 or 2) */
#define PC_MAX_STREAM 256  /* LLAMA_MAX_SEQ: n_stream is 1 or n_seq_max */
#define PC_MAX_LAYER 4096
#define PC_MAX_TYPE 64     /* every ggml_type value is below this */
#define PC_CELL_BYTES 12   /* i32 pos, u32 n_seq_id, i32 seq_id */
#define PC_EXT_BYTES 12    /* llama_kv_cell_ext: i32 x, i32 y, i32 tok */
#define PC_LAYER_HEADER_BYTES 12 /* i32 type + u64 row size, or i32 type + u32 el + u32 n_embd */
#define PC_NO_STREAM UINT32_MAX

/* A cursor over [data, data + size); off <= size always holds. */
typedef struct {
    const uint8_t *data;
    size_t size;
    size_t off;
} pc_reader;

/* One layer's K or V record. For a transposed V, row_size = el_size * n_embd. */
typedef struct {
    int32_t type;
    uint64_t row_size;      /* bytes per cell */
    uint32_t el_size;       /* transposed V only, else 0 */
    uint32_t n_embd;        /* transposed V only, else 0 */
    const uint8_t *header;  /* the record's 12 header bytes inside the blob */
    const uint8_t *data;    /* n_cell * row_size bytes inside the blob */
} pc_layer;

/* One KV cache's part of a blob: its cells live in at most one stream. */
typedef struct {
    uint32_t n_stream;
    uint32_t stream;        /* index of the stream holding cells, PC_NO_STREAM when none */
    uint32_t n_cell;
    size_t cells_off;       /* offset of the first cell record */
    size_t data_off;        /* offset of the v_trans field */
    size_t end_off;         /* offset just past the stream's last layer record (0 when empty) */
    int32_t pos_min;        /* -1 when empty */
    int32_t pos_max;        /* inclusive, -1 when empty */
    uint32_t v_trans;
    uint32_t n_layer;
    pc_layer k0;            /* first layer's K record (type -1 when none) */
    pc_layer v0;            /* first layer's V record (type -1 when none) */
} pc_section;

typedef struct {
    int32_t seq_id;
    uint32_t cell_ext;      /* 1 when cell records carry the ext record */
    uint32_t n_section;
    uint64_t n_cell_total;  /* over all sections */
    pc_section sec[PC_MAX_SECTION];
} pc_layout;

static inline uint32_t pc_le32(const uint8_t *p) {
    return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static inline uint64_t pc_le64(const uint8_t *p) {
    return (uint64_t) pc_le32(p) | (uint64_t) pc_le32(p + 4) << 32;
}

static inline void pc_put_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t) v; p[1] = (uint8_t) (v >> 8); p[2] = (uint8_t) (v >> 16); p[3] = (uint8_t) (v >> 24);
}

static inline size_t pc_reader_left(const pc_reader *r) { return r->size - r->off; }

static inline int pc_read_u32(pc_reader *r, uint32_t *v) {
    if (pc_reader_left(r) < 4) return PC_ERR_TRUNCATED;
    *v = pc_le32(r->data + r->off);
    r->off += 4;
    return PC_OK;
}

static inline int pc_read_i32(pc_reader *r, int32_t *v) {
    uint32_t u;
    const int rc = pc_read_u32(r, &u);
    if (rc == PC_OK) memcpy(v, &u, sizeof *v);
    return rc;
}

static inline int pc_read_u64(pc_reader *r, uint64_t *v) {
    if (pc_reader_left(r) < 8) return PC_ERR_TRUNCATED;
    *v = pc_le64(r->data + r->off);
    r->off += 8;
    return PC_OK;
}

static inline size_t pc_cell_bytes(uint32_t cell_ext) {
    return PC_CELL_BYTES + (cell_ext ? PC_EXT_BYTES : 0);
}

/* Parses a whole blob, detecting the ext record. Returns PC_OK or the first problem found. */
int pc_layout_parse(const uint8_t *blob, size_t size, pc_layout *out);

/* Reads one layer record of n_cell > 0 cells at r (transposed: the element-major V form).
 * Returns PC_OK with r past the record, else TRUNCATED or CORRUPT. */
int pc_layer_read(pc_reader *r, uint32_t n_cell, uint32_t transposed, pc_layer *out);

/* Relocation, shared by pc_relocate.c and the moving splice of pc_splice.c. */
#define PC_MAX_ROT 1024 /* rotated dims per head; the angle table lives on the stack */

/* The cos/sin of each rotated pair's angle for one delta. */
typedef struct {
    int32_t n_pairs;
    int neox;  /* NEOX pairs element i with i + n_pairs; NORMAL pairs 2i with 2i + 1 */
    float cos_t[PC_MAX_ROT / 2], sin_t[PC_MAX_ROT / 2];
} pc_rope_plan;

/* Everything pc_state_relocate() refuses before it changes a byte, for a parsed blob. */
int pc_relocate_check(const uint8_t *blob, size_t size, const pc_layout *lay, int32_t delta,
                      const pc_rope_params *ropes, uint32_t n_ropes);

/* The angles of a move by delta under rope p (p valid). */
void pc_rope_plan_make(int32_t delta, const pc_rope_params *p, pc_rope_plan *plan);

/* Re-rotates n_cell checked K rows of type k_type (F16 or F32), laid out one after another. */
void pc_rotate_rows(uint8_t *rows, size_t n_cell, int32_t k_type, const pc_rope_params *p,
                    const pc_rope_plan *plan);

#endif
