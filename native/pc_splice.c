/* pc_splice.c — merging several single-sequence blobs into one restore blob.
 *
 * Two passes: check (parse every blob, compare layouts, look for shared positions, size the
 * result), then write. The write pass keeps one cursor per input blob: the output takes
 * layer 0's K rows of every blob, then layer 1's, ..., so each cursor only moves forward.
 *
 * pc_state_assemble() splices moving each blob on the way: its positions are written
 * shifted and its K rows re-rotated right after they are copied, while they are still in cache.
 * That saves the relocated copy of every blob and the pass over it (pc_state_relocate works in
 * place on a blob the caller must first copy, since stored blobs are shared).
 *
 * The rotation is most of an assemble's time (a ~4K-token prompt restored from RAM spent a third of
 * its TTFT in it, bench/RESULTS.md), and every head turns on its own: so the K rows of a section are
 * queued as they are copied and turned at the end of the section by several threads, each a
 * contiguous share of the rows (the same arithmetic on the same bytes: the output is the same). */
#include "pc_blob.h"

#include <stdlib.h>
#ifndef _WIN32
#include <pthread.h>
#include <unistd.h>
#endif

typedef struct {
    const uint8_t *blob;
    size_t size;
    pc_layout lay;
    int32_t delta;   /* positions the blob's cells move by (assemble), else 0 */
    pc_reader cur;   /* write pass: walks the current section's layer records */
    pc_layer rec;    /* write pass: the record under the cursor */
} pc_input;

/* K rows of one blob and layer, copied into the output and waiting to be turned. */
typedef struct {
    uint8_t *rows;
    uint32_t n_cell;
    uint64_t row_size;
    int32_t type;
    const pc_rope_params *rope;
    const pc_rope_plan *plan;
} pc_turn;

/* What is asked of one splice: the inputs, and for assemble the ropes and the streams to write. */
typedef struct {
    pc_input *in;
    size_t n;
    const pc_rope_params *ropes; /* one per section; read only when some delta != 0 */
    uint32_t n_ropes;
    uint32_t n_stream;           /* streams per section in the output; 0: the inputs' count */
    pc_rope_plan *plans;         /* write pass: one per input, for the current section */
    pc_turn *turns;              /* write pass: the current section's rows to turn (NULL: turned at once) */
    size_t n_turns, cap_turns;
} pc_job;

typedef struct {
    uint8_t *out;
    size_t off;
} pc_writer;

static void write_bytes(pc_writer *w, const void *src, size_t n) {
    if (n) memcpy(w->out + w->off, src, n);
    w->off += n;
}

static void write_u32(pc_writer *w, uint32_t v) {
    pc_put_le32(w->out + w->off, v);
    w->off += 4;
}

/* Index of the first input whose section s has cells, or n when none has. */
static size_t first_with_cells(const pc_input *in, size_t n, uint32_t s) {
    size_t b = 0;
    while (b < n && in[b].lay.sec[s].n_cell == 0) ++b;
    return b;
}

static int layer_same(const pc_layer *a, const pc_layer *b) {
    return a->type == b->type && a->row_size == b->row_size && a->el_size == b->el_size &&
           a->n_embd == b->n_embd;
}

/* Every layer record of a (validated) section, compared with the reference section's. */
static int section_same(const pc_input *a, const pc_input *b, uint32_t s) {
    const pc_section *sa = &a->lay.sec[s], *sb = &b->lay.sec[s];
    if (sa->v_trans != sb->v_trans || sa->n_layer != sb->n_layer) return 0;
    pc_reader ra = { a->blob, a->size, sa->data_off + 8 };
    pc_reader rb = { b->blob, b->size, sb->data_off + 8 };
    for (uint32_t il = 0; il < 2 * sa->n_layer; ++il) {
        const uint32_t tr = il >= sa->n_layer && sa->v_trans;
        pc_layer la, lb;
        if (pc_layer_read(&ra, sa->n_cell, tr, &la) != PC_OK) return 0;
        if (pc_layer_read(&rb, sb->n_cell, tr, &lb) != PC_OK) return 0;
        if (!layer_same(&la, &lb)) return 0;
    }
    return 1;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;
    return (x > y) - (x < y);
}

