/* MPI_THREAD_FUNNELED: a call from a thread other than MPI_Init's is refused
   with an error naming the cause (fatal under the default handler), never a
   race on the library's state. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>

static void *other_thread(void *arg) {
    int r;
    (void)arg;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    printf("thread: the call from another thread returned\n");
    return NULL;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    pthread_t th;
    pthread_create(&th, NULL, other_thread, NULL);
    pthread_join(th, NULL);
    MPI_Finalize();
    return 0;
}
