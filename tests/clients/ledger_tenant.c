/* What a hostile tenant can do to the tools that look at ledgers: make a shared-memory
 * segment that looks like a ledger and write into its header whatever it likes (it can do
 * as much to its own ledger's segment, which every process of a ledger writes), and try to
 * attach segments of others.
 *
 *   ledger_tenant forge HEADER_FILE SIZE [CHROOT_DIR] UID
 *       Reads a ledger header (the test writes it), goes into CHROOT_DIR if given (it is
 *       then the process's root, as a container's is), becomes UID, makes a SIZE-byte
 *       segment of mode 0600, copies the header in, prints "forged shmid=N" and holds the
 *       segment until its standard input closes.
 *   ledger_tenant attach SHMID
 *       Prints "attach rc=0" if the segment could be attached read-write, else
 *       "attach errno=N".
 *   ledger_tenant hold-lock FILE OFFSET...
 *       Takes an OFD write lock on one byte at each OFFSET of FILE, prints "locked" and
 *       holds them until its standard input closes.
 *   ledger_tenant hold-range FILE START
 *       The same with one lock from START to the end of the file (and beyond).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <unistd.h>

static void wait_for_eof(void) {
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
}

static int forge(int argc, char **argv) {
    if (argc < 5) return 2;
    FILE *f = fopen(argv[2], "rb");
    if (!f) { perror("open header"); return 1; }
    char header[512];
    if (fread(header, 1, sizeof header, f) != sizeof header) { fprintf(stderr, "short header\n"); return 1; }
    fclose(f);
    size_t size = strtoull(argv[3], NULL, 10);
    const char *dir = argc > 5 ? argv[4] : NULL;
    unsigned uid = (unsigned)strtoul(argv[argc - 1], NULL, 10);
    if (dir && (chroot(dir) != 0 || chdir("/") != 0)) { perror("chroot"); return 1; }
    if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0) { perror("setuid"); return 1; }
    int id = shmget(IPC_PRIVATE, size, IPC_CREAT | 0600);
    if (id < 0) { perror("shmget"); return 1; }
    char *base = shmat(id, NULL, 0);
    if (base == (void *)-1) { perror("shmat"); return 1; }
    memcpy(base, header, sizeof header);
    shmctl(id, IPC_RMID, NULL);
    printf("forged shmid=%d\n", id);
    fflush(stdout);
    wait_for_eof();
    return 0;
}

static int attach(char **argv) {
    void *base = shmat(atoi(argv[2]), NULL, 0);
    if (base == (void *)-1) printf("attach errno=%d\n", errno);
    else printf("attach rc=0\n");
    return 0;
}

static int hold_lock(int argc, char **argv) {
    int fd = open(argv[2], O_RDWR | O_CLOEXEC);
    if (fd < 0) { perror("open"); return 1; }
    for (int i = 3; i < argc; i++) {
        struct flock lock = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = strtoll(argv[i], NULL, 10), .l_len = 1 };
        if (fcntl(fd, F_OFD_SETLK, &lock) != 0) { perror("lock"); return 1; }
    }
    printf("locked\n");
    fflush(stdout);
    wait_for_eof();
    return 0;
}

static int hold_range(char **argv) {
    int fd = open(argv[2], O_RDWR | O_CLOEXEC);
    if (fd < 0) { perror("open"); return 1; }
    struct flock lock = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = strtoll(argv[3], NULL, 10), .l_len = 0 };
    if (fcntl(fd, F_OFD_SETLK, &lock) != 0) { perror("lock"); return 1; }
    printf("locked\n");
    fflush(stdout);
    wait_for_eof();
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "forge") == 0) return forge(argc, argv);
    if (argc == 3 && strcmp(argv[1], "attach") == 0) return attach(argv);
    if (argc >= 4 && strcmp(argv[1], "hold-lock") == 0) return hold_lock(argc, argv);
    if (argc == 4 && strcmp(argv[1], "hold-range") == 0) return hold_range(argv);
    fprintf(stderr, "usage: ledger_tenant forge HEADER SIZE [DIR] UID | attach SHMID | hold-lock FILE OFFSET... | hold-range FILE START\n");
    return 2;
}
