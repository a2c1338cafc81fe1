/* Content checks of ibcoll's MPI C interface: every call's result is
 * compared with what MPI specifies. Runs on any number of ranks; prints
 * "api: ok" on rank 0 when every check passed, exits non-zero otherwise. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

static int rank, size, fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__, __LINE__, #c); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

static void myprod(void *in, void *inout, int *len, MPI_Datatype *dt) {
    int *a = in, *b = inout;
    for (int i = 0; i < *len; i++) b[i] = a[i] * b[i];
    (void)dt;
}

/* Composition of affine maps x -> a*x + b (mod 2^32), a in the high and
 * b in the low half: associative, not commutative. inout = in o inout,
 * `in` being the lower ranks' partial result. */
static uint64_t compose(uint64_t l, uint64_t h) {
    uint32_t a1 = l >> 32, b1 = (uint32_t)l, a2 = h >> 32, b2 = (uint32_t)h;
    return (uint64_t)(uint32_t)(a1 * a2) << 32 | (uint32_t)(a2 * b1 + b2);
}
static void affine(void *in, void *inout, int *len, MPI_Datatype *dt) {
    uint64_t *a = in, *b = inout;
    for (int i = 0; i < *len; i++) b[i] = compose(a[i], b[i]);
    (void)dt;
}
static uint64_t amap(int q, int i) { return (uint64_t)(2 * q + 3 + 2 * (i % 7)) << 32 | (uint32_t)(q * q + 5 + i); }
static uint64_t aupto(int k, int i) { uint64_t v = amap(0, i); for (int q = 1; q < k; q++) v = compose(v, amap(q, i)); return v; }