/* PC_ERR_OVERLAP when two cells of section s (in any blobs) share a position. */
static int positions_disjoint(const pc_input *in, size_t n, uint32_t s, uint32_t total) {
    if (total < 2) return PC_OK;
    int32_t *pos = malloc((size_t) total * sizeof *pos);
    if (!pos) return PC_ERR_NOMEM;
    size_t k = 0;
    for (size_t b = 0; b < n; ++b) {
        const pc_section *sec = &in[b].lay.sec[s];
        const size_t rec = pc_cell_bytes(in[b].lay.cell_ext);
        for (uint32_t i = 0; i < sec->n_cell; ++i) {
            pos[k++] = (int32_t) pc_le32(in[b].blob + sec->cells_off + (size_t) i * rec) + in[b].delta;
        }
    }
    qsort(pos, total, sizeof *pos, cmp_i32);
    int rc = PC_OK;
    for (size_t i = 1; i < total && rc == PC_OK; ++i) {
        if (pos[i] == pos[i - 1]) rc = PC_ERR_OVERLAP;
    }
    free(pos);
    return rc;
}

/* Bytes of section s in the output, which holds `total` cells laid out like input ref. */
static size_t section_bytes(const pc_input *ref, uint32_t s, uint32_t total, uint32_t n_stream) {
    const pc_section *sec = &ref->lay.sec[s];
    size_t bytes = 4 + (size_t) 4 * (n_stream ? n_stream : sec->n_stream);
    if (total == 0) return bytes;
    bytes += (size_t) total * pc_cell_bytes(ref->lay.cell_ext) + 8;
    pc_reader r = { ref->blob, ref->size, sec->data_off + 8 };
    for (uint32_t il = 0; il < 2 * sec->n_layer; ++il) {
        pc_layer rec;
        pc_layer_read(&r, sec->n_cell, il >= sec->n_layer && sec->v_trans, &rec);
        bytes += PC_LAYER_HEADER_BYTES + (size_t) rec.row_size * total;
    }
    return bytes;
}

static int check_section(const pc_input *in, size_t n, uint32_t s, uint32_t n_stream, size_t *bytes) {
    const size_t ref = first_with_cells(in, n, s);
    uint64_t total = 0;
    for (size_t b = 0; b < n; ++b) {
        if (in[b].lay.sec[s].n_cell == 0) continue;
        if (b != ref && !section_same(&in[ref], &in[b], s)) return PC_ERR_MISMATCH;
        total += in[b].lay.sec[s].n_cell;
    }
    if (total > UINT32_MAX) return PC_ERR_UNSUPPORTED; /* the cell count is a u32 */
    const int rc = positions_disjoint(in, n, s, (uint32_t) total);
    if (rc != PC_OK) return rc;
    *bytes += section_bytes(&in[ref == n ? 0 : ref], s, (uint32_t) total, n_stream);
    return PC_OK;
}

/* Parses every blob, checks the moves, compares layouts and positions, and sizes the output. */
static int check_inputs(const pc_job *job, size_t *need) {
    pc_input *in = job->in;
    const size_t n = job->n;
    int rc;
    for (size_t b = 0; b < n; ++b) {
        if (!in[b].blob) return PC_ERR_ARGUMENT;
        if ((rc = pc_layout_parse(in[b].blob, in[b].size, &in[b].lay)) != PC_OK) return rc;
    }
    for (size_t b = 0; b < n; ++b) {
        if (in[b].delta == 0) continue;
        rc = pc_relocate_check(in[b].blob, in[b].size, &in[b].lay, in[b].delta, job->ropes, job->n_ropes);
        if (rc != PC_OK) return rc;
    }
    const pc_layout *l0 = &in[0].lay;
    size_t ext_ref = 0; /* the ext record is only visible in blobs with cells */
    while (ext_ref + 1 < n && in[ext_ref].lay.n_cell_total == 0) ++ext_ref;
    for (size_t b = 1; b < n; ++b) {
        const pc_layout *lb = &in[b].lay;
        if (lb->n_section != l0->n_section) return PC_ERR_MISMATCH;
        if (lb->n_cell_total && lb->cell_ext != in[ext_ref].lay.cell_ext) return PC_ERR_MISMATCH;
        for (uint32_t s = 0; s < l0->n_section; ++s) {
            if (lb->sec[s].n_stream != l0->sec[s].n_stream) return PC_ERR_MISMATCH;
        }
    }
    *need = 8;
    for (uint32_t s = 0; s < l0->n_section; ++s) {
        if ((rc = check_section(in, n, s, job->n_stream, need)) != PC_OK) return rc;
    }
    return PC_OK;
}

