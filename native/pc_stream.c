/* pc_stream.c — fitting a blob to the prompt stream it is restored into: the stream count
 * (pc_state_restream) and position order (pc_state_order).
 *
 * Every schema prompt runs both (pc_cpu.engine.streams.move_to_stream): its cells are read out of
 * the library context in KV-slot order, sorted by position, and restored into a context with one
 * stream per sequence. The numpy twin is pc_cpu/kvstate/state_blob.py (restream,
 * order_by_position); the checks run in the same order, so both report the same pc_status. */
#include "pc_blob.h"

#include <stdlib.h>

/* --- restream --------------------------------------------------------------------------------- */

/* Bytes of section s in a restreamed blob: n_stream, the cell counts, then the one stream. */
static size_t restreamed_bytes(const pc_section *sec, uint32_t n_stream) {
    const size_t stream = sec->n_cell ? sec->end_off - sec->cells_off : 0;
    return 4 + (size_t) 4 * n_stream + stream;
}

int pc_state_restream(const uint8_t *blob, size_t size, uint32_t n_stream,
                      uint8_t *out, size_t out_capacity, size_t *out_size) {
    pc_layout lay;
    int rc;
    if (!blob || !out_size || (!out && out_capacity)) return PC_ERR_ARGUMENT;
    if (n_stream == 0 || n_stream > PC_MAX_STREAM) return PC_ERR_ARGUMENT;
    if ((rc = pc_layout_parse(blob, size, &lay)) != PC_OK) return rc;
    size_t need = 8;
    for (uint32_t s = 0; s < lay.n_section; ++s) need += restreamed_bytes(&lay.sec[s], n_stream);
    *out_size = need;
    if (need > out_capacity) return PC_ERR_CAPACITY;
    memcpy(out, blob, 8); /* magic, sequence id */
    size_t off = 8;
    for (uint32_t s = 0; s < lay.n_section; ++s) {
        const pc_section *sec = &lay.sec[s];
        pc_put_le32(out + off, n_stream);
        pc_put_le32(out + off + 4, sec->n_cell); /* stream 0 holds every cell */
        off += 8;
        if (sec->n_cell) {
            memcpy(out + off, blob + sec->cells_off, sec->end_off - sec->cells_off);
            off += sec->end_off - sec->cells_off;
        }
        memset(out + off, 0, (size_t) 4 * (n_stream - 1)); /* the other streams: no cells */
        off += (size_t) 4 * (n_stream - 1);
    }
    return PC_OK;
}

/* --- order ------------------------------------------------------------------------------------ */

typedef struct {
    int32_t pos;
    uint32_t cell; /* index in the blob: ties (refused anyway) keep blob order */
} pc_slot;

static int cmp_slot(const void *a, const void *b) {
    const pc_slot *x = a, *y = b;
    if (x->pos != y->pos) return (x->pos > y->pos) - (x->pos < y->pos);
    return (x->cell > y->cell) - (x->cell < y->cell);
}

/* Sorts section sec's cells by position into order[0..n_cell); sets *moved when some cell moves.
 * PC_ERR_OVERLAP when two cells share a position. */
static int section_order(const uint8_t *blob, const pc_layout *lay, const pc_section *sec, pc_slot *order,
                         int *moved) {
    const size_t rec = pc_cell_bytes(lay->cell_ext);
    for (uint32_t i = 0; i < sec->n_cell; ++i) {
        order[i].pos = (int32_t) pc_le32(blob + sec->cells_off + (size_t) i * rec);
        order[i].cell = i;
    }
    qsort(order, sec->n_cell, sizeof *order, cmp_slot);
    for (uint32_t i = 0; i < sec->n_cell; ++i) {
        if (i && order[i].pos == order[i - 1].pos) return PC_ERR_OVERLAP;
        if (order[i].cell != i) *moved = 1;
    }
    return PC_OK;
}

/* Copies blob[*done, to) to the same place in out: the bytes between the permuted runs (in
 * place, they are there already). */
static void copy_through(uint8_t *out, const uint8_t *blob, size_t *done, size_t to) {
    if (out != blob) memcpy(out + *done, blob + *done, to - *done);
    *done = to;
}

/* Where a permutation of the n_bytes at off reads from: the blob, or in place a copy in tmp. */
static const uint8_t *source(const uint8_t *blob, const uint8_t *out, uint8_t *tmp, size_t off, size_t n_bytes) {
    if (out != blob) return blob + off;
    memcpy(tmp, blob + off, n_bytes);
    return tmp;
}

/* Row i of the n rows of `row` bytes at dst takes row order[i].cell of src. */
static void permute_rows(uint8_t *dst, const uint8_t *src, size_t row, const pc_slot *order, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) memcpy(dst + (size_t) i * row, src + (size_t) order[i].cell * row, row);
}

/* A transposed V layer: each of n_embd runs of n elements of el bytes permuted alike. The common
 * element sizes are copied as whole integers (a memcpy of a constant size is one move). */
