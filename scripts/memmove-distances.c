// Times memmove of N bytes between two page-aligned buffers at a range of distances between
// source and destination, and prints the distances where it runs below 10 GB/s. Why the `am`
// benchmark's runs set glibc.cpu.x86_rep_movsb_threshold: see bench/README.md ("Copies on
// this machine").
//
//   gcc -O2 scripts/memmove-distances.c -o /tmp/memmove-distances && /tmp/memmove-distances 66000
//   GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4194304 /tmp/memmove-distances 66000
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s BYTES\n", argv[0]);
        return 2;
    }
    size_t n = strtoul(argv[1], NULL, 10);
    size_t size = 1 << 24;
    if (n == 0 || n > size / 2) {
        fprintf(stderr, "BYTES must be 1 to %zu\n", size / 2);
        return 2;
    }
    char *a = aligned_alloc(4096, size), *b = aligned_alloc(4096, size);
    memset(a, 1, size);
    memset(b, 2, size);
    double fastest = 1e18, slowest = 0;
    // Every 16 bytes near 0, 4 KiB and 8 KiB apart; every 512 bytes in between.
    for (long d = -80; d <= 8192 + 80;) {
        char *src = a + 256, *dst = b + 256 + d;
        double t0 = now_ns();
        for (int r = 0; r < 500; r++) {
            memmove(dst, src, n);
            __asm__ volatile("" ::"r"(dst) : "memory");
        }
        double ns = (now_ns() - t0) / 500;
        if (ns < fastest) fastest = ns;
        if (ns > slowest) slowest = ns;
        if (n / ns < 10) printf("distance %5ld: %.2f us (%.1f GB/s)  slow\n", d, ns / 1e3, n / ns);
        int near = d < 160 || (d > 4000 && d < 4200) || (d > 8100 && d < 8300);
        d += near ? 16 : 512;
    }
    printf("%zu bytes: fastest %.2f us, slowest %.2f us\n", n, fastest / 1e3, slowest / 1e3);
    return 0;
}