/* Cell records of every blob, each stamped with the output's seq_id. */
static void write_cells(pc_writer *w, const pc_input *in, size_t n, uint32_t s, int32_t seq_id) {
    for (size_t b = 0; b < n; ++b) {
        const pc_section *sec = &in[b].lay.sec[s];
        const size_t rec = pc_cell_bytes(in[b].lay.cell_ext);
        for (uint32_t i = 0; i < sec->n_cell; ++i) {
            const uint8_t *cell = in[b].blob + sec->cells_off + (size_t) i * rec;
            write_u32(w, (uint32_t) ((int32_t) pc_le32(cell) + in[b].delta)); /* checked: stays an int32 */
            write_bytes(w, cell + 4, rec - 8);
            write_u32(w, (uint32_t) seq_id);
        }
    }
}

/* Advances every non-empty input's cursor over its next layer record; writes ref's header. */
static void next_records(pc_writer *w, pc_input *in, size_t n, size_t ref, uint32_t s, uint32_t tr) {
    for (size_t b = 0; b < n; ++b) {
        if (in[b].lay.sec[s].n_cell) pc_layer_read(&in[b].cur, in[b].lay.sec[s].n_cell, tr, &in[b].rec);
    }
    write_bytes(w, in[ref].rec.header, PC_LAYER_HEADER_BYTES);
}

/* One thread's share of the queued rows: cells [first, end) counted across the turns in order. */
typedef struct {
    const pc_turn *turns;
    size_t n_turns;
    uint64_t first, end;
} pc_share;

static void *turn_share(void *arg) {
    const pc_share *sh = arg;
    uint64_t at = 0;
    for (size_t i = 0; i < sh->n_turns && at < sh->end; ++i) {
        const pc_turn *t = &sh->turns[i];
        const uint64_t lo = sh->first > at ? sh->first - at : 0;
        const uint64_t hi = sh->end - at < t->n_cell ? sh->end - at : t->n_cell;
        if (lo < hi) pc_rotate_rows(t->rows + lo * t->row_size, (size_t) (hi - lo), t->type, t->rope, t->plan);
        at += t->n_cell;
    }
    return NULL;
}

/* Threads that turn rows: $PC_NATIVE_THREADS, else the online CPUs, at most PC_MAX_TURN_THREADS. An
 * assemble runs while llama.cpp computes nothing (the scheduler restores before it decodes). */
#define PC_MAX_TURN_THREADS 8
static int turn_threads(void) {
#ifdef _WIN32
    return 1;
#else
    const char *env = getenv("PC_NATIVE_THREADS");
    long n = env && *env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > PC_MAX_TURN_THREADS ? PC_MAX_TURN_THREADS : (int) n;
#endif
}

