/* Nonblocking point-to-point requests: content checks of MPI_Isend/Irecv
 * (and the send modes) with MPI_Wait/Test and the -all/-any/-some forms,
 * in the combinations a halo exchange or an overlap loop meets: windows of
 * many requests reused round after round, MPI_STATUSES_IGNORE and status
 * arrays, MPI_REQUEST_NULL among active requests, tests of complete and
 * incomplete requests, Testall that completes nothing unless all are
 * complete, MPI_Request_get_status, MPI_Request_free of a pending send and
 * the slots it leaves, cancelled and truncated receives, MPI_PROC_NULL,
 * zero counts, wildcards, other communicators, plain requests mixed with
 * derived-type, persistent and collective ones, and every bad argument
 * (class, and a message naming the function and rank).
 * Runs on any number of ranks; prints "requests: ok" on rank 0 when every
 * check passed, exits non-zero otherwise. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size, fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__, __LINE__, #c); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

/* An empty status as MPI defines it (a null or inactive request's). */
static int empty(const MPI_Status *s) {
    int n = -1;
    MPI_Get_count(s, MPI_BYTE, &n);
    return s->MPI_SOURCE == MPI_ANY_SOURCE && s->MPI_TAG == MPI_ANY_TAG && n == 0;
}

static int val(int from, int round, int k) { return from * 1000000 + round * 1000 + k; }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    MPI_Status st;
    int flag;

    /* Windows both ways around the ring, reused round after round (the
     * request slots too), every message's content checked; statuses
     * ignored, then kept. */
    {
        enum { W = 100, ROUNDS = 5 };
        int out[W], in[W];
        MPI_Request rq[2 * W];
        MPI_Status sts[2 * W];
        for (int round = 0; round < ROUNDS; round++) {
            for (int k = 0; k < W; k++) { out[k] = val(rank, round, k); in[k] = -1; }
            for (int k = 0; k < W; k++) MPI_Irecv(&in[k], 1, MPI_INT, left, k, MPI_COMM_WORLD, &rq[k]);
            for (int k = 0; k < W; k++) MPI_Isend(&out[k], 1, MPI_INT, right, k, MPI_COMM_WORLD, &rq[W + k]);
            if (round % 2 == 0) {
                MPI_Waitall(2 * W, rq, MPI_STATUSES_IGNORE);
            } else {
                for (int k = 0; k < 2 * W; k++) sts[k].MPI_SOURCE = sts[k].MPI_TAG = -77;
                MPI_Waitall(2 * W, rq, sts);
                for (int k = 0; k < W; k++) {
                    int n = -1; MPI_Get_count(&sts[k], MPI_INT, &n);
                    CHECK(sts[k].MPI_SOURCE == left && sts[k].MPI_TAG == k && n == 1,
                          "round %d: status %d: source %d tag %d count %d", round, k, sts[k].MPI_SOURCE, sts[k].MPI_TAG, n);
                }
            }
            int bad = 0, nonnull = 0;
            for (int k = 0; k < W; k++) bad += in[k] != val(left, round, k);
            for (int k = 0; k < 2 * W; k++) nonnull += rq[k] != MPI_REQUEST_NULL;
            CHECK(bad == 0, "round %d: %d of %d messages wrong", round, bad, W);
            CHECK(nonnull == 0, "round %d: %d requests not nulled", round, nonnull);
        }
    }

    /* MPI_REQUEST_NULL among active requests: its status is empty, the
     * others' are theirs. Doubles and a long long, other tags. */
    {
        double d[3] = {-1, -1, -1}, dout[3] = {rank + 0.25, rank + 0.5, rank + 0.75};
        long long ll = -1, llout = 1LL << 40 | rank;
        MPI_Request rq[6];
        MPI_Status sts[6];
        rq[0] = MPI_REQUEST_NULL;
        MPI_Irecv(d, 3, MPI_DOUBLE, left, 501, MPI_COMM_WORLD, &rq[1]);
        rq[2] = MPI_REQUEST_NULL;
        MPI_Irecv(&ll, 1, MPI_LONG_LONG, left, 502, MPI_COMM_WORLD, &rq[3]);
        MPI_Isend(dout, 3, MPI_DOUBLE, right, 501, MPI_COMM_WORLD, &rq[4]);
        MPI_Isend(&llout, 1, MPI_LONG_LONG, right, 502, MPI_COMM_WORLD, &rq[5]);
        for (int k = 0; k < 6; k++) sts[k].MPI_SOURCE = sts[k].MPI_TAG = -77;
        MPI_Waitall(6, rq, sts);
        CHECK(empty(&sts[0]) && empty(&sts[2]), "null requests' statuses %d/%d %d/%d",
              sts[0].MPI_SOURCE, sts[0].MPI_TAG, sts[2].MPI_SOURCE, sts[2].MPI_TAG);
        int n = -1; MPI_Get_count(&sts[1], MPI_DOUBLE, &n);
        CHECK(sts[1].MPI_SOURCE == left && sts[1].MPI_TAG == 501 && n == 3, "double status %d %d %d", sts[1].MPI_SOURCE, sts[1].MPI_TAG, n);
        CHECK(d[0] == left + 0.25 && d[2] == left + 0.75, "doubles %g %g", d[0], d[2]);
        CHECK(ll == (1LL << 40 | left) && sts[3].MPI_TAG == 502, "long long %llx", ll);
        /* All null: nothing to wait for. */
        MPI_Waitall(6, rq, sts);
        CHECK(empty(&sts[5]), "all-null waitall status");
        MPI_Waitall(0, NULL, MPI_STATUSES_IGNORE);
    }

    /* MPI_Test: incomplete, then complete (the handle nulled, the status
     * the message's), then on the null handle (flag set, empty status).
     * MPI_Wait on a null handle too. */
    if (size > 1) {
        int go = 1, x = -1, tag = 510;
        if (rank == 0) {
            MPI_Request r;
            MPI_Irecv(&x, 1, MPI_INT, 1, tag, MPI_COMM_WORLD, &r);
            int early = 0;
            for (int i = 0; i < 200 && !early; i++) MPI_Test(&r, &early, &st);
            CHECK(!early && r != MPI_REQUEST_NULL, "a receive completed before its message was sent");
            MPI_Send(&go, 1, MPI_INT, 1, tag + 1, MPI_COMM_WORLD);
            do { MPI_Test(&r, &flag, &st); } while (!flag);
            int n = -1; MPI_Get_count(&st, MPI_INT, &n);
            CHECK(r == MPI_REQUEST_NULL && x == 4321 && st.MPI_SOURCE == 1 && st.MPI_TAG == tag && n == 1,
                  "tested receive: %d, source %d tag %d count %d", x, st.MPI_SOURCE, st.MPI_TAG, n);
            st.MPI_SOURCE = -77; flag = 0;
            MPI_Test(&r, &flag, &st);
            CHECK(flag && empty(&st), "test of a null request: flag %d source %d", flag, st.MPI_SOURCE);
            st.MPI_SOURCE = -77;
            MPI_Wait(&r, &st);
            CHECK(empty(&st), "wait of a null request: source %d", st.MPI_SOURCE);
        } else if (rank == 1) {
            MPI_Recv(&go, 1, MPI_INT, 0, tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            x = 4321;
            MPI_Request r;
            MPI_Isend(&x, 1, MPI_INT, 0, tag, MPI_COMM_WORLD, &r);
            do { MPI_Test(&r, &flag, MPI_STATUS_IGNORE); } while (!flag);
            CHECK(r == MPI_REQUEST_NULL, "tested send not nulled");
        }
    }

    /* Testall completes nothing unless all are complete: a receive whose
     * message is sent only after the tests keeps every handle (the send's
     * too, complete or not), then Waitall completes them. */
    if (size > 1 && rank < 2) {
        int peer = 1 - rank, go = 1, a = -1, b = -1, aout = 100 + rank, bout = 200 + rank;
        MPI_Request rq[3];
        MPI_Status sts[3];
        if (rank == 0) {
            MPI_Irecv(&a, 1, MPI_INT, peer, 520, MPI_COMM_WORLD, &rq[0]);
            rq[1] = MPI_REQUEST_NULL;
            MPI_Isend(&bout, 1, MPI_INT, peer, 521, MPI_COMM_WORLD, &rq[2]);
            int all = 0;
            for (int i = 0; i < 200 && !all; i++) MPI_Testall(3, rq, &all, sts);
            CHECK(!all && rq[0] != MPI_REQUEST_NULL && rq[2] != MPI_REQUEST_NULL,
                  "testall completed %d (handles %x %x) before the message was sent", all, rq[0], rq[2]);
            MPI_Send(&go, 1, MPI_INT, peer, 522, MPI_COMM_WORLD);
            do { MPI_Testall(3, rq, &all, sts); } while (!all);
            CHECK(a == 101 && sts[0].MPI_SOURCE == 1 && sts[0].MPI_TAG == 520 && empty(&sts[1]),
                  "testall: %d source %d tag %d", a, sts[0].MPI_SOURCE, sts[0].MPI_TAG);
            CHECK(rq[0] == MPI_REQUEST_NULL && rq[2] == MPI_REQUEST_NULL, "testall handles not nulled");
        } else {
            MPI_Recv(&b, 1, MPI_INT, peer, 521, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(b == 200, "testall's send %d", b);
            MPI_Recv(&go, 1, MPI_INT, peer, 522, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&aout, 1, MPI_INT, peer, 520, MPI_COMM_WORLD);
        }
    }

    /* MPI_Request_get_status leaves the request as it is: incomplete, then
     * complete with its status, and MPI_Wait then gives the same status. */
    if (size > 1 && rank < 2) {
        int peer = 1 - rank, go = 1, x = -1;
        if (rank == 0) {
            MPI_Request r;
            MPI_Irecv(&x, 1, MPI_INT, peer, 530, MPI_COMM_WORLD, &r);
            MPI_Request_get_status(r, &flag, &st);
            CHECK(!flag, "get_status of a receive whose message is not sent");
            MPI_Send(&go, 1, MPI_INT, peer, 531, MPI_COMM_WORLD);
            do { MPI_Request_get_status(r, &flag, &st); } while (!flag);
            CHECK(r != MPI_REQUEST_NULL && st.MPI_SOURCE == peer && st.MPI_TAG == 530 && x == 77,
                  "get_status: handle %x source %d tag %d value %d", r, st.MPI_SOURCE, st.MPI_TAG, x);
            MPI_Status st2;
            MPI_Wait(&r, &st2);
            CHECK(r == MPI_REQUEST_NULL && st2.MPI_SOURCE == peer && st2.MPI_TAG == 530, "wait after get_status");
        } else {
            MPI_Recv(&go, 1, MPI_INT, peer, 531, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            x = 77;
            MPI_Send(&x, 1, MPI_INT, peer, 530, MPI_COMM_WORLD);
        }
    }

    /* Waitany, Testany, Waitsome, Testsome on receives whose messages come
     * in reverse order; Testany/Testsome with nothing complete yet. */
    if (size > 1 && rank < 2) {
        enum { N = 4 };
        int peer = 1 - rank, go = 1;
        if (rank == 0) {
            int x[N];
            MPI_Request rq[N];
            for (int k = 0; k < N; k++) { x[k] = -1; MPI_Irecv(&x[k], 1, MPI_INT, peer, 540 + k, MPI_COMM_WORLD, &rq[k]); }
            int idx = -5, outc = -5, ids[N];
            MPI_Testany(N, rq, &idx, &flag, &st);
            CHECK(!flag && idx == MPI_UNDEFINED, "testany of nothing complete: flag %d index %d", flag, idx);
            MPI_Testsome(N, rq, &outc, ids, MPI_STATUSES_IGNORE);
            CHECK(outc == 0, "testsome of nothing complete: %d", outc);
            MPI_Send(&go, 1, MPI_INT, peer, 549, MPI_COMM_WORLD);
            MPI_Waitany(N, rq, &idx, &st);
            CHECK(idx >= 0 && idx < N && st.MPI_TAG == 540 + idx && x[idx] == 540 + idx && rq[idx] == MPI_REQUEST_NULL,
                  "waitany: index %d tag %d", idx, st.MPI_TAG);
            int done = 1;
            MPI_Status sts[N];
            while (done < N) {
                MPI_Testsome(N, rq, &outc, ids, sts);
                CHECK(outc != MPI_UNDEFINED, "testsome: none active with %d left", N - done);
                for (int j = 0; j < outc; j++)
                    CHECK(sts[j].MPI_TAG == 540 + ids[j] && x[ids[j]] == 540 + ids[j] && rq[ids[j]] == MPI_REQUEST_NULL,
                          "testsome: index %d tag %d", ids[j], sts[j].MPI_TAG);
                done += outc;
            }
            MPI_Waitsome(N, rq, &outc, ids, MPI_STATUSES_IGNORE);
            CHECK(outc == MPI_UNDEFINED, "waitsome of nothing active: %d", outc);
            MPI_Testany(N, rq, &idx, &flag, &st);
            CHECK(flag && idx == MPI_UNDEFINED && empty(&st), "testany of nothing active");
        } else {
            MPI_Recv(&go, 1, MPI_INT, peer, 549, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int k = N - 1; k >= 0; k--) { int v = 540 + k; MPI_Send(&v, 1, MPI_INT, peer, 540 + k, MPI_COMM_WORLD); }
        }
    }

    /* MPI_Request_free of a pending send: it still completes (the receiver
     * gets it), and the slots it and the completed requests leave are
     * reused by the requests that follow. A completed receive freed too. */
    {
        enum { K = 50 };
        static int big[K][2048], got[K][2048];
        MPI_Request rq[2 * K], f;
        for (int k = 0; k < K; k++) for (int i = 0; i < 2048; i++) { big[k][i] = val(rank, k, i % 997); got[k][i] = -1; }
        for (int k = 0; k < K; k++) {
            MPI_Isend(big[k], 2048, MPI_INT, right, 600 + k, MPI_COMM_WORLD, &f);
            MPI_Request_free(&f);
            CHECK(f == MPI_REQUEST_NULL, "freed request not nulled");
        }
        for (int k = 0; k < K; k++) MPI_Irecv(got[k], 2048, MPI_INT, left, 600 + k, MPI_COMM_WORLD, &rq[k]);
        MPI_Waitall(K, rq, MPI_STATUSES_IGNORE);
        int bad = 0;
        for (int k = 0; k < K; k++) for (int i = 0; i < 2048; i++) bad += got[k][i] != val(left, k, i % 997);
        CHECK(bad == 0, "%d ints wrong from freed sends", bad);
        /* A receive freed once complete; its buffer holds the message. */
        int x = -1, y = rank;
        MPI_Irecv(&x, 1, MPI_INT, left, 699, MPI_COMM_WORLD, &f);
        MPI_Send(&y, 1, MPI_INT, right, 699, MPI_COMM_WORLD);
        MPI_Request_get_status(f, &flag, MPI_STATUS_IGNORE);
        while (!flag) MPI_Request_get_status(f, &flag, MPI_STATUS_IGNORE);
        MPI_Request_free(&f);
        CHECK(x == left && f == MPI_REQUEST_NULL, "freed complete receive %d", x);
        /* The table's slots are reused: many rounds of one request each
         * keep working (and their handles stay valid MPI handles). */
        for (int k = 0; k < 1000; k++) {
            int a = -1, b = k * 3 + rank;
            MPI_Request r2[2];
            MPI_Irecv(&a, 1, MPI_INT, left, 700, MPI_COMM_WORLD, &r2[0]);
            MPI_Isend(&b, 1, MPI_INT, right, 700, MPI_COMM_WORLD, &r2[1]);
            CHECK(r2[0] != MPI_REQUEST_NULL && r2[1] != MPI_REQUEST_NULL && r2[0] != r2[1], "handles %x %x", r2[0], r2[1]);
            if (k % 2) MPI_Waitall(2, r2, MPI_STATUSES_IGNORE);
            else { MPI_Wait(&r2[1], MPI_STATUS_IGNORE); MPI_Wait(&r2[0], &st); }
            if (a != k * 3 + left) { CHECK(0, "round %d got %d", k, a); break; }
        }
    }

    /* Many requests at once (the table grows), ANY_SOURCE and ANY_TAG. */
    {
        enum { M = 3000 };
        int *in = malloc(sizeof(int) * M), *out = malloc(sizeof(int) * M);
        MPI_Request *rq = malloc(sizeof(MPI_Request) * 2 * M);
        MPI_Status *sts = malloc(sizeof(MPI_Status) * 2 * M);
        for (int k = 0; k < M; k++) { out[k] = val(rank, 0, k % 1000) + k; in[k] = -1; }
        for (int k = 0; k < M; k++) MPI_Irecv(&in[k], 1, MPI_INT, size == 1 ? MPI_ANY_SOURCE : left, MPI_ANY_TAG, MPI_COMM_WORLD, &rq[k]);
        for (int k = 0; k < M; k++) MPI_Isend(&out[k], 1, MPI_INT, right, k % 30000, MPI_COMM_WORLD, &rq[M + k]);
        MPI_Waitall(2 * M, rq, sts);
        int bad = 0;
        for (int k = 0; k < M; k++)
            bad += in[k] != val(left, 0, k % 1000) + k || sts[k].MPI_TAG != k % 30000 || sts[k].MPI_SOURCE != left;
        CHECK(bad == 0, "%d of %d wildcard receives wrong", bad, M);
        free(in); free(out); free(rq); free(sts);
    }

    /* MPI_PROC_NULL, zero counts with null buffers, the send modes. */
    {
        MPI_Request rq[6];
        MPI_Status sts[6];
        int x = 5, y = -1, z = -1, w = -1;
        MPI_Isend(&x, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD, &rq[0]);
        MPI_Irecv(&y, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD, &rq[1]);
        MPI_Irecv(NULL, 0, MPI_INT, left, 800, MPI_COMM_WORLD, &rq[2]);
        MPI_Isend(NULL, 0, MPI_INT, right, 800, MPI_COMM_WORLD, &rq[3]);
        static char bsend_buf[MPI_BSEND_OVERHEAD + 64];
        MPI_Buffer_attach(bsend_buf, sizeof bsend_buf);
        MPI_Irecv(&z, 1, MPI_INT, left, 801, MPI_COMM_WORLD, &rq[4]);
        MPI_Ibsend(&x, 1, MPI_INT, right, 801, MPI_COMM_WORLD, &rq[5]);
        MPI_Waitall(6, rq, sts);
        void *detached; int dsize;
        MPI_Buffer_detach(&detached, &dsize);
        int n = -1; MPI_Get_count(&sts[1], MPI_INT, &n);
        CHECK(y == -1 && sts[1].MPI_SOURCE == MPI_PROC_NULL && sts[1].MPI_TAG == MPI_ANY_TAG && n == 0,
              "proc_null receive: %d source %d tag %d count %d", y, sts[1].MPI_SOURCE, sts[1].MPI_TAG, n);
        MPI_Get_count(&sts[2], MPI_INT, &n);
        CHECK(sts[2].MPI_SOURCE == left && sts[2].MPI_TAG == 800 && n == 0, "empty receive: source %d count %d", sts[2].MPI_SOURCE, n);
        CHECK(z == 5, "ibsend %d", z);
        /* Irsend: the receive is posted (and the ring synchronized) first. */
        MPI_Request r;
        MPI_Irecv(&w, 1, MPI_INT, left, 802, MPI_COMM_WORLD, &r);
        MPI_Barrier(MPI_COMM_WORLD);
        int v = rank + 900;
        MPI_Request s;
        MPI_Irsend(&v, 1, MPI_INT, right, 802, MPI_COMM_WORLD, &s);
        MPI_Wait(&s, MPI_STATUS_IGNORE);
        MPI_Wait(&r, &st);
        CHECK(w == left + 900 && st.MPI_TAG == 802, "irsend %d", w);
    }

    /* A receive nobody sends to, cancelled: MPI_Test completes it. */
    {
        int z = -1;
        MPI_Request r;
        MPI_Irecv(&z, 1, MPI_INT, left, 999, MPI_COMM_WORLD, &r);
        MPI_Cancel(&r);
        flag = 0;
        MPI_Test(&r, &flag, &st);
        int c = 0; MPI_Test_cancelled(&st, &c);
        CHECK(flag && c && r == MPI_REQUEST_NULL && z == -1, "cancel: flag %d cancelled %d", flag, c);
    }

    /* Other communicators: a duplicate (reversed ranks) and MPI_COMM_SELF. */
    {
        MPI_Comm rev;
        MPI_Comm_split(MPI_COMM_WORLD, 0, size - 1 - rank, &rev);
        int rr; MPI_Comm_rank(rev, &rr);
        int rright = (rr + 1) % size, rleft = (rr + size - 1) % size, a = -1, b = rr * 11;
        MPI_Request rq[2];
        MPI_Irecv(&a, 1, MPI_INT, rleft, 5, rev, &rq[0]);
        MPI_Isend(&b, 1, MPI_INT, rright, 5, rev, &rq[1]);
        MPI_Status sts[2];
        MPI_Waitall(2, rq, sts);
        CHECK(a == rleft * 11 && sts[0].MPI_SOURCE == rleft, "split communicator: %d from %d", a, sts[0].MPI_SOURCE);
        /* The same tag on world does not match a message of `rev`. */
        MPI_Irecv(&a, 1, MPI_INT, MPI_ANY_SOURCE, 5, MPI_COMM_SELF, &rq[0]);
        b = 31337;
        MPI_Isend(&b, 1, MPI_INT, 0, 5, MPI_COMM_SELF, &rq[1]);
        MPI_Waitall(2, rq, sts);
        CHECK(a == 31337 && sts[0].MPI_SOURCE == 0, "self: %d from %d", a, sts[0].MPI_SOURCE);
        MPI_Comm_free(&rev);
    }

    /* Plain requests mixed in one Waitall with a derived-type receive, a
     * persistent request, a nonblocking collective and a null handle. */
    {
        MPI_Datatype col;
        MPI_Type_vector(3, 1, 2, MPI_INT, &col);
        MPI_Type_commit(&col);
        int v[5] = {-1, -2, -1, -2, -1}, vo[3] = {rank, rank + 1, rank + 2}, p = -1, po = rank * 7, q = -1, qo = rank * 5;
        int sum = 0, one = 1;
        MPI_Request rq[8];
        MPI_Status sts[8];
        MPI_Irecv(v, 1, col, left, 810, MPI_COMM_WORLD, &rq[0]);
        MPI_Recv_init(&p, 1, MPI_INT, left, 811, MPI_COMM_WORLD, &rq[1]);
        MPI_Start(&rq[1]);
        MPI_Irecv(&q, 1, MPI_INT, left, 812, MPI_COMM_WORLD, &rq[2]);
        rq[3] = MPI_REQUEST_NULL;
        MPI_Iallreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &rq[4]);
        MPI_Isend(vo, 3, MPI_INT, right, 810, MPI_COMM_WORLD, &rq[5]);
        MPI_Isend(&po, 1, MPI_INT, right, 811, MPI_COMM_WORLD, &rq[6]);
        MPI_Isend(&qo, 1, MPI_INT, right, 812, MPI_COMM_WORLD, &rq[7]);
        MPI_Waitall(8, rq, sts);
        CHECK(v[0] == left && v[2] == left + 1 && v[4] == left + 2 && v[1] == -2 && v[3] == -2,
              "vector receive %d %d %d %d %d", v[0], v[1], v[2], v[3], v[4]);
        CHECK(p == left * 7 && sts[1].MPI_SOURCE == left && q == left * 5 && sts[2].MPI_TAG == 812 && sum == size,
              "mixed: persistent %d plain %d allreduce %d", p, q, sum);
        CHECK(rq[1] != MPI_REQUEST_NULL && rq[0] == MPI_REQUEST_NULL && rq[2] == MPI_REQUEST_NULL && rq[4] == MPI_REQUEST_NULL,
              "mixed: handles %x %x %x %x", rq[0], rq[1], rq[2], rq[4]);
        MPI_Request_free(&rq[1]);
        MPI_Type_free(&col);
    }

    /* Errors: every bad argument of the nonblocking calls is its class,
     * with a message naming the function and the rank; the requests of a
     * Waitall with a bad handle among them still complete. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    {
        int rc, cls, len;
        char es[MPI_MAX_ERROR_STRING];
        int a = 1, b = -1;
        MPI_Request r = MPI_REQUEST_NULL;
        MPI_Comm bad = (MPI_Comm)0x777;
#define ERR(call, want, fn) do { rc = (call); MPI_Error_class(rc, &cls); es[0] = 0; MPI_Error_string(rc, es, &len); \
        CHECK(cls == (want) && strstr(es, fn) && strstr(es, "rank"), "%s: class %d, message '%s'", #call, cls, es); } while (0)
        ERR(MPI_Isend(&a, 1, MPI_INT, size, 0, MPI_COMM_WORLD, &r), MPI_ERR_RANK, "MPI_Isend");
        ERR(MPI_Isend(&a, 1, MPI_INT, -7, 0, MPI_COMM_WORLD, &r), MPI_ERR_RANK, "MPI_Isend");
        ERR(MPI_Issend(&a, 1, MPI_INT, size + 1, 0, MPI_COMM_WORLD, &r), MPI_ERR_RANK, "MPI_Issend");
        ERR(MPI_Irsend(&a, 1, MPI_INT, 0, -3, MPI_COMM_WORLD, &r), MPI_ERR_TAG, "MPI_Irsend");
        ERR(MPI_Ibsend(&a, -1, MPI_INT, 0, 0, MPI_COMM_WORLD, &r), MPI_ERR_COUNT, "MPI_Ibsend");
        ERR(MPI_Isend(&a, 1, MPI_INT, 0, -1, MPI_COMM_WORLD, &r), MPI_ERR_TAG, "MPI_Isend");
        ERR(MPI_Isend(NULL, 2, MPI_INT, 0, 0, MPI_COMM_WORLD, &r), MPI_ERR_BUFFER, "MPI_Isend");
        ERR(MPI_Isend(&a, 1, (MPI_Datatype)0x1234, 0, 0, MPI_COMM_WORLD, &r), MPI_ERR_TYPE, "MPI_Isend");
        ERR(MPI_Isend(&a, 1, MPI_DATATYPE_NULL, 0, 0, MPI_COMM_WORLD, &r), MPI_ERR_TYPE, "MPI_Isend");
        ERR(MPI_Isend(&a, 1, MPI_INT, 0, 0, bad, &r), MPI_ERR_COMM, "MPI_Isend");
        ERR(MPI_Isend(&a, 1, MPI_INT, 0, 0, MPI_COMM_NULL, &r), MPI_ERR_COMM, "MPI_Isend");
        ERR(MPI_Isend(&a, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, NULL), MPI_ERR_REQUEST, "MPI_Isend");
        ERR(MPI_Irecv(&b, 1, MPI_INT, size, 0, MPI_COMM_WORLD, &r), MPI_ERR_RANK, "MPI_Irecv");
        ERR(MPI_Irecv(&b, 1, MPI_INT, -7, 0, MPI_COMM_WORLD, &r), MPI_ERR_RANK, "MPI_Irecv");
        ERR(MPI_Irecv(&b, 1, MPI_INT, 0, -5, MPI_COMM_WORLD, &r), MPI_ERR_TAG, "MPI_Irecv");
        ERR(MPI_Irecv(&b, -1, MPI_INT, 0, 0, MPI_COMM_WORLD, &r), MPI_ERR_COUNT, "MPI_Irecv");
        ERR(MPI_Irecv(NULL, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, &r), MPI_ERR_BUFFER, "MPI_Irecv");
        ERR(MPI_Irecv(&b, 1, (MPI_Datatype)0x1234, 0, 0, MPI_COMM_WORLD, &r), MPI_ERR_TYPE, "MPI_Irecv");
        ERR(MPI_Irecv(&b, 1, MPI_INT, 0, 0, bad, &r), MPI_ERR_COMM, "MPI_Irecv");
        ERR(MPI_Irecv(&b, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, NULL), MPI_ERR_REQUEST, "MPI_Irecv");
        CHECK(r == MPI_REQUEST_NULL, "a refused call set the request: %x", r);
        MPI_Request junk = (MPI_Request)0xac00ffff, freed;
        ERR(MPI_Wait(&junk, &st), MPI_ERR_REQUEST, "MPI_Wait");
        ERR(MPI_Wait(NULL, &st), MPI_ERR_REQUEST, "MPI_Wait");
        ERR(MPI_Test(&junk, &flag, &st), MPI_ERR_REQUEST, "MPI_Test");
        ERR(MPI_Test(NULL, &flag, &st), MPI_ERR_REQUEST, "MPI_Test");
        ERR(MPI_Waitall(-1, &junk, MPI_STATUSES_IGNORE), MPI_ERR_COUNT, "MPI_Waitall");
        ERR(MPI_Request_free(&junk), MPI_ERR_REQUEST, "MPI_Request_free");
        /* A handle freed already (its slot vacant) is refused too. */
        MPI_Irecv(&b, 1, MPI_INT, left, 900, MPI_COMM_WORLD, &freed);
        MPI_Request stale = freed;
        MPI_Send(&a, 1, MPI_INT, right, 900, MPI_COMM_WORLD);
        MPI_Wait(&freed, MPI_STATUS_IGNORE);
        ERR(MPI_Wait(&stale, &st), MPI_ERR_REQUEST, "MPI_Wait");
        /* A flag pointer that is null, with a live request: refused, and
         * the request stays valid. */
        MPI_Irecv(&b, 1, MPI_INT, left, 901, MPI_COMM_WORLD, &r);
        ERR(MPI_Test(&r, NULL, &st), MPI_ERR_ARG, "MPI_Test");
        CHECK(r != MPI_REQUEST_NULL, "refused test nulled the request");
        MPI_Send(&a, 1, MPI_INT, right, 901, MPI_COMM_WORLD);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
        /* Waitall with a bad handle among good ones: the good ones
         * complete; MPI_ERR_REQUEST, or MPI_ERR_IN_STATUS with statuses. */
        int x = -1, y = -1, xo = rank + 40;
        MPI_Request rq[4];
        MPI_Irecv(&x, 1, MPI_INT, left, 902, MPI_COMM_WORLD, &rq[0]);
        rq[1] = (MPI_Request)0xac00fffe;
        MPI_Isend(&xo, 1, MPI_INT, right, 902, MPI_COMM_WORLD, &rq[2]);
        rq[3] = MPI_REQUEST_NULL;
        ERR(MPI_Waitall(4, rq, MPI_STATUSES_IGNORE), MPI_ERR_REQUEST, "MPI_Waitall");
        CHECK(x == left + 40 && rq[0] == MPI_REQUEST_NULL && rq[2] == MPI_REQUEST_NULL, "waitall around a bad handle: %d", x);
        MPI_Status sts[4];
        MPI_Irecv(&y, 1, MPI_INT, left, 903, MPI_COMM_WORLD, &rq[0]);
        MPI_Isend(&xo, 1, MPI_INT, right, 903, MPI_COMM_WORLD, &rq[2]);
        ERR(MPI_Waitall(4, rq, sts), MPI_ERR_IN_STATUS, "MPI_Waitall");
        CHECK(y == left + 40 && sts[0].MPI_SOURCE == left && sts[0].MPI_ERROR == MPI_SUCCESS, "waitall with statuses around a bad handle");
        /* Truncated receives: Wait, Test, Waitall say so in the status. */
        char big[64], small[8];
        memset(big, 'x', sizeof big);
        MPI_Irecv(small, 8, MPI_CHAR, left, 904, MPI_COMM_WORLD, &r);
        MPI_Send(big, 64, MPI_CHAR, right, 904, MPI_COMM_WORLD);
        st.MPI_SOURCE = -77;
        ERR(MPI_Wait(&r, &st), MPI_ERR_TRUNCATE, "MPI_Wait");
        CHECK(r == MPI_REQUEST_NULL && st.MPI_SOURCE == left && st.MPI_TAG == 904, "truncated wait: source %d tag %d", st.MPI_SOURCE, st.MPI_TAG);
        MPI_Irecv(small, 8, MPI_CHAR, left, 905, MPI_COMM_WORLD, &r);
        MPI_Send(big, 64, MPI_CHAR, right, 905, MPI_COMM_WORLD);
        flag = 0;
        do { rc = MPI_Test(&r, &flag, &st); } while (!flag && rc == MPI_SUCCESS);
        MPI_Error_class(rc, &cls);
        CHECK(flag && cls == MPI_ERR_TRUNCATE && r == MPI_REQUEST_NULL && st.MPI_TAG == 905, "truncated test: flag %d class %d", flag, cls);
        MPI_Irecv(small, 8, MPI_CHAR, left, 906, MPI_COMM_WORLD, &rq[0]);
        MPI_Irecv(&y, 1, MPI_INT, left, 907, MPI_COMM_WORLD, &rq[1]);
        MPI_Send(big, 64, MPI_CHAR, right, 906, MPI_COMM_WORLD);
        MPI_Send(&xo, 1, MPI_INT, right, 907, MPI_COMM_WORLD);
        ERR(MPI_Waitall(2, rq, sts), MPI_ERR_IN_STATUS, "MPI_Waitall");
        CHECK(sts[0].MPI_ERROR == MPI_ERR_TRUNCATE && sts[0].MPI_TAG == 906 && sts[1].MPI_ERROR == MPI_SUCCESS && y == left + 40,
              "truncated waitall: errors %d %d", sts[0].MPI_ERROR, sts[1].MPI_ERROR);
#undef ERR
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);

    /* A send never waited for: MPI_Finalize completes it (the receiver's
     * MPI_Recv gets it). */
    {
        static int keep = 0;
        int got = -1;
        MPI_Request r;
        keep = rank + 3000;
        MPI_Isend(&keep, 1, MPI_INT, right, 950, MPI_COMM_WORLD, &r);
        MPI_Recv(&got, 1, MPI_INT, left, 950, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        CHECK(got == left + 3000, "unwaited send %d", got);
    }

    int total;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf(total ? "requests: %d checks FAILED\n" : "requests: ok\n", total);
    MPI_Finalize();
    return total ? 1 : 0;
}
