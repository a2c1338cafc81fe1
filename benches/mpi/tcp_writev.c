/* The floor under a small-message tcp stream: one process writev()s N
 * 24-byte messages (a 16-byte header and 8 bytes, like ibcoll's eager
 * frame of an 8-byte collective) with TCP_NODELAY, the other drains them
 * busy-polling a non-blocking socket. Prints the sender's time per
 * message. benches/tcp-floor.sh runs it over loopback and between two
 * simulated hosts.
 *
 *   tcp_writev recv ADDR PORT N     (start first)
 *   tcp_writev send ADDR PORT N
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s recv|send ADDR PORT N\n", argv[0]);
        return 2;
    }
    long n = atol(argv[4]);
    int one = 1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[3]));
    if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", argv[2]);
        return 2;
    }
    if (strcmp(argv[1], "recv") == 0) {
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1)) {
            perror("bind/listen");
            return 1;
        }
        int c = accept(ls, NULL, NULL);
        fcntl(c, F_SETFL, O_NONBLOCK);
        static char buf[1 << 16];
        long got = 0;
        while (got < n * 24) {
            ssize_t r = recv(c, buf, sizeof buf, 0);
            if (r > 0)
                got += r;
            else if (r == 0)
                break;
        }
        return 0;
    }
    int s = socket(AF_INET, SOCK_STREAM, 0);
    for (int tries = 0; connect(s, (struct sockaddr *)&a, sizeof a); tries++) {
        if (tries > 5000) {
            perror("connect");
            return 1;
        }
        usleep(1000);
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char h[16] = {0}, p[8] = {0};
    struct iovec v[2] = {{h, 16}, {p, 8}};
    double t0 = now();
    for (long i = 0; i < n; i++) {
        if (writev(s, v, 2) != 24) {
            perror("writev");
            return 1;
        }
    }
    printf("%.2f\n", (now() - t0) / n * 1e6);
    return 0;
}
