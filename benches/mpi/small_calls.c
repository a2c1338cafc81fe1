/* small_calls.c: nanoseconds per call of the blocking small paths of an MPI
 * library (half a round trip of MPI_Send + MPI_Recv 8 B, MPI_Allreduce 2
 * floats, MPI_Bcast 8 B, MPI_Alltoall 8 B per rank, MPI_Barrier), one line:
 * for A/B runs of two builds of a library on the same binary, e.g.
 *
 *   ibcoll-mpicc -O2 -o small_calls small_calls.c
 *   for i in $(seq 40); do for L in old new; do
 *     LD_LIBRARY_PATH=$L ibrun -n 2 --bind-to core ./small_calls 300000; done; done
 *
 * prints "latency allreduce bcast alltoall barrier" in ns (rank 0), after a
 * warm-up of a tenth of the calls. Two or more ranks.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long iters = argc > 1 ? atol(argv[1]) : 200000;
    char *s = calloc((size_t)n, 8), *r = calloc((size_t)n, 8);
    float fs[2] = {1, 2}, fr[2];
    double ns[5];
    for (int k = 0; k < 5; k++) {
        for (int warm = 1; warm >= 0; warm--) {
            long m = warm ? iters / 10 : iters;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (long i = 0; i < m; i++) {
                switch (k) {
                case 0:
                    if (rank == 0) {
                        MPI_Send(s, 8, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                        MPI_Recv(r, 8, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    } else if (rank == 1) {
                        MPI_Recv(r, 8, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                        MPI_Send(s, 8, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
                    }
                    break;
                case 1: MPI_Allreduce(fs, fr, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
                case 2: MPI_Bcast(r, 8, MPI_BYTE, 0, MPI_COMM_WORLD); break;
                case 3: MPI_Alltoall(s, 8, MPI_BYTE, r, 8, MPI_BYTE, MPI_COMM_WORLD); break;
                case 4: MPI_Barrier(MPI_COMM_WORLD); break;
                }
            }
            ns[k] = (MPI_Wtime() - t0) * 1e9 / (double)m / (k == 0 ? 2 : 1);
        }
    }
    if (rank == 0) printf("%.1f %.1f %.1f %.1f %.1f\n", ns[0], ns[1], ns[2], ns[3], ns[4]);
    free(s);
    free(r);
    MPI_Finalize();
    return 0;
}