static void permute_elements(uint8_t *dst_layer, const uint8_t *src_layer, uint32_t el, uint32_t n_embd,
                             const pc_slot *order, uint32_t n) {
    const size_t run = (size_t) el * n;
    for (uint32_t j = 0; j < n_embd; ++j) {
        uint8_t *dst = dst_layer + j * run;
        const uint8_t *src = src_layer + j * run;
        if (el == 2) {
            for (uint32_t i = 0; i < n; ++i) memcpy(dst + 2 * (size_t) i, src + 2 * (size_t) order[i].cell, 2);
        } else if (el == 4) {
            for (uint32_t i = 0; i < n; ++i) memcpy(dst + 4 * (size_t) i, src + 4 * (size_t) order[i].cell, 4);
        } else {
            for (uint32_t i = 0; i < n; ++i) memcpy(dst + (size_t) el * i, src + (size_t) el * order[i].cell, el);
        }
    }
}

/* Bytes of section sec's largest permuted run: its cell records or one layer record's data. */
static size_t largest_run(const uint8_t *blob, size_t size, const pc_layout *lay, const pc_section *sec) {
    size_t largest = (size_t) sec->n_cell * pc_cell_bytes(lay->cell_ext);
    pc_reader r = { blob, size, sec->data_off + 8 };
    for (uint32_t il = 0; il < 2 * sec->n_layer; ++il) {
        pc_layer rec;
        pc_layer_read(&r, sec->n_cell, il >= sec->n_layer && sec->v_trans, &rec); /* parsed before */
        if ((size_t) rec.row_size * sec->n_cell > largest) largest = (size_t) rec.row_size * sec->n_cell;
    }
    return largest;
}

/* Writes section sec sorted: cell records, then each layer record's rows or element runs.
 * tmp holds the largest run when sorting in place (out == blob), else it is unused. */
static void section_write_sorted(uint8_t *out, const uint8_t *blob, size_t size, const pc_layout *lay,
                                 const pc_section *sec, const pc_slot *order, uint8_t *tmp, size_t *done) {
    const uint32_t n = sec->n_cell;
    const size_t cells = (size_t) n * pc_cell_bytes(lay->cell_ext);
    copy_through(out, blob, done, sec->cells_off);
    permute_rows(out + sec->cells_off, source(blob, out, tmp, sec->cells_off, cells), pc_cell_bytes(lay->cell_ext),
                 order, n);
    *done = sec->cells_off + cells;
    pc_reader r = { blob, size, sec->data_off + 8 };
    for (uint32_t il = 0; il < 2 * sec->n_layer; ++il) {
        const uint32_t tr = il >= sec->n_layer && sec->v_trans;
        pc_layer rec;
        pc_layer_read(&r, n, tr, &rec); /* parsed before: cannot fail */
        const size_t data = (size_t) (rec.data - blob), bytes = (size_t) rec.row_size * n;
        copy_through(out, blob, done, data); /* v_trans, n_layer, the record's header */
        const uint8_t *src = source(blob, out, tmp, data, bytes);
        if (tr) permute_elements(out + data, src, rec.el_size, rec.n_embd, order, n);
        else permute_rows(out + data, src, (size_t) rec.row_size, order, n);
        *done = data + bytes;
    }
}

/* Writes every section sorted into out (out == blob: in place, through a temporary run). */
static int write_sorted(uint8_t *out, const uint8_t *blob, size_t size, const pc_layout *lay,
                        pc_slot *const *orders) {
    uint8_t *tmp = NULL;
    if (out == blob) {
        size_t largest = 0;
        for (uint32_t s = 0; s < lay->n_section; ++s) {
            const size_t run = lay->sec[s].n_cell ? largest_run(blob, size, lay, &lay->sec[s]) : 0;
            if (run > largest) largest = run;
        }
        if (!(tmp = malloc(largest ? largest : 1))) return PC_ERR_NOMEM;
    }
    size_t done = 0;
    for (uint32_t s = 0; s < lay->n_section; ++s) {
        if (lay->sec[s].n_cell) section_write_sorted(out, blob, size, lay, &lay->sec[s], orders[s], tmp, &done);
    }
    copy_through(out, blob, &done, size);
    free(tmp);
    return PC_OK;
}

int pc_state_order(const uint8_t *blob, size_t size, uint8_t *out, size_t out_capacity, uint32_t *in_order) {
    pc_layout lay;
    int rc;
    if (!blob || !in_order || (!out && out_capacity)) return PC_ERR_ARGUMENT;
    if ((rc = pc_layout_parse(blob, size, &lay)) != PC_OK) return rc;
    pc_slot *orders[PC_MAX_SECTION] = { NULL };
    int moved = 0;
    rc = PC_OK;
    for (uint32_t s = 0; s < lay.n_section && rc == PC_OK; ++s) {
        if (lay.sec[s].n_cell == 0) continue;
        orders[s] = malloc((size_t) lay.sec[s].n_cell * sizeof(pc_slot));
        rc = orders[s] ? section_order(blob, &lay, &lay.sec[s], orders[s], &moved) : PC_ERR_NOMEM;
    }
    if (rc == PC_OK) {
        *in_order = !moved;
        if (moved && size > out_capacity) rc = PC_ERR_CAPACITY;
    }
    if (rc == PC_OK && moved) rc = write_sorted(out, blob, size, &lay, orders);
    for (uint32_t s = 0; s < PC_MAX_SECTION; ++s) free(orders[s]);
    return rc;
}
