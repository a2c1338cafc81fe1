/* transpose.c: the transpose of `ibcoll-bench transpose` (benches/src/
 * transpose/) written against MPI, with the same array, grid, protocols
 * (those MPI has: Open MPI's alltoall algorithms cannot be forced per call),
 * checks and tables, so the two can be compared side by side
 * (benches/transpose.sh).
 *
 *   mpicc -O2 -o transpose transpose.c
 *   mpirun -np P ./transpose [--grid RxC] [--size N] [-i ITERS] [-x WARMUP]
 *
 * The P ranks form an R x C grid (rank = row * C + column), split into row
 * (C ranks) and column (R ranks) communicators. A global N x N x N array of
 * f64 starts in z-pencils (x-block `row`, y-block `column`, every z); one
 * timed transpose goes to x-pencils (across the row, then the column) and
 * back; both results are compared with the reference on every rank, every
 * run. Repetition k starts at protocol k; a run's time is the slowest
 * rank's; a protocol's time is the median of its repetitions.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG 20

typedef struct { size_t off[3], len[3]; } box3;

static size_t count(const box3 *b) { return b->len[0] * b->len[1] * b->len[2]; }

static box3 swapped(box3 b, int cut, int whole, size_t p, size_t me, size_t n) {
    b.len[cut] /= p;
    b.off[cut] = me * b.len[cut];
    b.len[whole] = n;
    b.off[whole] = 0;
    return b;
}

static double value(size_t n, size_t x, size_t y, size_t z) { return (double)((x * n + y) * n + z); }

static void fill(size_t n, const box3 *b, double *out) {
    size_t i = 0;
    for (size_t x = 0; x < b->len[0]; x++)
        for (size_t y = 0; y < b->len[1]; y++)
            for (size_t z = 0; z < b->len[2]; z++)
                out[i++] = value(n, b->off[0] + x, b->off[1] + y, b->off[2] + z);
}

static const char *grid_name;
static const char *proto_name;

static void check(size_t n, const box3 *b, const double *d, const char *what) {
    size_t i = 0;
    for (size_t x = 0; x < b->len[0]; x++)
        for (size_t y = 0; y < b->len[1]; y++)
            for (size_t z = 0; z < b->len[2]; z++, i++) {
                size_t g[3] = {b->off[0] + x, b->off[1] + y, b->off[2] + z};
                double want = value(n, g[0], g[1], g[2]);
                if (memcmp(&d[i], &want, sizeof want) != 0) {
                    int me;
                    MPI_Comm_rank(MPI_COMM_WORLD, &me);
                    fprintf(stderr,
                            "transpose rank %d: WRONG RESULT: grid %s, protocol %s, %s: element "
                            "[%zu, %zu, %zu] of the %zu^3 array is %g, want %g\n",
                            me, grid_name, proto_name, what, g[0], g[1], g[2], n, d[i], want);
                    MPI_Abort(MPI_COMM_WORLD, 3);
                }
            }
}

static void pack(const double *src, const box3 *b, int cut, size_t p, double *send) {
    size_t st[3] = {b->len[1] * b->len[2], b->len[2], 1}, s[3] = {b->len[0], b->len[1], b->len[2]};
    s[cut] /= p;
    size_t o = 0;
    for (size_t q = 0; q < p; q++) {
        size_t base = q * s[cut] * st[cut];
        for (size_t x = 0; x < s[0]; x++)
            for (size_t y = 0; y < s[1]; y++) {
                memcpy(&send[o], &src[base + x * st[0] + y * st[1]], s[2] * sizeof(double));
                o += s[2];
            }
    }
}

static void unpack(const double *recv, const box3 *d, int whole, size_t p, double *dst) {
    size_t st[3] = {d->len[1] * d->len[2], d->len[2], 1}, s[3] = {d->len[0], d->len[1], d->len[2]};
    s[whole] /= p;
    size_t i = 0;
    for (size_t q = 0; q < p; q++) {
        size_t base = q * s[whole] * st[whole];
        for (size_t x = 0; x < s[0]; x++)
            for (size_t y = 0; y < s[1]; y++) {
                memcpy(&dst[base + x * st[0] + y * st[1]], &recv[i], s[2] * sizeof(double));
                i += s[2];
            }
    }
}

/* ------------------------------------------------------------ protocols */
/* Each: `send` in `n` equal blocks of `b` doubles (block q for rank q),
 * `recv` filled the same way (block p from rank p). */

typedef void (*proto_fn)(MPI_Comm, const double *, double *, int b);

static void own(MPI_Comm c, const double *s, double *r, int b, int *n, int *me) {
    MPI_Comm_size(c, n);
    MPI_Comm_rank(c, me);
    memcpy(&r[(size_t)*me * b], &s[(size_t)*me * b], (size_t)b * sizeof(double));
}

