/* MPI_ERRORS_ARE_FATAL: a send to a rank that does not exist aborts the
 * job with a message naming the rank, the peer and the function. */
#include <mpi.h>
int main(int argc, char **argv) {
    int rank, size, x = 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == size - 1) MPI_Send(&x, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
