/* Startup benchmark's MPI side: init, one barrier, finalize (as
 * `scale_check barrier` on ibcoll; benches/scale.sh). */
#include <mpi.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
