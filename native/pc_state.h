/* pc_state.h — byte work on llama.cpp sequence-state blobs.
 *
 * A blob is what llama_state_seq_get_data() returns for one sequence, as written by
 * llama_context::state_seq_get_data (src/llama-context.cpp) and
 * llama_kv_cache::state_write / state_write_meta / state_write_data (src/llama-kv-cache.cpp)
 * of the llama.cpp vendored by llama-cpp-python 0.3.36. All integers little-endian:
 *
 *   u32 magic 0xaf143cd8, i32 seq_id
 *   then one section per KV cache (1; an iswa model writes 2: base cache, then SWA cache):
 *     u32 n_stream                      (1 with kv_unified, else n_seq_max)
 *     per stream: u32 cell_count; when cell_count > 0:
 *       per cell:  i32 pos, u32 n_seq_id (= 1), [12-byte ext: i32 x, i32 y, i32 tok], i32 seq_id
 *       u32 v_trans, u32 n_layer
 *       per layer: i32 K type, u64 K row size, cell_count rows (one per cell, in cell order)
 *       v_trans == 0: per layer: i32 V type, u64 V row size, cell_count rows
 *       v_trans == 1: per layer: i32 V type, u32 element size, u32 n_embd_v_gqa,
 *                     then n_embd_v_gqa runs of cell_count elements (element-major)
 *
 * The ext record is only written by models with M-RoPE or PLE; it is not declared in the blob,
 * so scanning detects it (a blob parses completely with it or without it).
 *
 * Conventions: every function returns 0 on success or a negative pc_status;
 * sizes are size_t bytes; nothing here allocates memory the caller must free;
 * nothing reads or writes outside the buffers it is given, whatever their contents.
 */
#ifndef PC_STATE_H
#define PC_STATE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define PC_API __declspec(dllexport)
#else
#define PC_API __attribute__((visibility("default")))
#endif

#define PC_NATIVE_VERSION 4

typedef enum {
    PC_OK = 0,
    PC_ERR_TRUNCATED = -1,   /* the blob ends before a field it declares */
    PC_ERR_BAD_MAGIC = -2,   /* not a llama.cpp sequence state */
    PC_ERR_UNSUPPORTED = -3, /* a layout this library does not handle */
    PC_ERR_ARGUMENT = -4,    /* a NULL pointer or an out-of-range argument */
    PC_ERR_CORRUPT = -5,     /* a field holds an impossible value, or bytes follow the last section */
    PC_ERR_MISMATCH = -6,    /* blobs to splice differ in layout (model, cache types, flash attention) */
    PC_ERR_OVERLAP = -7,     /* blobs to splice hold a cell at the same position */
    PC_ERR_CAPACITY = -8,    /* the output buffer is smaller than the result */
    PC_ERR_NOMEM = -9,       /* a temporary allocation failed */
} pc_status;

/* What pc_state_scan() learns about a blob. Layer fields describe the first section's first
 * layer; an empty blob (no cells) reports n_layer 0, types -1 and row sizes 0. */
typedef struct {
    int32_t  seq_id;      /* sequence the blob was saved from; set_data ignores it */
    uint32_t n_section;   /* KV caches in the blob: 1, or 2 for an iswa model */
    uint32_t n_stream;    /* streams per cache: 1 with kv_unified */
    uint32_t n_cell;      /* cells of the first section */
    int32_t  pos_min;     /* smallest cell position, -1 when empty (as llama_memory_seq_pos_min) */
    int32_t  pos_max;     /* largest cell position, inclusive, -1 when empty (as ..._seq_pos_max) */
    uint32_t cell_ext;    /* 1 when each cell carries the 12-byte ext record */
    uint32_t v_trans;     /* 1 when V is element-major (flash attention off) */
    uint32_t n_layer;     /* layers of the first section */
    int32_t  k_type;      /* ggml_type of K (0 = F32, 1 = F16) */
    int32_t  v_type;      /* ggml_type of V */
    uint64_t k_row_size;  /* bytes of one cell's K */
    uint64_t v_row_size;  /* bytes of one cell's V (element size * n_embd_v_gqa when transposed) */
} pc_state_info;

/* RoPE variants, with llama.cpp's values (LLAMA_ROPE_TYPE_NORM / _NEOX). */
typedef enum {
    PC_ROPE_NORMAL = 0, /* rotates pairs (2i, 2i+1) of each head */
    PC_ROPE_NEOX = 2,   /* rotates pairs (i, i + n_rot/2) of each head */
} pc_rope_mode;

/* The RoPE of the model's K cache; YaRN and frequency factors are not supported. */
typedef struct {
    int32_t n_rot;      /* rotated dimensions per head: even, 0 < n_rot <= head_dim */
    int32_t mode;       /* a pc_rope_mode */
    int32_t n_head_kv;  /* K heads per cell */
    int32_t head_dim;   /* elements per K head (n_embd_head_k) */
    float   freq_base;  /* theta_i = pos * freq_base^(-2i/n_rot) * freq_scale */
    float   freq_scale;
} pc_rope_params;

/* Returns the ABI version of this library (PC_NATIVE_VERSION); Python refuses a mismatch. */
PC_API int32_t pc_native_version(void);