/* Turns every queued row, split in equal shares of cells over the threads, and empties the queue. */
static void turn_queued(pc_job *job) {
    uint64_t total = 0;
    for (size_t i = 0; i < job->n_turns; ++i) total += job->turns[i].n_cell;
    int n_threads = turn_threads();
    if ((uint64_t) n_threads > total) n_threads = total ? (int) total : 1;
    pc_share shares[PC_MAX_TURN_THREADS];
    for (int t = 0; t < n_threads; ++t)
        shares[t] = (pc_share) { job->turns, job->n_turns, total * t / n_threads, total * (t + 1) / n_threads };
#ifndef _WIN32
    pthread_t threads[PC_MAX_TURN_THREADS];
    int started[PC_MAX_TURN_THREADS] = { 0 };
    if (n_threads > 1) {
        const pc_turn *any = job->turns;
        pc_rotate_rows(any->rows, 0, any->type, any->rope, any->plan); /* settles the CPU check before threads share it */
    }
    for (int t = 1; t < n_threads; ++t) started[t] = pthread_create(&threads[t], NULL, turn_share, &shares[t]) == 0;
    turn_share(&shares[0]);
    for (int t = 1; t < n_threads; ++t) {
        if (started[t]) pthread_join(threads[t], NULL);
        else turn_share(&shares[t]); /* no thread to be had: this one does that share too */
    }
#else
    for (int t = 0; t < n_threads; ++t) turn_share(&shares[t]);
#endif
    job->n_turns = 0;
}

/* One layer's rows: blob 0's cells, then blob 1's, ... (empty blobs add nothing). K rows of a
 * moving blob are queued to be re-rotated in the output (turned at once when the queue is full). */
static void write_rows(pc_writer *w, pc_job *job, uint32_t s, int is_k) {
    const pc_input *in = job->in;
    for (size_t b = 0; b < job->n; ++b) {
        const uint32_t n_cell = in[b].lay.sec[s].n_cell;
        if (n_cell == 0) continue;
        uint8_t *rows = w->out + w->off;
        write_bytes(w, in[b].rec.data, (size_t) in[b].rec.row_size * n_cell);
        if (!is_k || !in[b].delta) continue;
        if (job->turns && job->n_turns < job->cap_turns)
            job->turns[job->n_turns++] = (pc_turn) { rows, n_cell, in[b].rec.row_size, in[b].rec.type,
                                                     &job->ropes[s], &job->plans[b] };
        else
            pc_rotate_rows(rows, n_cell, in[b].rec.type, &job->ropes[s], &job->plans[b]);
    }
}

/* One transposed V layer: for each embedding element j, every blob's run of cells. */
static void write_elements(pc_writer *w, const pc_input *in, size_t n, uint32_t s, uint32_t n_embd) {
    for (uint32_t j = 0; j < n_embd; ++j) {
        for (size_t b = 0; b < n; ++b) {
            if (in[b].lay.sec[s].n_cell == 0) continue;
            const size_t run = (size_t) in[b].rec.el_size * in[b].lay.sec[s].n_cell;
            write_bytes(w, in[b].rec.data + (size_t) j * run, run);
        }
    }
}

/* The merged stream of section s: cells, then v_trans, n_layer and every layer record. */
static void write_stream(pc_writer *w, pc_job *job, size_t ref, uint32_t s, int32_t seq_id) {
    pc_input *in = job->in;
    const size_t n = job->n;
    const pc_section *rs = &in[ref].lay.sec[s];
    write_cells(w, in, n, s, seq_id);
    write_u32(w, rs->v_trans);
    write_u32(w, rs->n_layer);
    for (size_t b = 0; b < n; ++b) {
        const pc_section *sec = &in[b].lay.sec[s];
        in[b].cur = (pc_reader) { in[b].blob, in[b].size, sec->n_cell ? sec->data_off + 8 : 0 };
    }
    for (uint32_t il = 0; il < 2 * rs->n_layer; ++il) {
        const uint32_t tr = il >= rs->n_layer && rs->v_trans;
        next_records(w, in, n, ref, s, tr);
        if (tr) write_elements(w, in, n, s, in[ref].rec.n_embd);
        else write_rows(w, job, s, il < rs->n_layer);
    }
    if (job->n_turns) turn_queued(job); /* before the next section's plans replace this one's */
}

/* n_stream, then every stream's cell count; all cells go to the first non-empty input's stream,
 * or to stream 0 when the job sets the stream count (the inputs' stream index may not exist). */
