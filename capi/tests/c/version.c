/* Says which MPI library the program runs on (for the MPICH-ABI check). */
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len, rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Get_library_version(v, &len);
    if (rank == 0) printf("library: %.60s\n", v);
    MPI_Finalize();
    return 0;
}