static void p_alltoall(MPI_Comm c, const double *s, double *r, int b) {
    MPI_Alltoall(s, b, MPI_DOUBLE, r, b, MPI_DOUBLE, c);
}

static void p_ialltoall(MPI_Comm c, const double *s, double *r, int b) {
    MPI_Request q;
    MPI_Ialltoall(s, b, MPI_DOUBLE, r, b, MPI_DOUBLE, c, &q);
    MPI_Wait(&q, MPI_STATUS_IGNORE);
}

static void p_alltoallv(MPI_Comm c, const double *s, double *r, int b) {
    int n;
    MPI_Comm_size(c, &n);
    int *cnt = malloc(n * sizeof(int)), *dsp = malloc(n * sizeof(int));
    for (int i = 0; i < n; i++) cnt[i] = b, dsp[i] = i * b;
    MPI_Alltoallv(s, cnt, dsp, MPI_DOUBLE, r, cnt, dsp, MPI_DOUBLE, c);
    free(cnt);
    free(dsp);
}

static void p_sendrecv_shift(MPI_Comm c, const double *s, double *r, int b) {
    int n, me;
    own(c, s, r, b, &n, &me);
    for (int k = 1; k < n; k++) {
        int to = (me + k) % n, from = (me + n - k) % n;
        MPI_Sendrecv(&s[(size_t)to * b], b, MPI_DOUBLE, to, TAG, &r[(size_t)from * b], b, MPI_DOUBLE,
                     from, TAG, c, MPI_STATUS_IGNORE);
    }
}

static int pow2(int n) { int p = 1; while (p < n) p *= 2; return p; }

static void p_sendrecv_xor(MPI_Comm c, const double *s, double *r, int b) {
    int n, me;
    own(c, s, r, b, &n, &me);
    for (int k = 1; k < pow2(n); k++) {
        int p = me ^ k;
        if (p >= n) continue;
        MPI_Sendrecv(&s[(size_t)p * b], b, MPI_DOUBLE, p, TAG, &r[(size_t)p * b], b, MPI_DOUBLE, p, TAG,
                     c, MPI_STATUS_IGNORE);
    }
}

