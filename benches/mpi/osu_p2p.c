/* osu_p2p.c: OSU-style point-to-point benchmarks for any MPI, printing the
 * same format as `ibcoll-bench`, for side-by-side comparison.
 *
 *   mpicc -O2 -o osu_p2p osu_p2p.c
 *   mpirun -np 2 ./osu_p2p latency|bw|bibw [-m MIN:MAX] [-i ITERS] [-x WARMUP] [-W WINDOW]
 *
 * latency: ping-pong, half the round trip; bw: a window of nonblocking sends
 * then a 4-byte ack; bibw: windows both ways. 1 MB = 10^6 bytes.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == 'k' || *end == 'K') v <<= 10;
    else if (*end == 'm' || *end == 'M') v <<= 20;
    else if (*end == 'g' || *end == 'G') v <<= 30;
    return (size_t)v;
}

static void usage(int rank) {
    if (rank == 0)
        fprintf(stderr, "usage: osu_p2p latency|bw|bibw [-m MIN:MAX] [-i ITERS] [-x WARMUP] [-W WINDOW]\n");
    MPI_Finalize();
    exit(2);
}

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || size < 2) usage(rank);
    const char *bench = argv[1];
    size_t min = 0, max = 4u << 20;
    long iters_opt = -1, warm_opt = -1;
    int window = 64;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) {
            char *colon = strchr(argv[i + 1], ':');
            if (colon) {
                *colon = 0;
                min = parse_size(argv[i + 1]);
                max = parse_size(colon + 1);
            } else {
                max = parse_size(argv[i + 1]);
            }
        } else if (!strcmp(argv[i], "-i")) {
            iters_opt = atol(argv[i + 1]);
        } else if (!strcmp(argv[i], "-x")) {
            warm_opt = atol(argv[i + 1]);
        } else if (!strcmp(argv[i], "-W")) {
            window = atoi(argv[i + 1]);
            if (window < 1) window = 1;
        } else {
            usage(rank);
        }
    }
    int is_lat = !strcmp(bench, "latency"), is_bw = !strcmp(bench, "bw"), is_bibw = !strcmp(bench, "bibw");
    if (!is_lat && !is_bw && !is_bibw) usage(rank);

    char *sbuf = malloc(max ? max : 1), *rbuf = malloc(max ? max : 1);
    char **sb = malloc(sizeof(char *) * window), **rb = malloc(sizeof(char *) * window);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * 2 * window);
    memset(sbuf, 'a', max ? max : 1);
    memset(rbuf, 'b', max ? max : 1);
    if (!is_lat) {
        for (int w = 0; w < window; w++) {
            sb[w] = malloc(max);
            rb[w] = malloc(max);
            memset(sb[w], 'a', max);
            memset(rb[w], 'b', max);
        }
    }
    if (rank == 0) {
        int v, sv;
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_version(&v, &sv);
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        printf("# MPI %s v%d.%d (%s)\n", is_lat ? "Latency Test" : is_bw ? "Bandwidth Test" : "Bi-Directional Bandwidth Test", v, sv, lib);
        printf("# ranks %d\n", size);
        printf(is_lat ? "# Size       Avg Latency(us)\n" : "# Size      Bandwidth (MB/s)\n");
        fflush(stdout);
    }
    size_t s = min == 0 ? 0 : 1;
    while (s < min) s *= 2;
    for (; s <= max; s = s ? s * 2 : 1) {
        if (!is_lat && s == 0) continue;
        int big = s > 8192;
        long iters = iters_opt > 0 ? iters_opt : (is_lat ? (big ? 1000 : 10000) : (big ? 100 : 1000));
        long warm = warm_opt >= 0 ? warm_opt : (big ? 10 : 100);
        if (!is_lat && warm > iters) warm = iters;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters + warm; i++) {
            if (i == warm) t0 = MPI_Wtime();
            if (is_lat) {
                if (rank == 0) {
                    MPI_Send(sbuf, (int)s, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                    MPI_Recv(rbuf, (int)s, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank == 1) {
                    MPI_Recv(rbuf, (int)s, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(sbuf, (int)s, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
                }
            } else {
                int n = 0;
                char ack[4];
                if (rank == 0) {
                    if (is_bibw)
                        for (int w = 0; w < window; w++)
                            MPI_Irecv(rb[w], (int)s, MPI_CHAR, 1, 10, MPI_COMM_WORLD, &reqs[n++]);
                    for (int w = 0; w < window; w++)
                        MPI_Isend(sb[w], (int)s, MPI_CHAR, 1, 10, MPI_COMM_WORLD, &reqs[n++]);
                    MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
                    MPI_Recv(ack, 4, MPI_CHAR, 1, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank == 1) {
                    for (int w = 0; w < window; w++)
                        MPI_Irecv(rb[w], (int)s, MPI_CHAR, 0, 10, MPI_COMM_WORLD, &reqs[n++]);
                    if (is_bibw)
                        for (int w = 0; w < window; w++)
                            MPI_Isend(sb[w], (int)s, MPI_CHAR, 0, 10, MPI_COMM_WORLD, &reqs[n++]);
                    MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
                    MPI_Send(ack, 4, MPI_CHAR, 0, 11, MPI_COMM_WORLD);
                }
            }
        }
        double secs = MPI_Wtime() - t0;
        if (rank == 0) {
            if (is_lat)
                printf("%-12zu%18.2f\n", s, secs * 1e6 / (2.0 * iters));
            else
                printf("%-12zu%18.2f\n", s, (double)s * window * iters * (is_bibw ? 2.0 : 1.0) / 1e6 / secs);
            fflush(stdout);
        }
        sbuf[0]++;
    }
    MPI_Finalize();
    return 0;
}