int main(int argc, char **argv) {
    int provided, flag;
    MPI_Initialized(&flag);
    CHECK(!flag, "initialized before init");
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    CHECK(provided == MPI_THREAD_FUNNELED, "provided %d", provided);
    MPI_Initialized(&flag);
    CHECK(flag, "not initialized");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;

    /* Point to point: halo exchange with Isend/Irecv/Waitall. */
    double halo_out[2] = {rank, rank + 0.5}, halo_in[4] = {-1, -1, -1, -1};
    MPI_Request rq[4];
    MPI_Status sts[4];
    MPI_Irecv(&halo_in[0], 2, MPI_DOUBLE, left, 11, MPI_COMM_WORLD, &rq[0]);
    MPI_Irecv(&halo_in[2], 2, MPI_DOUBLE, right, 12, MPI_COMM_WORLD, &rq[1]);
    MPI_Isend(halo_out, 2, MPI_DOUBLE, right, 11, MPI_COMM_WORLD, &rq[2]);
    MPI_Isend(halo_out, 2, MPI_DOUBLE, left, 12, MPI_COMM_WORLD, &rq[3]);
    MPI_Waitall(4, rq, sts);
    CHECK(halo_in[0] == left && halo_in[1] == left + 0.5, "halo from left %g", halo_in[0]);
    CHECK(halo_in[2] == right && halo_in[3] == right + 0.5, "halo from right %g", halo_in[2]);
    CHECK(sts[0].MPI_SOURCE == left && sts[0].MPI_TAG == 11, "status %d %d", sts[0].MPI_SOURCE, sts[0].MPI_TAG);
    CHECK(rq[0] == MPI_REQUEST_NULL, "request not nulled");

    /* Persistent requests: one halo exchange set up once, run three times. */
    {
        int pout = 0, pin = -1, it;
        MPI_Request pr[2];
        MPI_Recv_init(&pin, 1, MPI_INT, left, 13, MPI_COMM_WORLD, &pr[0]);
        MPI_Send_init(&pout, 1, MPI_INT, right, 13, MPI_COMM_WORLD, &pr[1]);
        for (it = 0; it < 3; it++) {
            pout = rank * 10 + it;
            MPI_Startall(2, pr);
            MPI_Waitall(2, pr, sts);
            CHECK(pin == left * 10 + it && sts[0].MPI_SOURCE == left, "persistent round %d got %d", it, pin);
            CHECK(pr[0] != MPI_REQUEST_NULL, "persistent request kept");
        }
        MPI_Status pst; MPI_Wait(&pr[0], &pst); /* inactive: returns at once */
        CHECK(pst.MPI_SOURCE == MPI_ANY_SOURCE, "inactive wait status %d", pst.MPI_SOURCE);
        MPI_Request_free(&pr[0]);
        MPI_Request_free(&pr[1]);
        CHECK(pr[0] == MPI_REQUEST_NULL && pr[1] == MPI_REQUEST_NULL, "persistent freed");
    }

    /* ANY_SOURCE receives that read the status; Get_count. */
    if (rank == 0) {
        int seen = 0;
        for (int i = 1; i < size; i++) {
            int buf[8]; MPI_Status st; int n;
            MPI_Recv(buf, 8, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            MPI_Get_count(&st, MPI_INT, &n);
            CHECK(n == (st.MPI_SOURCE < 8 ? st.MPI_SOURCE : 8) && st.MPI_TAG == 100 + st.MPI_SOURCE, "count %d src %d tag %d", n, st.MPI_SOURCE, st.MPI_TAG);
            for (int k = 0; k < n && k < 8; k++) CHECK(buf[k] == st.MPI_SOURCE * 10 + k, "payload");
            seen |= 1 << st.MPI_SOURCE;
        }
        CHECK(size > 31 || seen == ((1 << size) - 2), "sources %x", seen);
    } else {
        int buf[8];
        for (int k = 0; k < rank && k < 8; k++) buf[k] = rank * 10 + k;
        MPI_Send(buf, rank < 8 ? rank : 8, MPI_INT, 0, 100 + rank, MPI_COMM_WORLD);
    }
    /* Nothing else may meet rank 0's wildcard receives. */
    MPI_Barrier(MPI_COMM_WORLD);

    /* Sendrecv around the ring; PROC_NULL. */
    long a = rank, b = -1;
    MPI_Status st;
    MPI_Sendrecv(&a, 1, MPI_LONG, right, 3, &b, 1, MPI_LONG, left, 3, MPI_COMM_WORLD, &st);
    CHECK(b == left && st.MPI_SOURCE == left, "sendrecv %ld", b);
    MPI_Recv(&b, 1, MPI_LONG, MPI_PROC_NULL, 0, MPI_COMM_WORLD, &st);
    CHECK(st.MPI_SOURCE == MPI_PROC_NULL && st.MPI_TAG == MPI_ANY_TAG, "proc_null status");
    MPI_Send(&a, 1, MPI_LONG, MPI_PROC_NULL, 0, MPI_COMM_WORLD);

    /* Probe, Iprobe, Ssend/Rsend, Test loop, Waitany/Waitsome. */
    if (size > 1) {
        if (rank == 0) {
            short v[5] = {1, 2, 3, 4, 5};
            MPI_Ssend(v, 5, MPI_SHORT, 1, 9, MPI_COMM_WORLD);
            MPI_Rsend(v, 3, MPI_SHORT, 1, 10, MPI_COMM_WORLD);
        } else if (rank == 1) {
            MPI_Probe(0, 9, MPI_COMM_WORLD, &st);
            int n; MPI_Get_count(&st, MPI_SHORT, &n);
            CHECK(n == 5 && st.MPI_SOURCE == 0, "probe count %d", n);
            short v[5]; MPI_Recv(v, 5, MPI_SHORT, 0, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(v[4] == 5, "ssend payload");
            do { MPI_Iprobe(0, 10, MPI_COMM_WORLD, &flag, &st); } while (!flag);
            MPI_Request r; MPI_Irecv(v, 5, MPI_SHORT, 0, 10, MPI_COMM_WORLD, &r);
            do { MPI_Test(&r, &flag, &st); } while (!flag);
            MPI_Get_count(&st, MPI_SHORT, &n);
            CHECK(n == 3 && v[2] == 3, "rsend count %d", n);
        }
        int x[3] = {0, 0, 0}, y[3] = {rank, rank, rank};
        MPI_Request r3[3];
        for (int i = 0; i < 3; i++) MPI_Irecv(&x[i], 1, MPI_INT, left, 20 + i, MPI_COMM_WORLD, &r3[i]);
        for (int i = 2; i >= 0; i--) MPI_Send(&y[i], 1, MPI_INT, right, 20 + i, MPI_COMM_WORLD);
        int idx, done = 0, outc, ids[3];
        MPI_Waitany(3, r3, &idx, &st);
        CHECK(idx >= 0 && idx < 3 && st.MPI_TAG == 20 + idx, "waitany %d", idx);
        done++;
        while (done < 3) { MPI_Waitsome(3, r3, &outc, ids, MPI_STATUSES_IGNORE); CHECK(outc != MPI_UNDEFINED, "waitsome"); done += outc; }
        MPI_Waitany(3, r3, &idx, &st);
        CHECK(idx == MPI_UNDEFINED, "waitany of nothing %d", idx);
        CHECK(x[0] == left && x[1] == left && x[2] == left, "waitsome payload");
    }

    /* Synchronous sends complete only once their receive is matched: rank
       0's MPI_Issend (and a started MPI_Ssend_init) stays incomplete through
       many MPI_Test calls because rank 1 posts the receive only after rank
       0's go message, sent after the tests; no timing is involved. Empty,
       small and rendezvous-sized messages. */
    if (size > 1) {
        int counts[3] = {2, 0, 40000};
        for (int k = 0; k < 3; k++) {
            int n = counts[k], go = 1;
            int *sb = malloc((n + 1) * sizeof(int));
            for (int i = 0; i < n; i++) sb[i] = i * 7 + k;
            for (int persistent = 0; persistent < 2; persistent++) {
                int tag = 30 + 10 * persistent + k;
                if (rank == 0) {
                    MPI_Request r;
                    if (persistent) { MPI_Ssend_init(sb, n, MPI_INT, 1, tag, MPI_COMM_WORLD, &r); MPI_Start(&r); }
                    else MPI_Issend(sb, n, MPI_INT, 1, tag, MPI_COMM_WORLD, &r);
                    int early = 0;
                    for (int i = 0; i < 1000 && !early; i++) { MPI_Test(&r, &early, MPI_STATUS_IGNORE); }
                    CHECK(!early, "%s of %d ints completed before its receive was posted",
                          persistent ? "Ssend_init" : "Issend", n);
                    MPI_Send(&go, 1, MPI_INT, 1, tag + 100, MPI_COMM_WORLD);
                    MPI_Wait(&r, MPI_STATUS_IGNORE);
                    if (persistent) MPI_Request_free(&r);
                } else if (rank == 1) {
                    int *rb = malloc((n + 1) * sizeof(int)), c;
                    MPI_Recv(&go, 1, MPI_INT, 0, tag + 100, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Recv(rb, n, MPI_INT, 0, tag, MPI_COMM_WORLD, &st);
                    MPI_Get_count(&st, MPI_INT, &c);
                    CHECK(c == n && memcmp(rb, sb, n * sizeof(int)) == 0, "ssend payload of %d ints (got %d)", n, c);
                    free(rb);
                }
            }
            /* Blocking: rank 1 sends a note just before posting its receive;
               the note travels ahead of rank 1's answer to the synchronous
               send, so it is there when MPI_Ssend returns. */
            if (rank == 0) {
                MPI_Send(&go, 1, MPI_INT, 1, 70, MPI_COMM_WORLD);
                MPI_Ssend(sb, n, MPI_INT, 1, 71, MPI_COMM_WORLD);
                int there = 0;
                MPI_Iprobe(1, 72, MPI_COMM_WORLD, &there, MPI_STATUS_IGNORE);
                CHECK(there, "MPI_Ssend of %d ints returned before the receive was posted", n);
                MPI_Recv(&go, 1, MPI_INT, 1, 72, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (rank == 1) {
                int *rb = malloc((n + 1) * sizeof(int));
                MPI_Recv(&go, 1, MPI_INT, 0, 70, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(&go, 1, MPI_INT, 0, 72, MPI_COMM_WORLD);
                MPI_Recv(rb, n, MPI_INT, 0, 71, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                CHECK(memcmp(rb, sb, n * sizeof(int)) == 0, "blocking ssend payload");
                free(rb);
            }
            free(sb);
        }
    }

    /* Collectives on non-contiguous derived types (packed and unpacked
       around the contiguous collectives): the selected elements arrive, the
       gaps stay untouched. */
    {
        MPI_Datatype col, pair, rec;
        MPI_Type_vector(3, 1, 4, MPI_DOUBLE, &col);   /* a column of a 3x4 matrix */
        MPI_Type_commit(&col);
        MPI_Type_vector(2, 1, 2, MPI_INT, &pair);     /* ints 0 and 2 of 3 */
        MPI_Type_commit(&pair);
        struct rec_t { int a; double b; } recs[3];
        int bl[2] = {1, 1}; MPI_Aint dp[2] = {offsetof(struct rec_t, a), offsetof(struct rec_t, b)};
        MPI_Datatype tys[2] = {MPI_INT, MPI_DOUBLE}, rec0;
        MPI_Type_create_struct(2, bl, dp, tys, &rec0);
        MPI_Type_create_resized(rec0, 0, sizeof(struct rec_t), &rec);
        MPI_Type_commit(&rec);
        double m[12], r[12];
        for (int i = 0; i < 12; i++) m[i] = r[i] = -1;
        if (rank == 0) for (int i = 0; i < 3; i++) m[i * 4] = 100 + i;
        MPI_Bcast(m, 1, col, 0, MPI_COMM_WORLD);
        for (int i = 0; i < 12; i++)
            CHECK(m[i] == (i % 4 ? -1 : 100 + i / 4), "vector bcast m[%d] = %g", i, m[i]);
        for (int i = 0; i < 3; i++) m[i * 4] = rank + i;
        MPI_Allreduce(m, r, 1, col, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < 12; i++)
            CHECK(r[i] == (i % 4 ? -1 : size * (size - 1) / 2 + size * (i / 4)), "vector allreduce r[%d] = %g", i, r[i]);
        MPI_Allreduce(MPI_IN_PLACE, m, 1, col, MPI_MAX, MPI_COMM_WORLD);
        CHECK(m[8] == size - 1 + 2 && m[1] == -1, "vector allreduce in place %g", m[8]);
        for (int i = 0; i < 12; i++) r[i] = -1;
        for (int i = 0; i < 3; i++) m[i * 4] = rank * 10 + i;
        MPI_Reduce(m, r, 1, col, MPI_MIN, size - 1, MPI_COMM_WORLD);
        if (rank == size - 1) CHECK(r[0] == 0 && r[4] == 1 && r[8] == 2 && r[2] == -1, "vector reduce %g %g", r[4], r[2]);
        /* Alltoall packing the send side, allgather unpacking the receive side. */
        int *s3 = malloc(3 * size * sizeof(int)), *r2 = malloc(2 * size * sizeof(int));
        for (int j = 0; j < size; j++) { s3[3 * j] = rank * 100 + j; s3[3 * j + 1] = -1; s3[3 * j + 2] = rank * 100 + j + 50; }
        MPI_Datatype pair3; MPI_Type_create_resized(pair, 0, 3 * sizeof(int), &pair3); MPI_Type_commit(&pair3);
        MPI_Alltoall(s3, 1, pair3, r2, 2, MPI_INT, MPI_COMM_WORLD);
        for (int j = 0; j < size; j++)
            CHECK(r2[2 * j] == j * 100 + rank && r2[2 * j + 1] == j * 100 + rank + 50, "alltoall from a vector type, block %d", j);
        int two[2] = {rank, rank + 50};
        for (int j = 0; j < 3 * size; j++) s3[j] = -1;
        MPI_Allgather(two, 2, MPI_INT, s3, 1, pair3, MPI_COMM_WORLD);
        for (int j = 0; j < size; j++)
            CHECK(s3[3 * j] == j && s3[3 * j + 1] == -1 && s3[3 * j + 2] == j + 50, "allgather into a vector type, block %d", j);
        /* Gather into and scatter from a vector type at the root. */
        for (int j = 0; j < 3 * size; j++) s3[j] = -1;
        MPI_Gather(two, 2, MPI_INT, s3, 1, pair3, 0, MPI_COMM_WORLD);
        if (rank == 0)
            for (int j = 0; j < size; j++)
                CHECK(s3[3 * j] == j && s3[3 * j + 1] == -1 && s3[3 * j + 2] == j + 50, "gather into a vector type, block %d", j);
        if (rank == 0) for (int j = 0; j < size; j++) { s3[3 * j] = 7 * j; s3[3 * j + 2] = 7 * j + 1; }
        two[0] = two[1] = -5;
        MPI_Scatter(s3, 1, pair3, two, 2, MPI_INT, 0, MPI_COMM_WORLD);
        CHECK(two[0] == 7 * rank && two[1] == 7 * rank + 1, "scatter from a vector type %d %d", two[0], two[1]);
        /* A struct with padding, broadcast. */
        memset(recs, 0, sizeof recs);
        if (rank == 0) for (int i = 0; i < 3; i++) { recs[i].a = i + 1; recs[i].b = 0.5 * i; }
        MPI_Bcast(recs, 3, rec, 0, MPI_COMM_WORLD);
        CHECK(recs[2].a == 3 && recs[2].b == 1.0 && recs[1].a == 2, "struct bcast %d %g", recs[2].a, recs[2].b);
        free(s3); free(r2);
        MPI_Type_free(&pair3); MPI_Type_free(&rec0); MPI_Type_free(&rec); MPI_Type_free(&pair); MPI_Type_free(&col);
    }

    /* Cancel a receive nobody sends to. */
    {
        int z; MPI_Request r;
        MPI_Irecv(&z, 1, MPI_INT, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &r);
        MPI_Cancel(&r);
        MPI_Wait(&r, &st);
        MPI_Test_cancelled(&st, &flag);
        CHECK(flag, "cancelled");
    }

    /* Collectives with content checks. */
    int one = rank + 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum == size * (size + 1) / 2, "allreduce %d", sum);
    double dv = rank; MPI_Allreduce(MPI_IN_PLACE, &dv, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    CHECK(dv == size - 1, "in-place max %g", dv);
    struct { double v; int i; } mi = {(rank % 2) ? -1.0 * rank : rank, rank}, mo, ma;
    MPI_Allreduce(&mi, &mo, 1, MPI_DOUBLE_INT, MPI_MINLOC, MPI_COMM_WORLD);
    MPI_Allreduce(&mi, &ma, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    {
        double mn = 1e9, mx = -1e9; int mni = -1, mxi = -1;
        for (int r = 0; r < size; r++) { double v = (r % 2) ? -1.0 * r : r; if (v < mn) { mn = v; mni = r; } if (v > mx) { mx = v; mxi = r; } }
        CHECK(mo.v == mn && mo.i == mni, "minloc %g@%d", mo.v, mo.i);
        CHECK(ma.v == mx && ma.i == mxi, "maxloc %g@%d", ma.v, ma.i);
    }
    int ii[2] = {rank % 2, rank}, io[2];
    MPI_Reduce(ii, io, 1, MPI_2INT, MPI_MAXLOC, 0, MPI_COMM_WORLD);
    if (rank == 0) CHECK(io[0] == (size > 1) && io[1] == (size > 1 ? 1 : 0), "2int maxloc %d %d", io[0], io[1]);
    long long tot = rank; MPI_Reduce(rank == 0 ? MPI_IN_PLACE : &tot, &tot, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) CHECK(tot == (long long)size * (size - 1) / 2, "reduce in place %lld", tot);
    int band = 0xff ^ (1 << rank % 8), bo; MPI_Allreduce(&band, &bo, 1, MPI_INT, MPI_BAND, MPI_COMM_WORLD);
    int lx = 1, lxo; MPI_Allreduce(&lx, &lxo, 1, MPI_INT, MPI_LXOR, MPI_COMM_WORLD);
    CHECK(lxo == (size % 2), "lxor %d", lxo);
    uint64_t sc = rank + 1, so; MPI_Scan(&sc, &so, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(so == (uint64_t)(rank + 1) * (rank + 2) / 2, "scan %lu", (unsigned long)so);
    int ex = rank + 1, exo = -7; MPI_Exscan(&ex, &exo, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank > 0) CHECK(exo == rank * (rank + 1) / 2, "exscan %d", exo);
    MPI_Op prod; MPI_Op_create(myprod, 1, &prod);
    int pv = 2, po; MPI_Allreduce(&pv, &po, 1, MPI_INT, prod, MPI_COMM_WORLD);
    CHECK(po == (1 << size), "user op %d", po);
    MPI_Op_free(&prod);
    CHECK(prod == MPI_OP_NULL, "op freed");
    {
        /* A non-commutative operation (commute = 0), large enough that
         * the default algorithms would be ring-like: combined in rank
         * order by reduce (to the last rank), allreduce, reduce_scatter_block
         * and scan. */
        enum { AN = 20000 };
        MPI_Op aff; MPI_Op_create(affine, 0, &aff);
        int c = 0; MPI_Op_commutative(aff, &c);
        CHECK(c == 0, "MPI_Op_commutative %d", c);
        uint64_t *as = malloc(8 * AN * size), *ar = malloc(8 * AN * size);
        for (int i = 0; i < AN * size; i++) as[i] = amap(rank, i % AN);
        int bad = 0;
        MPI_Reduce(as, ar, AN, MPI_UINT64_T, aff, size - 1, MPI_COMM_WORLD);
        if (rank == size - 1) for (int i = 0; i < AN; i++) bad += ar[i] != aupto(size, i);
        CHECK(bad == 0, "non-commutative reduce: %d wrong", bad);
        bad = 0;
        MPI_Allreduce(as, ar, AN, MPI_UINT64_T, aff, MPI_COMM_WORLD);
        for (int i = 0; i < AN; i++) bad += ar[i] != aupto(size, i);
        CHECK(bad == 0, "non-commutative allreduce: %d wrong", bad);
        bad = 0;
        MPI_Reduce_scatter_block(as, ar, AN, MPI_UINT64_T, aff, MPI_COMM_WORLD);
        for (int i = 0; i < AN; i++) bad += ar[i] != aupto(size, i);
        CHECK(bad == 0, "non-commutative reduce_scatter_block: %d wrong", bad);
        bad = 0;
        MPI_Scan(as, ar, AN, MPI_UINT64_T, aff, MPI_COMM_WORLD);
        for (int i = 0; i < AN; i++) bad += ar[i] != aupto(rank + 1, i);
        CHECK(bad == 0, "non-commutative scan: %d wrong", bad);
        free(as); free(ar);
        MPI_Op_free(&aff);
    }

    char msg[16] = {0}; if (rank == size - 1) strcpy(msg, "broadcast!");
    MPI_Bcast(msg, 16, MPI_CHAR, size - 1, MPI_COMM_WORLD);
    CHECK(strcmp(msg, "broadcast!") == 0, "bcast '%s'", msg);
    int *all = malloc(sizeof(int) * 2 * size), mine2[2] = {rank, -rank};
    MPI_Allgather(mine2, 2, MPI_INT, all, 2, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) CHECK(all[2 * r] == r && all[2 * r + 1] == -r, "allgather");
    int *g = malloc(sizeof(int) * size);
    MPI_Gather(&rank, 1, MPI_INT, g, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0) for (int r = 0; r < size; r++) CHECK(g[r] == r, "gather");
    int got; for (int r = 0; r < size; r++) g[r] = 100 + r;
    MPI_Scatter(g, 1, MPI_INT, &got, 1, MPI_INT, 0, MPI_COMM_WORLD);
    CHECK(got == 100 + rank, "scatter %d", got);
    int *sa = malloc(sizeof(int) * size), *ra = malloc(sizeof(int) * size);
    for (int r = 0; r < size; r++) sa[r] = rank * 1000 + r;
    MPI_Alltoall(sa, 1, MPI_INT, ra, 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) CHECK(ra[r] == r * 1000 + rank, "alltoall");
    int *cnt = malloc(sizeof(int) * size), *dis = malloc(sizeof(int) * size), totc = 0;
    for (int r = 0; r < size; r++) { cnt[r] = r + 1; dis[r] = totc; totc += r + 1; }
    int *vb = malloc(sizeof(int) * totc), *mv = malloc(sizeof(int) * (rank + 1));
    for (int k = 0; k <= rank; k++) mv[k] = rank;
    MPI_Allgatherv(mv, rank + 1, MPI_INT, vb, cnt, dis, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) for (int k = 0; k <= r; k++) CHECK(vb[dis[r] + k] == r, "allgatherv");
    int *rsc = malloc(sizeof(int) * size), rso = 0;
    for (int r = 0; r < size; r++) { rsc[r] = 1; sa[r] = r; }
    MPI_Reduce_scatter(sa, &rso, rsc, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(rso == rank * size, "reduce_scatter %d", rso);
    MPI_Barrier(MPI_COMM_WORLD);

    /* Nonblocking collectives. */
    {
        MPI_Request r[3]; int s1 = rank, s2 = 0, b1 = (rank == 0) ? 42 : 0;
        MPI_Iallreduce(&s1, &s2, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r[0]);
        MPI_Ibcast(&b1, 1, MPI_INT, 0, MPI_COMM_WORLD, &r[1]);
        MPI_Ibarrier(MPI_COMM_WORLD, &r[2]);
        MPI_Waitall(3, r, MPI_STATUSES_IGNORE);
        CHECK(s2 == size * (size - 1) / 2 && b1 == 42, "iallreduce %d ibcast %d", s2, b1);
        MPI_Request q; int *ia = malloc(sizeof(int) * size);
        MPI_Ialltoall(sa, 1, MPI_INT, ia, 1, MPI_INT, MPI_COMM_WORLD, &q);
        do { MPI_Test(&q, &flag, MPI_STATUS_IGNORE); } while (!flag);
        for (int k = 0; k < size; k++) CHECK(ia[k] == rank, "ialltoall");
        free(ia);
    }

    /* Communicators and groups. */
    MPI_Comm half, dup;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
    int hr, hs; MPI_Comm_rank(half, &hr); MPI_Comm_size(half, &hs);
    CHECK(hs == (size + 1 - rank % 2) / 2, "split size %d", hs);
    int hsum; MPI_Allreduce(&rank, &hsum, 1, MPI_INT, MPI_SUM, half);
    int expect = 0; for (int r = rank % 2; r < size; r += 2) expect += r;
    CHECK(hsum == expect, "split allreduce %d", hsum);
    CHECK(hr == hs - 1 - rank / 2, "split ordered by key: %d", hr);
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    int cmp; MPI_Comm_compare(MPI_COMM_WORLD, dup, &cmp);
    CHECK(cmp == MPI_CONGRUENT, "compare dup %d", cmp);
    MPI_Comm_compare(dup, dup, &cmp);
    CHECK(cmp == MPI_IDENT, "compare self %d", cmp);
    MPI_Group wg, eg; MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int *evens = malloc(sizeof(int) * size), ne = 0;
    for (int r = 0; r < size; r += 2) evens[ne++] = r;
    MPI_Group_incl(wg, ne, evens, &eg);
    int tr[1] = {0}, to[1]; MPI_Group_translate_ranks(eg, 1, tr, wg, to);
    CHECK(to[0] == 0, "translate %d", to[0]);
    MPI_Comm ec; MPI_Comm_create(MPI_COMM_WORLD, eg, &ec);
    if (rank % 2 == 0) {
        int er; MPI_Comm_rank(ec, &er); CHECK(er == rank / 2, "comm_create rank %d", er);
        MPI_Comm_free(&ec);
    } else CHECK(ec == MPI_COMM_NULL, "not in group");
    MPI_Group_free(&eg); MPI_Group_free(&wg);
    MPI_Comm split_undef; MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 1, 0, &split_undef);
    CHECK((rank == 0) == (split_undef == MPI_COMM_NULL), "undefined color");
    if (split_undef != MPI_COMM_NULL) MPI_Comm_free(&split_undef);
    MPI_Comm_free(&half); MPI_Comm_free(&dup);
    CHECK(half == MPI_COMM_NULL, "freed");
    int sr; MPI_Comm_size(MPI_COMM_SELF, &sr); CHECK(sr == 1, "self size");
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_SELF); CHECK(sum == one, "self allreduce");

    /* Derived types: contiguous and vector (a matrix column). */
    MPI_Datatype c3, col;
    MPI_Type_contiguous(3, MPI_FLOAT, &c3); MPI_Type_commit(&c3);
    int tsz; MPI_Aint lb, ext; MPI_Type_size(c3, &tsz); MPI_Type_get_extent(c3, &lb, &ext);
    CHECK(tsz == 12 && ext == 12 && lb == 0, "contig size %d extent %ld", tsz, (long)ext);
    float f3[6] = {0}, fo[6] = {rank, 1, 2, 3, 4, 5};
    MPI_Sendrecv(fo, 2, c3, right, 5, f3, 2, c3, left, 5, MPI_COMM_WORLD, &st);
    int n3; MPI_Get_count(&st, c3, &n3);
    CHECK(f3[0] == left && f3[5] == 5 && n3 == 2, "contig sendrecv %g %d", f3[0], n3);
    float fs[3] = {rank, 1, 2}, fr[3];
    MPI_Allreduce(fs, fr, 1, c3, MPI_SUM, MPI_COMM_WORLD);
    CHECK(fr[0] == size * (size - 1) / 2 && fr[1] == size && fr[2] == 2 * size, "contig allreduce %g", fr[1]);
    MPI_Type_vector(4, 1, 4, MPI_DOUBLE, &col); MPI_Type_commit(&col);
    MPI_Type_size(col, &tsz); MPI_Type_get_extent(col, &lb, &ext);
    CHECK(tsz == 32 && ext == 13 * 8, "vector size %d extent %ld", tsz, (long)ext);
    double m[16], mc[16];
    for (int k = 0; k < 16; k++) { m[k] = rank * 100 + k; mc[k] = -1; }
    MPI_Request vr; MPI_Irecv(&mc[1], 1, col, left, 6, MPI_COMM_WORLD, &vr);
    MPI_Send(&m[2], 1, col, right, 6, MPI_COMM_WORLD);
    MPI_Wait(&vr, &st);
    for (int k = 0; k < 16; k++) CHECK(mc[k] == ((k % 4 == 1) ? left * 100 + k + 1 : -1), "vector column %d: %g", k, mc[k]);
    MPI_Type_free(&c3); MPI_Type_free(&col);
    CHECK(c3 == MPI_DATATYPE_NULL, "type freed");
    MPI_Type_size(MPI_DOUBLE_INT, &tsz); CHECK(tsz == 12, "double_int size %d", tsz);

    /* Errors: MPI_ERRORS_RETURN gives classes and messages. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int cls, rc, len; char es[MPI_MAX_ERROR_STRING];
    rc = MPI_Send(&a, 1, MPI_LONG, size, 0, MPI_COMM_WORLD); MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_RANK, "bad rank class %d", cls);
    MPI_Error_string(rc, es, &len);
    CHECK(strstr(es, "MPI_Send") && strstr(es, "rank"), "message '%s'", es);
    rc = MPI_Send(&a, -1, MPI_LONG, 0, 0, MPI_COMM_WORLD); MPI_Error_class(rc, &cls); CHECK(cls == MPI_ERR_COUNT, "count %d", cls);
    rc = MPI_Send(&a, 1, MPI_LONG, 0, -5, MPI_COMM_WORLD); MPI_Error_class(rc, &cls); CHECK(cls == MPI_ERR_TAG, "tag %d", cls);
    rc = MPI_Send(NULL, 3, MPI_LONG, 0, 0, MPI_COMM_WORLD); MPI_Error_class(rc, &cls); CHECK(cls == MPI_ERR_BUFFER, "buffer %d", cls);
    rc = MPI_Send(&a, 1, (MPI_Datatype)0x1234, 0, 0, MPI_COMM_WORLD); MPI_Error_class(rc, &cls); CHECK(cls == MPI_ERR_TYPE, "type %d", cls);
    rc = MPI_Send(&a, 1, MPI_LONG, 0, 0, (MPI_Comm)0x777); MPI_Error_class(rc, &cls); CHECK(cls == MPI_ERR_COMM, "comm %d", cls);
    rc = MPI_Bcast(&a, 1, MPI_LONG, size + 3, MPI_COMM_WORLD); MPI_Error_class(rc, &cls); CHECK(cls == MPI_ERR_ROOT, "root %d", cls);
    rc = MPI_Allreduce(&dv, &dv, 1, MPI_DOUBLE, MPI_BAND, MPI_COMM_WORLD); MPI_Error_class(rc, &cls); CHECK(cls == MPI_ERR_OP, "op %d", cls);
    rc = MPI_Win_free(NULL); MPI_Error_class(rc, &cls); CHECK(cls == MPI_ERR_UNSUPPORTED_OPERATION, "unsupported %d", cls);
    if (size > 1) {
        char big[64] = {0}, small[8];
        if (rank == 0) MPI_Send(big, 64, MPI_CHAR, 1, 77, MPI_COMM_WORLD);
        if (rank == 1) {
            rc = MPI_Recv(small, 8, MPI_CHAR, 0, 77, MPI_COMM_WORLD, &st); MPI_Error_class(rc, &cls);
            CHECK(cls == MPI_ERR_TRUNCATE && st.MPI_SOURCE == 0 && st.MPI_TAG == 77, "truncate %d", cls);
        }
    }
    /* The blocking calls' fast paths leave anything unusual to the full
     * checks: every bad argument is still its class, named by function. */
#define ERR(call, want, fn) do { rc = (call); MPI_Error_class(rc, &cls); es[0] = 0; MPI_Error_string(rc, es, &len); \
        CHECK(cls == (want) && strstr(es, fn) && strstr(es, "rank"), "%s: class %d, message '%s'", #call, cls, es); } while (0)
    {
        MPI_Comm bad = (MPI_Comm)0x777;
        double dw = 0; int ti[16] = {0}, to[16];
        ERR(MPI_Send(&a, 1, MPI_LONG, -7, 0, MPI_COMM_WORLD), MPI_ERR_RANK, "MPI_Send");
        ERR(MPI_Rsend(&a, 1, MPI_LONG, size, 0, MPI_COMM_WORLD), MPI_ERR_RANK, "MPI_Rsend");
        ERR(MPI_Bsend(&a, 1, MPI_LONG, 0, -2, MPI_COMM_WORLD), MPI_ERR_TAG, "MPI_Bsend");
        ERR(MPI_Recv(&b, 1, MPI_LONG, size, 0, MPI_COMM_WORLD, &st), MPI_ERR_RANK, "MPI_Recv");
        ERR(MPI_Recv(&b, 1, MPI_LONG, -7, 0, MPI_COMM_WORLD, &st), MPI_ERR_RANK, "MPI_Recv");
        ERR(MPI_Recv(&b, 1, MPI_LONG, 0, -5, MPI_COMM_WORLD, &st), MPI_ERR_TAG, "MPI_Recv");
        ERR(MPI_Recv(&b, -1, MPI_LONG, 0, 0, MPI_COMM_WORLD, &st), MPI_ERR_COUNT, "MPI_Recv");
        ERR(MPI_Recv(NULL, 2, MPI_LONG, 0, 0, MPI_COMM_WORLD, &st), MPI_ERR_BUFFER, "MPI_Recv");
        ERR(MPI_Recv(&b, 1, (MPI_Datatype)0x1234, 0, 0, MPI_COMM_WORLD, &st), MPI_ERR_TYPE, "MPI_Recv");
        ERR(MPI_Recv(&b, 1, MPI_LONG, 0, 0, bad, &st), MPI_ERR_COMM, "MPI_Recv");
        ERR(MPI_Recv(&b, 1, MPI_LONG, 0, 0, MPI_COMM_NULL, &st), MPI_ERR_COMM, "MPI_Recv");
        ERR(MPI_Bcast(&a, 1, MPI_LONG, -1, MPI_COMM_WORLD), MPI_ERR_ROOT, "MPI_Bcast");
        ERR(MPI_Bcast(NULL, 1, MPI_LONG, 0, MPI_COMM_WORLD), MPI_ERR_BUFFER, "MPI_Bcast");
        ERR(MPI_Bcast(&a, -1, MPI_LONG, 0, MPI_COMM_WORLD), MPI_ERR_COUNT, "MPI_Bcast");
        ERR(MPI_Bcast(&a, 1, MPI_DATATYPE_NULL, 0, MPI_COMM_WORLD), MPI_ERR_TYPE, "MPI_Bcast");
        ERR(MPI_Bcast(&a, 1, MPI_LONG, 0, bad), MPI_ERR_COMM, "MPI_Bcast");
        ERR(MPI_Allreduce(&dv, NULL, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), MPI_ERR_BUFFER, "MPI_Allreduce");
        ERR(MPI_Allreduce(NULL, &dw, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), MPI_ERR_BUFFER, "MPI_Allreduce");
        ERR(MPI_Allreduce(&dv, &dw, -1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), MPI_ERR_COUNT, "MPI_Allreduce");
        ERR(MPI_Allreduce(&dv, &dw, 1, MPI_DOUBLE, (MPI_Op)0x1234, MPI_COMM_WORLD), MPI_ERR_OP, "MPI_Allreduce");
        ERR(MPI_Allreduce(&dv, &dw, 1, MPI_DOUBLE, MPI_OP_NULL, MPI_COMM_WORLD), MPI_ERR_OP, "MPI_Allreduce");
        ERR(MPI_Allreduce(&dv, &dw, 1, (MPI_Datatype)0x1234, MPI_SUM, MPI_COMM_WORLD), MPI_ERR_TYPE, "MPI_Allreduce");
        ERR(MPI_Allreduce(&dv, &dw, 1, MPI_DOUBLE, MPI_SUM, bad), MPI_ERR_COMM, "MPI_Allreduce");
        ERR(MPI_Alltoall(ti, 1, MPI_INT, to, 2, MPI_INT, MPI_COMM_WORLD), MPI_ERR_TRUNCATE, "MPI_Alltoall");
        ERR(MPI_Alltoall(NULL, 1, MPI_INT, to, 1, MPI_INT, MPI_COMM_WORLD), MPI_ERR_BUFFER, "MPI_Alltoall");
        ERR(MPI_Alltoall(ti, -1, MPI_INT, to, 1, MPI_INT, MPI_COMM_WORLD), MPI_ERR_COUNT, "MPI_Alltoall");
        ERR(MPI_Allgather(ti, 1, MPI_INT, to, 1, MPI_LONG, MPI_COMM_WORLD), MPI_ERR_TRUNCATE, "MPI_Allgather");
        ERR(MPI_Allgather(ti, 1, MPI_INT, NULL, 1, MPI_INT, MPI_COMM_WORLD), MPI_ERR_BUFFER, "MPI_Allgather");
        ERR(MPI_Barrier(bad), MPI_ERR_COMM, "MPI_Barrier");
        ERR(MPI_Barrier(MPI_COMM_NULL), MPI_ERR_COMM, "MPI_Barrier");
    }
#undef ERR
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);

    /* What the fast paths pass on as it is, or leave to the full path:
     * zero counts with null buffers, MPI_ANY_TAG and MPI_ANY_SOURCE with
     * the status, MPI_STATUS_IGNORE, in-place allreduce, MPI_COMM_SELF. */
    if (size > 1) {
        if (rank == 0) {
            MPI_Send(NULL, 0, MPI_INT, 1, 78, MPI_COMM_WORLD);
            long v = 4242; MPI_Send(&v, 1, MPI_LONG, 1, 79, MPI_COMM_WORLD);
            MPI_Send(&v, 1, MPI_LONG, 1, 80, MPI_COMM_WORLD);
        } else if (rank == 1) {
            int n = -1; st.MPI_TAG = -7;
            MPI_Recv(NULL, 0, MPI_INT, 0, 78, MPI_COMM_WORLD, &st); MPI_Get_count(&st, MPI_INT, &n);
            CHECK(n == 0 && st.MPI_SOURCE == 0 && st.MPI_TAG == 78, "empty recv %d %d %d", n, st.MPI_SOURCE, st.MPI_TAG);
            long v[2] = {0, 0};
            MPI_Recv(v, 2, MPI_LONG, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st); MPI_Get_count(&st, MPI_LONG, &n);
            CHECK(n == 1 && v[0] == 4242 && st.MPI_SOURCE == 0 && st.MPI_TAG == 79, "any recv %d %ld %d %d", n, v[0], st.MPI_SOURCE, st.MPI_TAG);
            v[0] = 0; MPI_Recv(v, 1, MPI_LONG, 0, 80, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(v[0] == 4242, "recv ignoring the status %ld", v[0]);
        }
    }
    MPI_Bcast(NULL, 0, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Allreduce(NULL, NULL, 0, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_SELF);
    {
        int x = rank + 1;
        MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(x == size * (size + 1) / 2, "in-place sum %d", x);
        x = rank + 1; MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(x == size * (size + 1) / 2, "in-place sum again %d", x);
        int y = 7; MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_MAX, MPI_COMM_SELF);
        CHECK(y == x, "allreduce on self %d", y);
        int s2[2] = {rank, rank}, r2[2] = {-1, -1};
        MPI_Allgather(s2, 2, MPI_INT, r2, 2, MPI_INT, MPI_COMM_SELF);
        CHECK(r2[0] == rank && r2[1] == rank, "allgather on self %d %d", r2[0], r2[1]);
    }

    /* Environment. */
    char name[MPI_MAX_PROCESSOR_NAME]; MPI_Get_processor_name(name, &len); CHECK(len > 0, "processor name");
    int v, sv; MPI_Get_version(&v, &sv); CHECK(v == 3, "version");
    double t0 = MPI_Wtime(), t1 = MPI_Wtime(); CHECK(t1 >= t0 && MPI_Wtick() > 0, "wtime");
    void *mem; MPI_Alloc_mem(1024, MPI_INFO_NULL, &mem); memset(mem, 1, 1024); MPI_Free_mem(mem);
    MPI_Pcontrol(1);
    int *tub; MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tub, &flag); CHECK(flag && *tub >= 32767, "tag_ub");

    int total_fails; MPI_Allreduce(&fails, &total_fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf(total_fails ? "api: %d checks FAILED\n" : "api: ok\n", total_fails);
    MPI_Finalize();
    MPI_Finalized(&flag);
    return (total_fails || !flag) ? 1 : 0;
}