/* Validates a blob and describes it in *out.
 * Accepts only single-sequence blobs (every cell has exactly the header's seq_id) with at most
 * one non-empty stream per section and at most 4 sections.
 * Returns PC_OK; PC_ERR_ARGUMENT if blob or out is NULL; otherwise the first problem found
 * (TRUNCATED, BAD_MAGIC, CORRUPT, UNSUPPORTED). *out is written only on success. */
PC_API int pc_state_scan(const uint8_t *blob, size_t size, pc_state_info *out);

/* Moves every cell of a blob of n_ropes KV caches by delta positions, in place: adds delta to each
 * position and re-rotates each K row by the RoPE angle of delta, as llama_memory_seq_add's K-shift
 * does (pair i turns by delta * freq_base^(-2i/n_rot) * freq_scale), each cache with its own rope
 * (an iswa model's base cache, then its sliding-window cache, whose layers use another RoPE base).
 * F16 and F32 K only. Validates every cache first: on any error the blob is unchanged.
 * Returns PC_OK; a scan error; PC_ERR_UNSUPPORTED for another K type, a blob with an ext record
 * (M-RoPE), or n_ropes == 1 for a blob of several caches; PC_ERR_ARGUMENT for blob NULL, ropes
 * NULL, n_ropes other than the blob's cache count, an invalid rope, rope sizes that do not match
 * a layer's K row, or a position leaving [0, INT32_MAX].
 * A NaN produced by the rotation is written as the canonical quiet NaN (F32 0x7fc00000,
 * F16 0x7e00). delta == 0 validates and changes nothing. */
PC_API int pc_state_relocate(uint8_t *blob, size_t size, int32_t delta, const pc_rope_params *ropes,
                             uint32_t n_ropes);

/* One call from saved blobs to a prompt's restore blob, which a single llama_state_seq_set_data()
 * restores. Splices n_blobs >= 1 blobs: per section, the cells of blob 0, then blob 1, ...; K
 * rows and V rows (or V elements, when transposed) concatenated in the same order; the header
 * and every cell carry blob 0's seq_id. All blobs must share n_section, n_stream, the ext
 * record, v_trans, n_layer and every layer's types and sizes (else PC_ERR_MISMATCH; empty
 * sections are exempt), and no two cells of a section may share a position (PC_ERR_OVERLAP).
 * Blob b's cells are moved by deltas[b] on the way (positions shifted, K re-rotated with ropes,
 * one per KV cache, as pc_state_relocate()), and n_stream streams per cache are written with
 * every cell in stream 0 (a context with one stream per sequence restores a sequence's cells
 * into its own stream). The bytes equal relocating each blob, splicing, and rewriting the
 * stream count, without the relocated copies. ropes are read only for blobs with
 * deltas[b] != 0. Overlap is judged on the moved positions. Writes the result size to
 * *out_size on success and on PC_ERR_CAPACITY; out may be NULL when out_capacity is 0.
 * Returns PC_ERR_ARGUMENT for NULL arrays, n_blobs == 0, deltas NULL or n_stream outside
 * 1..256, or a blob's scan error. The output is unspecified on failure. */
PC_API int pc_state_assemble(const uint8_t *const *blobs, const size_t *sizes, const int32_t *deltas,
                             size_t n_blobs, const pc_rope_params *ropes, uint32_t n_ropes, uint32_t n_stream,
                             uint8_t *out, size_t out_capacity, size_t *out_size);

/* Writes to out the blob rewritten for a context of n_stream streams per KV cache: each cache's
 * cells, their records unchanged, in stream 0, and the other streams empty. llama.cpp refuses a
 * state whose stream count differs from the context's, but restores a sequence's cells into that
 * sequence's own stream whichever stream they were saved from. Writes the result size to
 * *out_size on success and on PC_ERR_CAPACITY; out may be NULL when out_capacity is 0; out must
 * not overlap blob. Returns PC_ERR_ARGUMENT for blob or out_size NULL or n_stream outside 1..256
 * (judged before the blob), else a scan error. */
PC_API int pc_state_restream(const uint8_t *blob, size_t size, uint32_t n_stream,
                             uint8_t *out, size_t out_capacity, size_t *out_size);

/* Writes to out the blob with each KV cache's cells sorted by position: cell records, K rows and
 * V rows (or each V element run, when transposed) permuted alike, every other byte unchanged, so
 * that a restored prompt sits in its stream as a fresh prefill of the same tokens would. The
 * result has the blob's size. Sets *in_order to 1 and writes nothing when every cache is already
 * in order (out may then be NULL), else to 0. Returns PC_ERR_ARGUMENT for blob or in_order NULL;
 * a scan error; PC_ERR_OVERLAP when two cells of one cache share a position (judged cache by
 * cache, before anything is written); PC_ERR_CAPACITY when the blob is out of order and
 * out_capacity < size (out may be NULL then); PC_ERR_NOMEM. out may be blob itself, to sort in
 * place (a temporary the size of one layer's rows is used); otherwise it must not overlap blob. */
PC_API int pc_state_order(const uint8_t *blob, size_t size, uint8_t *out, size_t out_capacity,
                          uint32_t *in_order);

#endif
