/* Collectives on a non-contiguous derived datatype: a vector of doubles
 * (3 blocks of 2, stride 3: each element is 8 doubles, 6 of them data,
 * positions 2 and 5 gaps) in the nonblocking collectives, the blocking
 * v-collectives and the reductions. Every receive buffer starts with its
 * gaps at GAP and its data at UNSET; after each call the whole buffer is
 * compared with what MPI specifies: the data where blocks land, UNSET
 * where no block lands (the holes between v-blocks), GAP in every gap.
 * In-place and mixed (contiguous against vector) forms too, scans,
 * MPI_Reduce_local, and MPI_Request_free's refusal of a nonblocking
 * collective's request.
 * Runs on any number of ranks; prints "derived_coll: ok" on rank 0 when
 * every check passed, exits non-zero otherwise. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXT 8 /* doubles per element (the extent) */
#define W 6   /* data doubles per element */
#define C 2   /* elements per block in the uniform collectives */
#define GAP -999.0
#define UNSET -1.0

static int rank, size, fails;
static MPI_Datatype vec;
static const int off[W] = {0, 1, 3, 4, 6, 7};

#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__, __LINE__, #c); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

/* A buffer of `elems` elements: gaps GAP, data UNSET. */
static double *buf(int elems) {
    double *b = malloc(sizeof(double) * (elems > 0 ? elems : 1) * EXT);
    for (int k = 0; k < elems * EXT; k++) b[k] = (k % EXT == 2 || k % EXT == 5) ? GAP : UNSET;
    return b;
}

static double *copy(const double *b, int elems) {
    double *c = malloc(sizeof(double) * (elems > 0 ? elems : 1) * EXT);
    memcpy(c, b, sizeof(double) * elems * EXT);
    return c;
}

/* Packed datum `i` of the elements from element `e0` of `b`. */
static double *at(double *b, int e0, int i) { return &b[e0 * EXT + (i / W) * EXT + off[i % W]]; }

/* Sets `count` elements from `e0` to base + packed index. */
static void fill(double *b, int e0, int count, double base) {
    for (int i = 0; i < count * W; i++) *at(b, e0, i) = base + i;
}

static void same(const char *what, const double *got, const double *want, int elems) {
    for (int k = 0; k < elems * EXT; k++)
        if (got[k] != want[k]) {
            CHECK(got[k] == want[k], "%s: double %d (element %d, position %d) is %g, want %g",
                  what, k, k / EXT, k % EXT, got[k], want[k]);
            return;
        }
}

static int cnt(int r) { return r % 3 + 1; }

/* Displacements (in elements) that put block q at the end first, each
 * followed by a one-element hole; gives the buffer's elements. */
static int reversed(int (*count)(int, int), int arg, int *d) {
    int at_ = 0;
    for (int q = size - 1; q >= 0; q--) { d[q] = at_; at_ += count(q, arg) + 1; }
    return at_;
}

static int cnt_of(int q, int unused) { (void)unused; return cnt(q); }
/* Alltoallv: rank r sends (r + q) % 3 + 1 elements to q. */
static int a2a(int from, int to) { return (from + to) % 3 + 1; }
static int a2a_from(int q, int me) { return a2a(q, me); }

/* A user operation: never called here (refused before any data moves). */
static void noop(void *in, void *inout, int *len, MPI_Datatype *dt) { (void)in; (void)inout; (void)len; (void)dt; }

