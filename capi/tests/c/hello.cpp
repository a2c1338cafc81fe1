// The interface from C++: mpi.h is extern "C"; a halo exchange and a reduction.
#include <mpi.h>
#include <cstdio>
#include <vector>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<double> out(4, rank), in(4, -1);
    MPI_Request r[2];
    MPI_Irecv(in.data(), 4, MPI_DOUBLE, (rank + size - 1) % size, 0, MPI_COMM_WORLD, &r[0]);
    MPI_Isend(out.data(), 4, MPI_DOUBLE, (rank + 1) % size, 0, MPI_COMM_WORLD, &r[1]);
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    int ok = in[3] == (rank + size - 1) % size, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) std::printf("hello from C++: %d ranks, %d halos right\n", size, all);
    MPI_Finalize();
    return all == size ? 0 : 1;
}
