/*
 * slurm-gpu-exec: join cgroups, pin CPUs, drop to a user, then exec.
 *
 * The runner (slurm_gpu/runner.py) starts commands with subprocess, which
 * runs no Python between fork and exec.  What subprocess cannot do before
 * exec is done here, in this order: the cgroups are joined as root (once
 * the command is the user it could not move itself), the CPUs are set, the
 * identity is dropped, and the command is exec'd.  So the command never runs
 * outside its cgroups or CPUs, and never as root.
 *
 *   slurm-gpu-exec -r FD [-c CGROUP_PROCS]... [-a CPU,CPU...]
 *                  [-u UID -g GID -G GID,GID...|-] -- PROGRAM ARG...
 *
 * A failure before exec is written to FD as "<stage>:<errno>" (C cgroup,
 * A affinity, U identity, E exec, S setup) and the helper exits 255; FD is
 * close-on-exec, so the runner reads EOF once PROGRAM runs.  PROGRAM
 * without a slash is looked up in the PATH of the environment it was given
 * (never a shell, as subprocess does).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CGROUPS 16

extern char **environ;

static int report_fd = -1;

static void fail(char stage, int err)
{
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%c:%d", stage, err);
    if (report_fd >= 0 && n > 0)
        (void)!write(report_fd, buf, (size_t)n);
    _exit(255);
}

/* A decimal number in [0, max]; -1 when *s is not one. */
static long number(const char *s, long max)
{
    char *end;
    long v;
    if (!*s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    return (errno || *end || v > max) ? -1 : v;
}

static void join_cgroup(const char *procs)
{
    char pid[24];
    int n = snprintf(pid, sizeof pid, "%ld", (long)getpid());
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        fail('C', errno);
    if (write(fd, pid, (size_t)n) != n)
        fail('C', errno ? errno : EIO);
    close(fd);
}

static void set_cpus(const char *list)
{
    long cpu, highest = 0;
    const char *p;
    char word[24];
    cpu_set_t *set;
    size_t size;

    for (p = list; *p;) {           /* the highest CPU sizes the mask */
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof word)
            fail('S', EINVAL);
        memcpy(word, p, n);
        word[n] = 0;
        if ((cpu = number(word, 1L << 20)) < 0)
            fail('S', EINVAL);
        if (cpu > highest)
            highest = cpu;
        p += n + (p[n] == ',');
    }
    set = CPU_ALLOC(highest + 1);
    if (!set)
        fail('A', ENOMEM);
    size = CPU_ALLOC_SIZE(highest + 1);
    CPU_ZERO_S(size, set);
    for (p = list; *p;) {
        size_t n = strcspn(p, ",");
        memcpy(word, p, n);
        word[n] = 0;
        CPU_SET_S((size_t)number(word, 1L << 20), size, set);
        p += n + (p[n] == ',');
    }
    if (sched_setaffinity(0, size, set) != 0)
        fail('A', errno);
    CPU_FREE(set);
}

static void set_identity(long uid, long gid, const char *groups)
{
    gid_t list[NGROUPS_MAX];
    size_t count = 0;
    const char *p;
    char word[24];

    if (strcmp(groups, "-") != 0) {
        for (p = groups; *p;) {
            size_t n = strcspn(p, ",");
            long g;
            if (n == 0 || n >= sizeof word || count >= NGROUPS_MAX)
                fail('S', EINVAL);
            memcpy(word, p, n);
            word[n] = 0;
            if ((g = number(word, (long)UINT_MAX - 1)) < 0)
                fail('S', EINVAL);
            list[count++] = (gid_t)g;
            p += n + (p[n] == ',');
        }
    }
    if (setgroups(count, list) != 0 || setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0 ||
        setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
        fail('U', errno);
}

static void run(char **argv)
{
    const char *path, *p;
    char full[PATH_MAX];
    int saved = ENOENT;

    if (strchr(argv[0], '/')) {
        execve(argv[0], argv, environ);
        fail('E', errno);
    }
    path = getenv("PATH");
    for (p = path ? path : "/usr/bin:/bin"; ; ) {
        size_t n = strcspn(p, ":");
        if (n + 1 + strlen(argv[0]) + 1 <= sizeof full) {
            if (n) {
                memcpy(full, p, n);
                full[n] = '/';
                strcpy(full + n + 1, argv[0]);
            } else {
                strcpy(full, argv[0]);
            }
            execve(full, argv, environ);
            if (errno != ENOENT && errno != ENOTDIR)
                saved = errno;  /* e.g. EACCES: reported unless found later */
        }
        if (!p[n])
            break;
        p += n + 1;
    }
    fail('E', saved);
}

int main(int argc, char **argv)
{
    const char *cgroups[MAX_CGROUPS], *cpus = NULL, *groups = "-";
    long uid = -1, gid = -1, fd;
    int ncg = 0, i;

    for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val || opt[0] != '-' || !opt[1] || opt[2])
            fail('S', EINVAL);
        switch (opt[1]) {
        case 'r':
            if ((fd = number(val, INT_MAX)) < 0)
                fail('S', EINVAL);
            report_fd = (int)fd;
            if (fcntl(report_fd, F_SETFD, FD_CLOEXEC) != 0)
                _exit(255);
            break;
        case 'c':
            if (ncg >= MAX_CGROUPS)
                fail('S', E2BIG);
            cgroups[ncg++] = val;
            break;
        case 'a': cpus = val; break;
        /* An identity that does not parse must never mean "stay root". */
        case 'u':
            if ((uid = number(val, (long)UINT_MAX - 1)) < 0)
                fail('S', EINVAL);
            break;
        case 'g':
            if ((gid = number(val, (long)UINT_MAX - 1)) < 0)
                fail('S', EINVAL);
            break;
        case 'G': groups = val; break;
        default: fail('S', EINVAL);
        }
    }
    if (i + 1 >= argc || (uid < 0) != (gid < 0))
        fail('S', EINVAL);
    for (int c = 0; c < ncg; c++)
        join_cgroup(cgroups[c]);
    if (cpus && *cpus)
        set_cpus(cpus);
    if (uid >= 0)
        set_identity(uid, gid, groups);
    run(argv + i + 1);
    return 255;
}
