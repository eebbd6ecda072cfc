/* pc_state.c — parsing and scanning sequence-state blobs (format: pc_state.h).
 *
 * The check order here is mirrored line by line in pc_cpu/kvstate/state_blob.py, so both
 * implementations report the same pc_status for the same bytes. */
#include "pc_blob.h"

int32_t pc_native_version(void) { return PC_NATIVE_VERSION; }

int pc_layer_read(pc_reader *r, uint32_t n_cell, uint32_t transposed, pc_layer *out) {
    int rc;
    memset(out, 0, sizeof *out);
    out->header = r->data + r->off;
    if ((rc = pc_read_i32(r, &out->type)) != PC_OK) return rc;
    if (!transposed) {
        if ((rc = pc_read_u64(r, &out->row_size)) != PC_OK) return rc;
    } else {
        if ((rc = pc_read_u32(r, &out->el_size)) != PC_OK) return rc;
        if ((rc = pc_read_u32(r, &out->n_embd)) != PC_OK) return rc;
        out->row_size = (uint64_t) out->el_size * out->n_embd; /* u32 * u32 fits in u64 */
    }
    if (out->type < 0 || out->type >= PC_MAX_TYPE) return PC_ERR_CORRUPT;
    if (out->row_size == 0) return PC_ERR_CORRUPT;
    if (out->row_size > pc_reader_left(r) / n_cell) return PC_ERR_TRUNCATED;
    out->data = r->data + r->off;
    r->off += (size_t) out->row_size * n_cell;
    return PC_OK;
}

/* Cell records: every cell must belong to exactly the blob's sequence. */
static int cells_parse(pc_reader *r, int32_t seq_id, uint32_t ext, pc_section *sec) {
    const size_t rec = pc_cell_bytes(ext);
    if (sec->n_cell > pc_reader_left(r) / rec) return PC_ERR_TRUNCATED;
    sec->cells_off = r->off;
    for (uint32_t i = 0; i < sec->n_cell; ++i) {
        const uint8_t *p = r->data + r->off + (size_t) i * rec;
        const int32_t pos = (int32_t) pc_le32(p);
        if (pos < 0) return PC_ERR_CORRUPT;
        if (pc_le32(p + 4) != 1) return PC_ERR_CORRUPT;
        if ((int32_t) pc_le32(p + rec - 4) != seq_id) return PC_ERR_CORRUPT;
        if (sec->pos_min < 0 || pos < sec->pos_min) sec->pos_min = pos;
        if (pos > sec->pos_max) sec->pos_max = pos;
    }
    r->off += (size_t) sec->n_cell * rec;
    return PC_OK;
}

/* v_trans, n_layer, then every layer's K record, then every layer's V record. */
static int data_parse(pc_reader *r, pc_section *sec) {
    int rc;
    pc_layer rec;
    sec->data_off = r->off;
    if ((rc = pc_read_u32(r, &sec->v_trans)) != PC_OK) return rc;
    if (sec->v_trans > 1) return PC_ERR_CORRUPT;
    if ((rc = pc_read_u32(r, &sec->n_layer)) != PC_OK) return rc;
    if (sec->n_layer > PC_MAX_LAYER) return PC_ERR_CORRUPT;
    for (uint32_t il = 0; il < 2 * sec->n_layer; ++il) {
        const int is_v = il >= sec->n_layer;
        if ((rc = pc_layer_read(r, sec->n_cell, is_v && sec->v_trans, &rec)) != PC_OK) return rc;
        if (il == 0) sec->k0 = rec;
        if (il == sec->n_layer) sec->v0 = rec;
    }
    return PC_OK;
}

static int section_parse(pc_reader *r, int32_t seq_id, uint32_t ext, pc_section *sec) {
    int rc;
    memset(sec, 0, sizeof *sec);
    sec->stream = PC_NO_STREAM;
    sec->pos_min = sec->pos_max = -1;
    sec->k0.type = sec->v0.type = -1;
    if ((rc = pc_read_u32(r, &sec->n_stream)) != PC_OK) return rc;
    if (sec->n_stream == 0 || sec->n_stream > PC_MAX_STREAM) return PC_ERR_CORRUPT;
    for (uint32_t s = 0; s < sec->n_stream; ++s) {
        uint32_t n_cell;
        if ((rc = pc_read_u32(r, &n_cell)) != PC_OK) return rc;
        if (n_cell == 0) continue;
        /* one sequence lives in one stream; several would each clear the sequence on restore */
        if (sec->stream != PC_NO_STREAM) return PC_ERR_UNSUPPORTED;
        sec->stream = s;
        sec->n_cell = n_cell;
        if ((rc = cells_parse(r, seq_id, ext, sec)) != PC_OK) return rc;
        if ((rc = data_parse(r, sec)) != PC_OK) return rc;
        sec->end_off = r->off;
    }
    return PC_OK;
}

static int blob_parse(const uint8_t *blob, size_t size, uint32_t ext, pc_layout *out) {
    pc_reader r = { blob, size, 0 };
    uint32_t magic;
    int rc;
    memset(out, 0, sizeof *out);
    out->cell_ext = ext;
    if ((rc = pc_read_u32(&r, &magic)) != PC_OK) return rc;
    if (magic != PC_MAGIC) return PC_ERR_BAD_MAGIC;
    if ((rc = pc_read_i32(&r, &out->seq_id)) != PC_OK) return rc;
    if (out->seq_id < 0) return PC_ERR_UNSUPPORTED; /* a whole-cache state, not one sequence */
    while (pc_reader_left(&r) > 0) {
        if (out->n_section == PC_MAX_SECTION) return PC_ERR_CORRUPT;
        pc_section *sec = &out->sec[out->n_section++];
        if ((rc = section_parse(&r, out->seq_id, ext, sec)) != PC_OK) return rc;
        out->n_cell_total += sec->n_cell;
    }
    return out->n_section == 0 ? PC_ERR_TRUNCATED : PC_OK;
}

int pc_layout_parse(const uint8_t *blob, size_t size, pc_layout *out) {
    /* The ext record is not declared: a blob is read without it first, then with it. */
    const int rc = blob_parse(blob, size, 0, out);
    if (rc == PC_OK) return PC_OK;
    return blob_parse(blob, size, 1, out) == PC_OK ? PC_OK : rc;
}

int pc_state_scan(const uint8_t *blob, size_t size, pc_state_info *out) {
    pc_layout lay;
    int rc;
    if (!blob || !out) return PC_ERR_ARGUMENT;
    if ((rc = pc_layout_parse(blob, size, &lay)) != PC_OK) return rc;
    const pc_section *s0 = &lay.sec[0];
    out->seq_id = lay.seq_id;
    out->n_section = lay.n_section;
    out->n_stream = s0->n_stream;
    out->n_cell = s0->n_cell;
    out->pos_min = s0->pos_min;
    out->pos_max = s0->pos_max;
    out->cell_ext = lay.cell_ext;
    out->v_trans = s0->v_trans;
    out->n_layer = s0->n_layer;
    out->k_type = s0->k0.type;
    out->v_type = s0->v0.type;
    out->k_row_size = s0->k0.row_size;
    out->v_row_size = s0->v0.row_size;
    return PC_OK;
}
