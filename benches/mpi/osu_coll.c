/* osu_coll.c: OSU-style collective latency for any MPI, printing the same
 * format as `ibcoll-bench <collective>` so the two can be compared side by
 * side (benches/compare-coll.sh).
 *
 *   mpicc -O2 -o osu_coll osu_coll.c
 *   mpirun -np N ./osu_coll COLLECTIVE [-m MIN:MAX] [-i ITERS] [-x WARMUP]
 *
 * Sizes are bytes per rank, as in ibcoll-bench: the vector for bcast (bytes)
 * and reduce/allreduce/scan/exscan (floats, MPI_SUM); one rank's block for
 * gather/scatter/allgather/alltoall/reduce_scatter_block and the v-forms
 * (uniform counts and displacements, made before timing as in OSU's
 * osu_*v), reduce_scatter (size/4 floats per rank). Per size: the
 * average over ranks of each rank's mean call time, the min and max of those
 * means, the standard deviation of single calls, and the iteration count.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == 'k' || *end == 'K') v <<= 10;
    else if (*end == 'm' || *end == 'M') v <<= 20;
    return (size_t)v;
}

enum { BARRIER, BCAST, REDUCE, ALLREDUCE, SCAN, EXSCAN, GATHER, SCATTER, ALLGATHER, ALLTOALL, RSB,
       GATHERV, SCATTERV, ALLGATHERV, ALLTOALLV, RS, NCOLL };
static const char *names[NCOLL] = {"barrier", "bcast", "reduce", "allreduce", "scan", "exscan",
                                   "gather", "scatter", "allgather", "alltoall", "reduce_scatter_block",
                                   "gatherv", "scatterv", "allgatherv", "alltoallv", "reduce_scatter"};

/* Uniform v-layout of the current size: counts (bytes), displacements,
 * and float counts for reduce_scatter. */
static int *counts, *displs, *kcounts;

static void layout(size_t size, int n) {
    for (int i = 0; i < n; i++) {
        counts[i] = (int)size;
        displs[i] = i * (int)size;
        kcounts[i] = (int)(size / 4);
    }
}

static void call(int coll, size_t size, char *s, char *r, int n) {
    int k = (int)(size / 4), b = (int)size;
    switch (coll) {
    case BARRIER: MPI_Barrier(MPI_COMM_WORLD); break;
    case BCAST: MPI_Bcast(r, b, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    case REDUCE: MPI_Reduce(s, r, k, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD); break;
    case ALLREDUCE: MPI_Allreduce(s, r, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case SCAN: MPI_Scan(s, r, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case EXSCAN: MPI_Exscan(s, r, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case GATHER: MPI_Gather(s, b, MPI_BYTE, r, b, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    case SCATTER: MPI_Scatter(s, b, MPI_BYTE, r, b, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    case ALLGATHER: MPI_Allgather(s, b, MPI_BYTE, r, b, MPI_BYTE, MPI_COMM_WORLD); break;
    case ALLTOALL: MPI_Alltoall(s, b, MPI_BYTE, r, b, MPI_BYTE, MPI_COMM_WORLD); break;
    case RSB: MPI_Reduce_scatter_block(s, r, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case GATHERV: MPI_Gatherv(s, b, MPI_BYTE, r, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    case SCATTERV: MPI_Scatterv(s, counts, displs, MPI_BYTE, r, b, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    case ALLGATHERV: MPI_Allgatherv(s, b, MPI_BYTE, r, counts, displs, MPI_BYTE, MPI_COMM_WORLD); break;
    case ALLTOALLV:
        MPI_Alltoallv(s, counts, displs, MPI_BYTE, r, counts, displs, MPI_BYTE, MPI_COMM_WORLD);
        break;
    case RS: MPI_Reduce_scatter(s, r, kcounts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    }
    (void)n;
}

int main(int argc, char **argv) {
    int rank, n;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int coll = -1;
    if (argc >= 2)
        for (int i = 0; i < NCOLL; i++)
            if (strcmp(argv[1], names[i]) == 0) coll = i;
    if (coll < 0) {
        if (rank == 0) fprintf(stderr, "usage: osu_coll COLLECTIVE [-m MIN:MAX] [-i ITERS] [-x WARMUP]\n");
        MPI_Finalize();
        return 2;
    }
    size_t min = 4, max = 1 << 20;
    long iters_opt = -1, warm_opt = -1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-m") == 0) {
            char *c = strchr(argv[i + 1], ':');
            if (c) { *c = 0; min = parse_size(argv[i + 1]); max = parse_size(c + 1); }
            else max = parse_size(argv[i + 1]);
        } else if (strcmp(argv[i], "-i") == 0) iters_opt = atol(argv[i + 1]);
        else if (strcmp(argv[i], "-x") == 0) warm_opt = atol(argv[i + 1]);
    }
    size_t cap = (size_t)n * (max < 4 ? 4 : max);
    char *s = malloc(cap), *r = malloc(cap);
    for (size_t i = 0; i < cap / 4; i++) ((float *)s)[i] = 1.0f;
    memset(r, 0, cap);
    if (rank == 0) {
        printf("# MPI %s Latency Test\n# ranks %d\n", names[coll], n);
        printf("%-10s%17s%17s%17s%17s%12s\n", "# Size", "Avg Latency(us)", "Min Latency(us)",
               "Max Latency(us)", "StdDev(us)", "Iterations");
    }
    int reduces = coll == REDUCE || coll == ALLREDUCE || coll == SCAN || coll == EXSCAN || coll == RSB ||
                  coll == RS;
    counts = malloc(n * sizeof(int));
    displs = malloc(n * sizeof(int));
    kcounts = malloc(n * sizeof(int));
    for (size_t size = coll == BARRIER ? 0 : min; size <= max; size = size ? size * 2 : 1) {
        if (reduces && size % 4 != 0) continue;
        int big = size > 8192;
        long iters = iters_opt > 0 ? iters_opt : (big ? 100 : 1000);
        long warm = warm_opt >= 0 ? warm_opt : (big ? 10 : 100);
        layout(size, n);
        for (long i = 0; i < warm; i++) call(coll, size, s, r, n);
        MPI_Barrier(MPI_COMM_WORLD);
        double sum = 0, sq = 0;
        for (long i = 0; i < iters; i++) {
            double t = MPI_Wtime();
            call(coll, size, s, r, n);
            double us = (MPI_Wtime() - t) * 1e6;
            sum += us;
            sq += us * us;
        }
        double mean = sum / iters, tot[2] = {sum, sq}, all[2], mn, mx;
        MPI_Allreduce(tot, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&mean, &mn, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(&mean, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double cnt = (double)iters * n, avg = all[0] / cnt;
        double var = all[1] / cnt - avg * avg;
        if (rank == 0)
            printf("%-10zu%17.2f%17.2f%17.2f%17.2f%12ld\n", size, avg, mn, mx, sqrt(var > 0 ? var : 0), iters);
        if (coll == BARRIER) break;
    }
    free(s);
    free(r);
    free(counts);
    free(displs);
    free(kcounts);
    MPI_Finalize();
    return 0;
}
