/*
 * Physical limits of this machine, as points of reference for the
 * object-transfer benchmarks:
 *
 *   physlimits memcpy   single-thread memcpy bandwidth: 256 MiB buffers,
 *                       pre-faulted, copied repeatedly for about 2 s;
 *                       prints the best and the mean of the passes in GB/s.
 *   physlimits tcp      loopback TCP throughput: a forked child sends 1 MiB
 *                       writes to 127.0.0.1 for about 3 s, the parent reads
 *                       them; prints GB/s and Gbit/s as seen by the reader.
 *
 * Build: gcc -O2 -o physlimits physlimits.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int bench_memcpy(void) {
    const size_t size = 256UL << 20;
    char *src = malloc(size), *dst = malloc(size);
    if (!src || !dst) { perror("malloc"); return 1; }
    memset(src, 1, size);
    memset(dst, 2, size);
    memcpy(dst, src, size); /* warm-up */
    double best = 0, total_bytes = 0, start = now();
    while (now() - start < 2.0) {
        double t0 = now();
        memcpy(dst, src, size);
        double dt = now() - t0;
        __asm__ __volatile__("" : : "r"(dst) : "memory");
        double rate = size / dt / 1e9;
        if (rate > best) best = rate;
        total_bytes += size;
    }
    double mean = total_bytes / (now() - start) / 1e9;
    printf("memcpy_best_GBps %.3f\nmemcpy_mean_GBps %.3f\n", best, mean);
    free(src);
    free(dst);
    return 0;
}

static int bench_tcp(void) {
    const size_t chunk = 1 << 20;
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 1)) {
        perror("bind/listen");
        return 1;
    }
    socklen_t len = sizeof addr;
    getsockname(listener, (struct sockaddr *)&addr, &len);
    pid_t child = fork();
    if (child == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&addr, sizeof addr)) { perror("connect"); _exit(1); }
        char *buf = malloc(chunk);
        memset(buf, 7, chunk);
        double start = now();
        while (now() - start < 3.0) {
            size_t off = 0;
            while (off < chunk) {
                ssize_t n = write(s, buf + off, chunk - off);
                if (n <= 0) _exit(1);
                off += (size_t)n;
            }
        }
        close(s);
        _exit(0);
    }
    int conn = accept(listener, NULL, NULL);
    if (conn < 0) { perror("accept"); return 1; }
    char *buf = malloc(chunk);
    double total = 0, start = now(), last = start;
    for (;;) {
        ssize_t n = read(conn, buf, chunk);
        if (n <= 0) break;
        total += n;
        last = now();
    }
    waitpid(child, NULL, 0);
    double rate = total / (last - start);
    printf("tcp_GBps %.3f\ntcp_Gbitps %.3f\n", rate / 1e9, rate * 8 / 1e9);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "memcpy") == 0) return bench_memcpy();
    if (argc == 2 && strcmp(argv[1], "tcp") == 0) return bench_tcp();
    fprintf(stderr, "usage: %s memcpy|tcp\n", argv[0]);
    return 2;
}