static void write_section(pc_writer *w, pc_job *job, uint32_t s, int32_t seq_id) {
    const pc_input *in = job->in;
    const size_t n = job->n;
    const size_t ref = first_with_cells(in, n, s);
    uint32_t total = 0;
    for (size_t b = 0; b < n; ++b) total += in[b].lay.sec[s].n_cell;
    const uint32_t n_stream = job->n_stream ? job->n_stream : in[0].lay.sec[s].n_stream;
    const uint32_t target = ref == n ? PC_NO_STREAM : job->n_stream ? 0 : in[ref].lay.sec[s].stream;
    for (size_t b = 0; b < n; ++b) {
        if (in[b].delta && in[b].lay.sec[s].n_cell) pc_rope_plan_make(in[b].delta, &job->ropes[s], &job->plans[b]);
    }
    write_u32(w, n_stream);
    for (uint32_t st = 0; st < n_stream; ++st) {
        write_u32(w, st == target ? total : 0);
        if (st == target) write_stream(w, job, ref, s, seq_id);
    }
}

static int run_job(pc_job *job, uint8_t *out, size_t out_capacity, size_t *out_size) {
    size_t need = 0;
    int rc = check_inputs(job, &need);
    if (rc == PC_OK) {
        *out_size = need;
        if (need > out_capacity) rc = PC_ERR_CAPACITY;
    }
    if (rc == PC_OK && job->plans) { /* a section's K layers of every blob; without the memory, turned as copied */
        uint32_t layers = 0;
        for (uint32_t s = 0; s < job->in[0].lay.n_section; ++s)
            if (job->in[0].lay.sec[s].n_layer > layers) layers = job->in[0].lay.sec[s].n_layer;
        job->cap_turns = job->n * layers;
        job->turns = job->cap_turns ? malloc(job->cap_turns * sizeof(pc_turn)) : NULL;
        if (!job->turns) job->cap_turns = 0;
    }
    if (rc == PC_OK) {
        const pc_input *in = job->in;
        pc_writer w = { out, 0 };
        write_u32(&w, PC_MAGIC);
        write_u32(&w, (uint32_t) in[0].lay.seq_id);
        for (uint32_t s = 0; s < in[0].lay.n_section; ++s) write_section(&w, job, s, in[0].lay.seq_id);
        if (w.off != need) rc = PC_ERR_ARGUMENT; /* unreachable: the two passes disagree */
    }
    return rc;
}

/* Runs a splice of n_blobs inputs, moved by deltas (NULL: none) into n_stream streams (0: kept). */
static int splice_moved(const uint8_t *const *blobs, const size_t *sizes, const int32_t *deltas, size_t n_blobs,
                        const pc_rope_params *ropes, uint32_t n_ropes, uint32_t n_stream,
                        uint8_t *out, size_t out_capacity, size_t *out_size) {
    if (!blobs || !sizes || !out_size || n_blobs == 0) return PC_ERR_ARGUMENT;
    if (!out && out_capacity) return PC_ERR_ARGUMENT;
    pc_job job = { calloc(n_blobs, sizeof(pc_input)), n_blobs, ropes, n_ropes, n_stream, NULL, NULL, 0, 0 };
    int moving = 0;
    for (size_t b = 0; deltas && b < n_blobs; ++b) moving |= deltas[b] != 0;
    if (moving) job.plans = malloc(n_blobs * sizeof(pc_rope_plan));

    int rc = PC_ERR_NOMEM;
    if (job.in && (job.plans || !moving)) {
        for (size_t b = 0; b < n_blobs; ++b) {
            job.in[b].blob = blobs[b];
            job.in[b].size = sizes[b];
            job.in[b].delta = deltas ? deltas[b] : 0;
        }
        rc = run_job(&job, out, out_capacity, out_size);
    }
    free(job.turns);
    free(job.plans);
    free(job.in);
    return rc;
}

int pc_state_assemble(const uint8_t *const *blobs, const size_t *sizes, const int32_t *deltas, size_t n_blobs,
                      const pc_rope_params *ropes, uint32_t n_ropes, uint32_t n_stream,
                      uint8_t *out, size_t out_capacity, size_t *out_size) {
    if (!deltas || n_stream == 0 || n_stream > PC_MAX_STREAM) return PC_ERR_ARGUMENT;
    return splice_moved(blobs, sizes, deltas, n_blobs, ropes, n_ropes, n_stream, out, out_capacity, out_size);
}