static void wait1(MPI_Request *r) { MPI_Wait(r, MPI_STATUS_IGNORE); CHECK(*r == MPI_REQUEST_NULL, "request not nulled"); }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Type_vector(3, 2, 3, MPI_DOUBLE, &vec);
    MPI_Type_commit(&vec);
    {
        MPI_Aint lb, ext; int sz;
        MPI_Type_get_extent(vec, &lb, &ext);
        MPI_Type_size(vec, &sz);
        CHECK(lb == 0 && ext == EXT * 8 && sz == W * 8, "vector lb %ld extent %ld size %d", (long)lb, (long)ext, sz);
    }
    int n = size, root = size - 1;
    MPI_Request rq[4];
    int flag;

    /* Ibcast from the last rank, completed with an MPI_Test loop. */
    {
        double *b = buf(C), *want = buf(C);
        fill(want, 0, C, 1000);
        if (rank == root) fill(b, 0, C, 1000);
        MPI_Ibcast(b, C, vec, root, MPI_COMM_WORLD, &rq[0]);
        do { MPI_Test(&rq[0], &flag, MPI_STATUS_IGNORE); } while (!flag);
        same("ibcast", b, want, C);
        free(b); free(want);
    }

    /* Iallreduce (MPI_SUM on the doubles), then in place; Ireduce. */
    {
        double *s = buf(C), *r = buf(C), *want = buf(C);
        fill(s, 0, C, rank);
        for (int i = 0; i < C * W; i++) *at(want, 0, i) = n * (n - 1) / 2.0 + (double)n * i;
        MPI_Iallreduce(s, r, C, vec, MPI_SUM, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("iallreduce", r, want, C);
        MPI_Iallreduce(MPI_IN_PLACE, s, C, vec, MPI_SUM, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("iallreduce in place", s, want, C);
        double *r2 = buf(C), *untouched = buf(C);
        fill(s, 0, C, rank);
        MPI_Ireduce(s, r2, C, vec, MPI_SUM, root, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("ireduce", r2, rank == root ? want : untouched, C);
        free(s); free(r); free(r2); free(want); free(untouched);
    }

    /* Igather and Iscatter (root 0), completed together by MPI_Waitall. */
    {
        double *gs = buf(C), *gr = buf(n * C), *gw = buf(n * C);
        double *ss = buf(n * C), *sr = buf(C), *sw = buf(C);
        fill(gs, 0, C, rank * 100);
        if (rank == 0) {
            for (int q = 0; q < n; q++) fill(gw, q * C, C, q * 100);
            fill(ss, 0, n * C, 5000);
        }
        fill(sw, 0, C, 5000 + rank * C * W);
        double *gw0 = rank == 0 ? gw : copy(gr, n * C);
        MPI_Igather(gs, C, vec, gr, C, vec, 0, MPI_COMM_WORLD, &rq[0]);
        MPI_Iscatter(ss, C, vec, sr, C, vec, 0, MPI_COMM_WORLD, &rq[1]);
        MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
        same("igather", gr, gw0, n * C);
        same("iscatter", sr, sw, C);
        if (gw0 != gw) free(gw0);
        free(gs); free(gr); free(gw); free(ss); free(sr); free(sw);
    }

    /* Iallgather (MPI_Waitsome loop) and Ialltoall (MPI_Testany loop). */
    {
        double *s = buf(C), *r = buf(n * C), *want = buf(n * C);
        fill(s, 0, C, rank * 100);
        for (int q = 0; q < n; q++) fill(want, q * C, C, q * 100);
        MPI_Iallgather(s, C, vec, r, C, vec, MPI_COMM_WORLD, &rq[0]);
        int outc, idx[1];
        do { MPI_Waitsome(1, rq, &outc, idx, MPI_STATUSES_IGNORE); } while (outc != MPI_UNDEFINED && rq[0] != MPI_REQUEST_NULL);
        same("iallgather", r, want, n * C);
        double *as = buf(n * C), *ar = buf(n * C), *aw = buf(n * C);
        for (int q = 0; q < n; q++) {
            fill(as, q * C, C, rank * 1000 + q * 100);
            fill(aw, q * C, C, q * 1000 + rank * 100);
        }
        MPI_Ialltoall(as, C, vec, ar, C, vec, MPI_COMM_WORLD, &rq[0]);
        int which;
        do { MPI_Testany(1, rq, &which, &flag, MPI_STATUS_IGNORE); } while (!flag);
        CHECK(which == 0 && rq[0] == MPI_REQUEST_NULL, "testany index %d", which);
        same("ialltoall", ar, aw, n * C);
        free(s); free(r); free(want); free(as); free(ar); free(aw);
    }

    /* Gatherv/Igatherv and Scatterv (root 0): rank q's block is cnt(q)
     * elements, the root's blocks in reverse order with holes. */
    int *d = malloc(sizeof(int) * n), *k = malloc(sizeof(int) * n);
    for (int q = 0; q < n; q++) k[q] = cnt(q);
    int tot = reversed(cnt_of, 0, d);
    for (int nb = 0; nb < 2; nb++) {
        double *s = buf(cnt(rank)), *r = buf(tot), *want = buf(tot);
        fill(s, 0, cnt(rank), rank * 100);
        if (rank == 0) for (int q = 0; q < n; q++) fill(want, d[q], cnt(q), q * 100);
        if (nb) {
            MPI_Igatherv(s, cnt(rank), vec, r, k, d, vec, 0, MPI_COMM_WORLD, &rq[0]);
            wait1(&rq[0]);
        } else {
            MPI_Gatherv(s, cnt(rank), vec, r, k, d, vec, 0, MPI_COMM_WORLD);
        }
        same(nb ? "igatherv" : "gatherv", r, want, tot);
        free(s); free(r); free(want);
    }
    {
        double *s = buf(tot), *r = buf(cnt(rank)), *want = buf(cnt(rank));
        if (rank == 0) for (int q = 0; q < n; q++) fill(s, d[q], cnt(q), 5000 + q * 100);
        fill(want, 0, cnt(rank), 5000 + rank * 100);
        MPI_Scatterv(s, k, d, vec, r, cnt(rank), vec, 0, MPI_COMM_WORLD);
        same("scatterv", r, want, cnt(rank));
        free(s); free(r); free(want);
    }

    /* Allgatherv, blocks reversed with holes. */
    {
        double *s = buf(cnt(rank)), *r = buf(tot), *want = buf(tot);
        fill(s, 0, cnt(rank), rank * 100);
        for (int q = 0; q < n; q++) fill(want, d[q], cnt(q), q * 100);
        MPI_Allgatherv(s, cnt(rank), vec, r, k, d, vec, MPI_COMM_WORLD);
        same("allgatherv", r, want, tot);
        free(s); free(r); free(want);
    }

    /* Alltoallv/Ialltoallv: send blocks in order with holes, receive
     * blocks reversed with holes. */
    {
        int *sk = malloc(sizeof(int) * n), *sd = malloc(sizeof(int) * n);
        int *rk = malloc(sizeof(int) * n), *rd = malloc(sizeof(int) * n), stot = 0;
        for (int q = 0; q < n; q++) { sk[q] = a2a(rank, q); sd[q] = stot; stot += sk[q] + 1; rk[q] = a2a(q, rank); }
        int rtot = reversed(a2a_from, rank, rd);
        for (int nb = 0; nb < 2; nb++) {
            double *s = buf(stot), *r = buf(rtot), *want = buf(rtot);
            for (int q = 0; q < n; q++) {
                fill(s, sd[q], sk[q], rank * 1000 + q * 100);
                fill(want, rd[q], rk[q], q * 1000 + rank * 100);
            }
            if (nb) {
                MPI_Ialltoallv(s, sk, sd, vec, r, rk, rd, vec, MPI_COMM_WORLD, &rq[0]);
                wait1(&rq[0]);
            } else {
                MPI_Alltoallv(s, sk, sd, vec, r, rk, rd, vec, MPI_COMM_WORLD);
            }
            same(nb ? "ialltoallv" : "alltoallv", r, want, rtot);
            free(s); free(r); free(want);
        }
        /* Alltoallw with the same layout: displacements in bytes. */
        {
            int *sdb = malloc(sizeof(int) * n), *rdb = malloc(sizeof(int) * n);
            MPI_Datatype *ts = malloc(sizeof(MPI_Datatype) * n);
            for (int q = 0; q < n; q++) { sdb[q] = sd[q] * EXT * 8; rdb[q] = rd[q] * EXT * 8; ts[q] = vec; }
            double *s = buf(stot), *r = buf(rtot), *want = buf(rtot);
            for (int q = 0; q < n; q++) {
                fill(s, sd[q], sk[q], rank * 1000 + q * 100);
                fill(want, rd[q], rk[q], q * 1000 + rank * 100);
            }
            MPI_Alltoallw(s, sk, sdb, ts, r, rk, rdb, ts, MPI_COMM_WORLD);
            same("alltoallw", r, want, rtot);
            free(s); free(r); free(want); free(sdb); free(rdb); free(ts);
        }
        free(sk); free(sd); free(rk); free(rd);
    }

    /* Igatherv and Ialltoallv started together, completed by one
     * MPI_Waitall in the other order. */
    {
        double *s = buf(cnt(rank)), *r = buf(tot), *want = buf(tot);
        fill(s, 0, cnt(rank), rank * 100 + 7);
        if (rank == 0) for (int q = 0; q < n; q++) fill(want, d[q], cnt(q), q * 100 + 7);
        double *bs = buf(C), *br = buf(C), *bw = buf(C);
        fill(bs, 0, C, rank + 0.5);
        for (int i = 0; i < C * W; i++) *at(bw, 0, i) = n * (n - 1) / 2.0 + n * (0.5 + i);
        MPI_Iallreduce(bs, br, C, vec, MPI_SUM, MPI_COMM_WORLD, &rq[1]);
        MPI_Igatherv(s, cnt(rank), vec, r, k, d, vec, 0, MPI_COMM_WORLD, &rq[0]);
        MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
        same("igatherv with iallreduce", r, want, tot);
        same("iallreduce with igatherv", br, bw, C);
        free(s); free(r); free(want); free(bs); free(br); free(bw);
    }

    /* Reduce_scatter: rank q gets q % 2 + 1 elements of the sums. */
    {
        int *rc = malloc(sizeof(int) * n), all = 0, before = 0;
        for (int q = 0; q < n; q++) { rc[q] = q % 2 + 1; if (q < rank) before += rc[q]; all += rc[q]; }
        double *s = buf(all), *r = buf(rc[rank]), *want = buf(rc[rank]);
        fill(s, 0, all, rank);
        for (int i = 0; i < rc[rank] * W; i++) *at(want, 0, i) = n * (n - 1) / 2.0 + (double)n * (before * W + i);
        MPI_Reduce_scatter(s, r, rc, vec, MPI_SUM, MPI_COMM_WORLD);
        same("reduce_scatter", r, want, rc[rank]);
        /* In place: the input is the whole buffer, the result its start. */
        double *ip = buf(all), *ipw = buf(all);
        fill(ip, 0, all, rank);
        memcpy(ipw, ip, sizeof(double) * all * EXT);
        for (int i = 0; i < rc[rank] * W; i++) *at(ipw, 0, i) = *at(want, 0, i);
        MPI_Reduce_scatter(MPI_IN_PLACE, ip, rc, vec, MPI_SUM, MPI_COMM_WORLD);
        same("reduce_scatter in place", ip, ipw, rc[rank]);
        free(rc); free(s); free(r); free(want); free(ip); free(ipw);
    }

    /* In place, mixed sides (a contiguous MPI_DOUBLE side against the
     * vector), and the other nonblocking v/w forms. */
    {
        /* Igather and Iscatter in place at the root (0). */
        double *g = buf(n * C), *gw = buf(n * C), *own = buf(C);
        if (rank == 0) {
            fill(g, 0, C, 0);
            for (int q = 0; q < n; q++) fill(gw, q * C, C, q * 100);
        } else {
            fill(own, 0, C, rank * 100);
        }
        if (rank == 0) MPI_Igather(MPI_IN_PLACE, C, vec, g, C, vec, 0, MPI_COMM_WORLD, &rq[0]);
        else MPI_Igather(own, C, vec, NULL, 0, vec, 0, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        if (rank == 0) same("igather in place", g, gw, n * C);
        double *sc = buf(n * C), *scw = buf(n * C), *mine = buf(C), *minew = buf(C);
        if (rank == 0) { fill(sc, 0, n * C, 5000); memcpy(scw, sc, sizeof(double) * n * C * EXT); }
        fill(minew, 0, C, 5000 + rank * C * W);
        if (rank == 0) MPI_Iscatter(sc, C, vec, MPI_IN_PLACE, C, vec, 0, MPI_COMM_WORLD, &rq[0]);
        else MPI_Iscatter(NULL, 0, vec, mine, C, vec, 0, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        if (rank == 0) same("iscatter in place (root's buffer)", sc, scw, n * C);
        else same("iscatter in place (others)", mine, minew, C);
        free(g); free(gw); free(own); free(sc); free(scw); free(mine); free(minew);
    }
    {
        /* Iallgather and Ialltoall in place. */
        double *g = buf(n * C), *gw = buf(n * C);
        fill(g, rank * C, C, rank * 100);
        for (int q = 0; q < n; q++) fill(gw, q * C, C, q * 100);
        MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g, C, vec, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("iallgather in place", g, gw, n * C);
        double *a = buf(n * C), *aw = buf(n * C);
        for (int q = 0; q < n; q++) {
            fill(a, q * C, C, rank * 1000 + q * 100);
            fill(aw, q * C, C, q * 1000 + rank * 100);
        }
        MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a, C, vec, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("ialltoall in place", a, aw, n * C);
        free(g); free(gw); free(a); free(aw);
    }
    {
        /* Mixed: contiguous doubles sent, vectors received (Iallgather);
         * vectors sent, contiguous doubles received (Igather at 0). */
        double *cs = malloc(sizeof(double) * C * W), *r = buf(n * C), *want = buf(n * C);
        for (int i = 0; i < C * W; i++) cs[i] = rank * 100 + i;
        for (int q = 0; q < n; q++) fill(want, q * C, C, q * 100);
        MPI_Iallgather(cs, C * W, MPI_DOUBLE, r, C, vec, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("iallgather doubles into vectors", r, want, n * C);
        double *vs = buf(C), *cr = malloc(sizeof(double) * n * C * W);
        fill(vs, 0, C, rank * 100);
        MPI_Igather(vs, C, vec, cr, C * W, MPI_DOUBLE, 0, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        if (rank == 0)
            for (int q = 0; q < n; q++)
                for (int i = 0; i < C * W; i++)
                    CHECK(cr[q * C * W + i] == q * 100 + i, "igather vectors into doubles: rank %d's %d is %g", q, i, cr[q * C * W + i]);
        free(cs); free(r); free(want); free(vs); free(cr);
    }
    {
        /* Iscatterv and Iallgatherv (MPI_Testall loop), then in place. */
        double *s = buf(tot), *r = buf(cnt(rank)), *rw = buf(cnt(rank));
        double *ag = buf(cnt(rank)), *agr = buf(tot), *agw = buf(tot);
        if (rank == 0) for (int q = 0; q < n; q++) fill(s, d[q], cnt(q), 5000 + q * 100);
        fill(rw, 0, cnt(rank), 5000 + rank * 100);
        fill(ag, 0, cnt(rank), rank * 100);
        for (int q = 0; q < n; q++) fill(agw, d[q], cnt(q), q * 100);
        MPI_Iscatterv(s, k, d, vec, r, cnt(rank), vec, 0, MPI_COMM_WORLD, &rq[0]);
        MPI_Iallgatherv(ag, cnt(rank), vec, agr, k, d, vec, MPI_COMM_WORLD, &rq[1]);
        do { MPI_Testall(2, rq, &flag, MPI_STATUSES_IGNORE); } while (!flag);
        same("iscatterv", r, rw, cnt(rank));
        same("iallgatherv", agr, agw, tot);
        /* In place: Igatherv and Iscatterv at the root, Iallgatherv. */
        double *g = buf(tot), *gw = buf(tot);
        if (rank == 0) {
            fill(g, d[0], cnt(0), 0);
            for (int q = 0; q < n; q++) fill(gw, d[q], cnt(q), q * 100);
            MPI_Igatherv(MPI_IN_PLACE, 0, vec, g, k, d, vec, 0, MPI_COMM_WORLD, &rq[0]);
        } else {
            MPI_Igatherv(ag, cnt(rank), vec, NULL, NULL, NULL, vec, 0, MPI_COMM_WORLD, &rq[0]);
        }
        wait1(&rq[0]);
        if (rank == 0) same("igatherv in place", g, gw, tot);
        double *sv = buf(tot), *svw = buf(tot), *sr = buf(cnt(rank));
        if (rank == 0) {
            for (int q = 0; q < n; q++) fill(sv, d[q], cnt(q), 5000 + q * 100);
            memcpy(svw, sv, sizeof(double) * tot * EXT);
            MPI_Iscatterv(sv, k, d, vec, MPI_IN_PLACE, 0, vec, 0, MPI_COMM_WORLD, &rq[0]);
        } else {
            MPI_Iscatterv(NULL, NULL, NULL, vec, sr, cnt(rank), vec, 0, MPI_COMM_WORLD, &rq[0]);
        }
        wait1(&rq[0]);
        if (rank == 0) same("iscatterv in place (root's buffer)", sv, svw, tot);
        else same("iscatterv in place (others)", sr, rw, cnt(rank));
        double *ip = buf(tot);
        fill(ip, d[rank], cnt(rank), rank * 100);
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ip, k, d, vec, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("iallgatherv in place", ip, agw, tot);
        free(s); free(r); free(rw); free(ag); free(agr); free(agw); free(g); free(gw);
        free(sv); free(svw); free(sr); free(ip);
    }
    {
        /* Ialltoallv in place, Ialltoallw, Ireduce_scatter_block. */
        int *rk = malloc(sizeof(int) * n), *rd = malloc(sizeof(int) * n);
        int *rdb = malloc(sizeof(int) * n);
        MPI_Datatype *ts = malloc(sizeof(MPI_Datatype) * n);
        /* In place, what rank r receives from q is what it sends to q:
         * symmetric counts a2a(r, q) == a2a(q, r). */
        for (int q = 0; q < n; q++) rk[q] = a2a(q, rank);
        int rtot = reversed(a2a_from, rank, rd);
        for (int q = 0; q < n; q++) { rdb[q] = rd[q] * EXT * 8; ts[q] = vec; }
        double *a = buf(rtot), *aw = buf(rtot);
        for (int q = 0; q < n; q++) {
            fill(a, rd[q], rk[q], rank * 1000 + q * 100);
            fill(aw, rd[q], rk[q], q * 1000 + rank * 100);
        }
        MPI_Ialltoallv(MPI_IN_PLACE, NULL, NULL, MPI_DATATYPE_NULL, a, rk, rd, vec, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("ialltoallv in place", a, aw, rtot);
        double *ws = buf(rtot), *wr = buf(rtot);
        for (int q = 0; q < n; q++) fill(ws, rd[q], rk[q], rank * 1000 + q * 100);
        MPI_Ialltoallw(ws, rk, rdb, ts, wr, rk, rdb, ts, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("ialltoallw", wr, aw, rtot);
        double *rs = buf(n * C), *rr = buf(C), *rw = buf(C);
        fill(rs, 0, n * C, rank);
        for (int i = 0; i < C * W; i++) *at(rw, 0, i) = n * (n - 1) / 2.0 + (double)n * (rank * C * W + i);
        MPI_Ireduce_scatter_block(rs, rr, C, vec, MPI_SUM, MPI_COMM_WORLD, &rq[0]);
        wait1(&rq[0]);
        same("ireduce_scatter_block", rr, rw, C);
        free(rk); free(rd); free(rdb); free(ts); free(a); free(aw); free(ws); free(wr);
        free(rs); free(rr); free(rw);
    }

    /* Scan and Exscan, blocking and nonblocking (MPI_SUM): rank r gives
     * r + i at datum i. Rank 0's Exscan buffer is left as it was. Then
     * MPI_Reduce_local, which writes only the data of its inout elements. */
    {
        double *s = buf(C), *want = buf(C), *exwant = buf(C);
        fill(s, 0, C, rank);
        for (int i = 0; i < C * W; i++) {
            *at(want, 0, i) = rank * (rank + 1) / 2.0 + (double)(rank + 1) * i;
            if (rank > 0) *at(exwant, 0, i) = rank * (rank - 1) / 2.0 + (double)rank * i;
        }
        for (int nb = 0; nb < 2; nb++) {
            double *r = buf(C), *e = buf(C);
            if (nb) {
                MPI_Iscan(s, r, C, vec, MPI_SUM, MPI_COMM_WORLD, &rq[0]);
                MPI_Iexscan(s, e, C, vec, MPI_SUM, MPI_COMM_WORLD, &rq[1]);
                MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
            } else {
                MPI_Scan(s, r, C, vec, MPI_SUM, MPI_COMM_WORLD);
                MPI_Exscan(s, e, C, vec, MPI_SUM, MPI_COMM_WORLD);
            }
            same(nb ? "iscan" : "scan", r, want, C);
            same(nb ? "iexscan" : "exscan", e, exwant, C);
            double *ip = copy(s, C);
            if (nb) {
                MPI_Iscan(MPI_IN_PLACE, ip, C, vec, MPI_SUM, MPI_COMM_WORLD, &rq[0]);
                wait1(&rq[0]);
            } else {
                MPI_Scan(MPI_IN_PLACE, ip, C, vec, MPI_SUM, MPI_COMM_WORLD);
            }
            same(nb ? "iscan in place" : "scan in place", ip, want, C);
            free(r); free(e); free(ip);
        }
        double *in = buf(C), *io = buf(C), *lw = buf(C);
        fill(in, 0, C, 10);
        fill(io, 0, C, 100);
        for (int i = 0; i < C * W; i++) *at(lw, 0, i) = 110.0 + 2 * i;
        CHECK(MPI_Reduce_local(in, io, C, vec, MPI_SUM) == MPI_SUCCESS, "reduce_local failed");
        same("reduce_local", io, lw, C);
        free(s); free(want); free(exwant); free(in); free(io); free(lw);
    }

    /* What stays unsupported is an error naming the call and the type: a
     * user operation on a non-contiguous type. Freeing an active request
     * that still has to unpack is refused (the request stays valid):
     * rank 1 starts its part of the Ibcast only after rank 0's
     * MPI_Request_free, so rank 0's cannot have completed. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    {
        char es[MPI_MAX_ERROR_STRING]; int len, cls;
        MPI_Op op;
        MPI_Op_create(noop, 1, &op);
        double *s = buf(C), *r = buf(C);
        int rc = MPI_Iallreduce(s, r, C, vec, op, MPI_COMM_WORLD, &rq[0]);
        MPI_Error_class(rc, &cls);
        MPI_Error_string(rc, es, &len);
        CHECK(cls == MPI_ERR_OP && strstr(es, "MPI_Iallreduce") && strstr(es, "not contiguous"), "user op: class %d: %s", cls, es);
        MPI_Op_free(&op);
        if (n >= 2) {
            double *b = buf(C), *want = buf(C);
            fill(want, 0, C, 77);
            if (rank == 1) fill(b, 0, C, 77);
            if (rank == 1) MPI_Recv(NULL, 0, MPI_BYTE, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Ibcast(b, C, vec, 1, MPI_COMM_WORLD, &rq[0]);
            if (rank == 0) {
                MPI_Request keep = rq[0];
                rc = MPI_Request_free(&rq[0]);
                MPI_Error_class(rc, &cls);
                MPI_Error_string(rc, es, &len);
                CHECK(cls == MPI_ERR_REQUEST && strstr(es, "MPI_Ibcast") && rq[0] == keep, "request_free: class %d: %s", cls, es);
                MPI_Send(NULL, 0, MPI_BYTE, 1, 5, MPI_COMM_WORLD);
            }
            wait1(&rq[0]);
            same("ibcast after a refused free", b, want, C);
            free(b); free(want);
        }
        free(s); free(r);
        /* The request of any nonblocking collective refuses MPI_Request_free
         * on every rank, however far it got, so no rank's outcome depends on
         * timing; it stays valid and completes. */
        MPI_Request keep;
        MPI_Ibarrier(MPI_COMM_WORLD, &rq[0]);
        keep = rq[0];
        rc = MPI_Request_free(&rq[0]);
        MPI_Error_class(rc, &cls);
        MPI_Error_string(rc, es, &len);
        CHECK(cls == MPI_ERR_REQUEST && strstr(es, "nonblocking collective") && rq[0] == keep, "request_free of an ibarrier: class %d: %s", cls, es);
        wait1(&rq[0]);
    }

    free(d); free(k);
    MPI_Type_free(&vec);
    int all_fails;
    MPI_Allreduce(&fails, &all_fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && all_fails == 0) printf("derived_coll: ok (%d ranks)\n", size);
    MPI_Finalize();
    return all_fails != 0;
}