/* Lower rank of each pair sends first, the higher receives first. */
static void p_send_recv_xor(MPI_Comm c, const double *s, double *r, int b) {
    int n, me;
    own(c, s, r, b, &n, &me);
    for (int k = 1; k < pow2(n); k++) {
        int p = me ^ k;
        if (p >= n) continue;
        const double *o = &s[(size_t)p * b];
        double *in = &r[(size_t)p * b];
        if (me < p) {
            MPI_Send(o, b, MPI_DOUBLE, p, TAG, c);
            MPI_Recv(in, b, MPI_DOUBLE, p, TAG, c, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(in, b, MPI_DOUBLE, p, TAG, c, MPI_STATUS_IGNORE);
            MPI_Send(o, b, MPI_DOUBLE, p, TAG, c);
        }
    }
}

static void window(MPI_Comm c, const double *s, double *r, int b, int w) {
    int n, me;
    own(c, s, r, b, &n, &me);
    MPI_Request *q = malloc(2 * (size_t)n * sizeof(MPI_Request));
    for (int k = 1; k < n; k += w) {
        int end = k + w < n ? k + w : n, m = 0;
        for (int st = k; st < end; st++) {
            int from = (me + n - st) % n;
            MPI_Irecv(&r[(size_t)from * b], b, MPI_DOUBLE, from, TAG, c, &q[m++]);
        }
        for (int st = k; st < end; st++) {
            int to = (me + st) % n;
            MPI_Isend(&s[(size_t)to * b], b, MPI_DOUBLE, to, TAG, c, &q[m++]);
        }
        MPI_Waitall(m, q, MPI_STATUSES_IGNORE);
    }
    free(q);
}

static void p_all(MPI_Comm c, const double *s, double *r, int b) { window(c, s, r, b, 1 << 30); }
static void p_window2(MPI_Comm c, const double *s, double *r, int b) { window(c, s, r, b, 2); }

/* Shift order, blocking sends, each receive posted one step ahead. */
static void p_recv_ahead(MPI_Comm c, const double *s, double *r, int b) {
    int n, me;
    own(c, s, r, b, &n, &me);
    if (n < 2) return;
    MPI_Request ahead, next = MPI_REQUEST_NULL;
    int from = (me + n - 1) % n;
    MPI_Irecv(&r[(size_t)from * b], b, MPI_DOUBLE, from, TAG, c, &ahead);
    for (int k = 1; k < n; k++) {
        next = MPI_REQUEST_NULL;
        if (k + 1 < n) {
            int f = (me + n - k - 1) % n;
            MPI_Irecv(&r[(size_t)f * b], b, MPI_DOUBLE, f, TAG, c, &next);
        }
        int to = (me + k) % n;
        MPI_Send(&s[(size_t)to * b], b, MPI_DOUBLE, to, TAG, c);
        MPI_Wait(&ahead, MPI_STATUS_IGNORE);
        ahead = next;
    }
}

static const struct { const char *name; proto_fn f; } protos[] = {
    {"alltoall", p_alltoall},
    {"ialltoall", p_ialltoall},
    {"alltoallv", p_alltoallv},
    {"sendrecv/shift", p_sendrecv_shift},
    {"sendrecv/xor", p_sendrecv_xor},
    {"send-recv/xor", p_send_recv_xor},
    {"irecv-isend/all", p_all},
    {"irecv-isend/window2", p_window2},
    {"irecv-ahead/send", p_recv_ahead},
};
#define NP ((int)(sizeof protos / sizeof protos[0]))

/* ------------------------------------------------------------ kernel */

typedef struct {
    MPI_Comm row, col;
    int r, c;
    size_t n;
    box3 z, y, x;
    double *zs, *ys, *xs, *zback, *send, *recv;
} grid;

static void swap(MPI_Comm comm, proto_fn f, const double *src, const box3 *from, int cut, int whole,
                 const box3 *to, double *dst, grid *g) {
    int k;
    MPI_Comm_size(comm, &k);
    pack(src, from, cut, k, g->send);
    f(comm, g->send, g->recv, (int)(count(from) / k));
    unpack(g->recv, to, whole, k, dst);
}

static double run_once(grid *g, proto_fn f) {
    size_t cnt = count(&g->z);
    for (size_t i = 0; i < cnt; i++) g->ys[i] = g->xs[i] = g->zback[i] = g->recv[i] = NAN;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    swap(g->row, f, g->zs, &g->z, 2, 1, &g->y, g->ys, g);
    swap(g->col, f, g->ys, &g->y, 1, 0, &g->x, g->xs, g);
    double there = MPI_Wtime() - t0;
    check(g->n, &g->x, g->xs, "after the transpose to x-pencils");
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    swap(g->col, f, g->xs, &g->x, 0, 1, &g->y, g->ys, g);
    swap(g->row, f, g->ys, &g->y, 1, 2, &g->z, g->zback, g);
    double again = MPI_Wtime() - t0;
    check(g->n, &g->z, g->zback, "after the transpose back to z-pencils");
    return there + again;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double *s = malloc(n * sizeof(double));
    memcpy(s, v, n * sizeof(double));
    qsort(s, n, sizeof(double), cmpd);
    double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    free(s);
    return m;
}

static size_t gcd(size_t a, size_t b) { return b ? gcd(b, a % b) : a; }

static char summaries[64][512];
static int nsum;

static void run_grid(int r, int c, size_t n0, int iters, int warm) {
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    size_t l = r / gcd(r, c) * c, n = (n0 + l - 1) / l * l;
    if (n == 0) n = l;
    grid g = {.r = r, .c = c, .n = n};
    int i = me / c, j = me % c;
    MPI_Comm_split(MPI_COMM_WORLD, i, j, &g.row);
    MPI_Comm_split(MPI_COMM_WORLD, j, i, &g.col);
    g.z = (box3){{i * n / r, j * n / c, 0}, {n / r, n / c, n}};
    g.y = swapped(g.z, 2, 1, c, j, n);
    g.x = swapped(g.y, 1, 0, r, i, n);
    size_t cnt = count(&g.z);
    double **bufs[] = {&g.zs, &g.ys, &g.xs, &g.zback, &g.send, &g.recv};
    for (int k = 0; k < 6; k++) *bufs[k] = malloc(cnt * sizeof(double));
    fill(n, &g.z, g.zs);
    char name[32];
    snprintf(name, sizeof name, "%dx%d", r, c);
    grid_name = name;
    double *t = calloc((size_t)NP * iters, sizeof(double)), *slow = calloc((size_t)NP * iters, sizeof(double));
    for (int rep = 0; rep < warm + iters; rep++)
        for (int k = 0; k < NP; k++) {
            int p = (k + rep) % NP;
            proto_name = protos[p].name;
            double s = run_once(&g, protos[p].f);
            if (rep >= warm) t[p * iters + rep - warm] = s;
        }
    MPI_Allreduce(t, slow, NP * iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (me == 0) {
        double med[NP], mn[NP], mx[NP];
        int order[NP];
        for (int p = 0; p < NP; p++) {
            med[p] = median(&slow[p * iters], iters);
            mn[p] = INFINITY, mx[p] = 0;
            for (int k = 0; k < iters; k++) {
                double v = slow[p * iters + k];
                mn[p] = v < mn[p] ? v : mn[p];
                mx[p] = v > mx[p] ? v : mx[p];
            }
            order[p] = p;
        }
        for (int a = 1; a < NP; a++) /* insertion sort by median; ties keep list order */
            for (int b = a; b > 0 && med[order[b]] < med[order[b - 1]]; b--) {
                int x = order[b]; order[b] = order[b - 1]; order[b - 1] = x;
            }
        printf("# grid %s: rows of %d ranks, columns of %d; N = %zu (%zu^3 f64, %zu KiB per rank; "
               "blocks %zu B across rows, %zu B across columns); %d protocols x %d repetitions "
               "(+%d warm-up), interleaved; time = slowest rank, there and back\n",
               name, c, r, n, n, cnt * 8 / 1024, cnt / c * 8, cnt / r * 8, NP, iters, warm);
        printf("# %-22s%14s%12s%12s%9s\n", "protocol", "median(us)", "min(us)", "max(us)", "/best");
        double best = med[order[0]], sum = 0, times[NP];
        for (int k = 0; k < NP; k++) {
            int p = order[k];
            printf("  %-22s%14.1f%12.1f%12.1f%9.3f\n", protos[p].name, med[p] * 1e6, mn[p] * 1e6,
                   mx[p] * 1e6, med[p] / best);
            sum += med[p];
            times[k] = med[p];
        }
        printf("# grid %s: %d protocols x %d runs checked on every rank: ok\n", name, NP, warm + iters);
        int w[3] = {0, 0, 0};
        double f[3] = {0.01, 0.05, 0.25};
        for (int k = 0; k < NP; k++)
            for (int m = 0; m < 3; m++) w[m] += times[k] <= best * (1 + f[m]);
        char within[32];
        snprintf(within, sizeof within, "%d/%d/%d", w[0], w[1], w[2]);
        double mean = sum / NP, medall = median(times, NP);
        snprintf(summaries[nsum++], sizeof summaries[0],
                 "  %-8s%9d%11.1f%16.3f%18.3f%15.3f%16s  %s, %s, %s", name, NP, best * 1e6,
                 (mean - best) / best, (medall - best) / best, (times[NP - 1] - best) / best, within,
                 protos[order[0]].name, protos[order[1]].name, protos[order[2]].name);
    }
    free(t);
    free(slow);
    for (int k = 0; k < 6; k++) free(*bufs[k]);
    MPI_Comm_free(&g.row);
    MPI_Comm_free(&g.col);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int p, me, gr = 0, gc = 0, iters = 10, warm = 1;
    size_t n = 64;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    for (int a = 1; a < argc; a++) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        int ok = v != NULL;
        if (!strcmp(argv[a], "--grid")) ok = ok && sscanf(v, "%dx%d", &gr, &gc) == 2 && gr > 0 && gc > 0;
        else if (!strcmp(argv[a], "--size")) ok = ok && (n = strtoull(v, NULL, 10)) > 0;
        else if (!strcmp(argv[a], "-i")) ok = ok && (iters = atoi(v)) > 0;
        else if (!strcmp(argv[a], "-x")) ok = ok && (warm = atoi(v)) >= 0;
        else ok = 0;
        if (!ok) {
            if (me == 0)
                fprintf(stderr, "usage: transpose [--grid RxC] [--size N] [-i ITERS] [-x WARMUP] (bad: %s)\n",
                        argv[a]);
            MPI_Finalize();
            return 2;
        }
        a++;
    }
    if (gr && gr * gc != p) {
        if (me == 0) fprintf(stderr, "transpose: --grid %dx%d needs %d ranks, the job has %d\n", gr, gc, gr * gc, p);
        MPI_Finalize();
        return 2;
    }
    if (me == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        char *comma = strchr(lib, ',');
        if (comma) *comma = 0;
        printf("# MPI Transpose Protocols (PSTSWM-style): %s\n# ranks %d\n", lib, p);
    }
    for (int r = p; r >= 1; r--) {
        if (p % r || (gr && r != gr)) continue;
        run_grid(r, p / r, n, iters, warm);
    }
    if (me == 0) {
        printf("# PSTSWM summary (protocol time = median of its repetitions)\n");
        printf("# grid   protocols   best(us)  (mean-min)/min  (median-min)/min  (max-min)/min  "
               "within 1/5/25%%  fastest three\n");
        for (int k = 0; k < nsum; k++) printf("%s\n", summaries[k]);
    }
    MPI_Finalize();
    return 0;
}
