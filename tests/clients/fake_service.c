/*
 * fake_service: a stand-in for `fgpu service` (core/src/hostpid.rs speaks its protocol:
 * "FGPUPID1" then a little-endian u32 PID) for the tests of the shim's client side.
 *
 *   fake_service SOCKET [--answer PID] [--full-for MS]
 *
 * It listens on SOCKET (mode 0777) with a backlog of 0, so one pending connection fills it.
 * --answer PID   answers every client with PID instead of the PID the kernel gives
 *                (SO_PEERCRED), as a service run by someone who lies would
 * --full-for MS  first connects to itself and leaves that connection pending for MS
 *                milliseconds, so a client's connect meanwhile is turned away (EAGAIN)
 * Prints "listening", then "answered pid=N" per client.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: fake_service SOCKET [--answer PID] [--full-for MS]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *path = argv[1];
    long answer = 0, full_for = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--answer")) answer = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--full-for")) full_for = atol(argv[i + 1]);
    }
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof addr.sun_path) {
        fprintf(stderr, "path too long\n");
        return 2;
    }
    strcpy(addr.sun_path, path);
    unlink(path);
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 0) != 0) {
        perror("fake_service: listen");
        return 1;
    }
    chmod(path, 0777);
    int filler = -1;
    long long full_until = 0;
    if (full_for > 0) {
        filler = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (connect(filler, (struct sockaddr *)&addr, sizeof addr) != 0) {
            perror("fake_service: filler");
            return 1;
        }
        full_until = now_ms() + full_for;
    }
    printf("listening\n");
    for (;;) {
        if (filler >= 0) {
            long long left = full_until - now_ms();
            if (left > 0) {
                usleep(left > 20 ? 20000 : (useconds_t)(left * 1000));
                continue;
            }
            /* Take the filler off the queue and drop it: the backlog has room again. */
            int c = accept(listener, NULL, NULL);
            if (c >= 0) close(c);
            close(filler);
            filler = -1;
            printf("room\n");
        }
        int c = accept(listener, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR) continue;
            perror("fake_service: accept");
            return 1;
        }
        struct ucred cred;
        socklen_t len = sizeof cred;
        uint32_t pid = (uint32_t)answer;
        if (pid == 0 && getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) pid = (uint32_t)cred.pid;
        unsigned char reply[12] = { 'F', 'G', 'P', 'U', 'P', 'I', 'D', '1' };
        for (int k = 0; k < 4; k++) reply[8 + k] = (unsigned char)(pid >> (8 * k));
        if (write(c, reply, sizeof reply) == (ssize_t)sizeof reply) printf("answered pid=%u\n", pid);
        close(c);
    }
}
