/*
 * slurm-gpu SPANK plugin: the binding planner, and --gpu-numa-bind=prefer
 * without Python.
 *
 * This file is the only implementation of the planner (which GPUs a task
 * gets, its CPUs and NUMA nodes, SLURM_GPU_BINDING and the warning or
 * error when it cannot be bound): the outer half calls it for a plain
 * prefer step, and the Python path (every other bound step) calls it
 * through cffi in the inner half (slurm_gpu/binding.py).
 *
 * A bound step used to start an interpreter in slurmstepd (~8 ms) only to
 * read the node-fact cache, plan and make two system calls.  So the Python
 * path keeps a binding table beside its cache entry (slurm_gpu/spank/
 * bindtable.py), which this file reads for a plain prefer step, and applies
 * the plan as slurm_gpu/spank/remote.py does (sg_bind_task).
 *
 * The table is trusted as the cache entry is (slurm_gpu/nodefacts.py): a
 * directory that is ours (root's) and writable by nobody else, opened
 * without following a symlink; a regular file in it, ours, not group or
 * other writable, not a FIFO, at most SG_BIND_MAX bytes; its key, boot id
 * and every input's stat identity as they are now.  Anything else, and
 * anything this reader does not take, is "no table": the step goes to
 * Python, unchanged.
 *
 * No Slurm header here: the glue (sg_cbind.c) passes the step's values and
 * the system calls in, so the test harness and a cffi module can run it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sg_bind.h"

#define SG_BIND_HEADER "slurm-gpu bind 1"

/* ---- small growable things ---- */

static int sb_put(struct sg_str *s, const char *p, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        char *b;
        while (s->len + n + 1 > cap)
            cap *= 2;
        if (!(b = realloc(s->buf, cap)))
            return -1;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    s->buf[s->len] = 0;
    return 0;
}

static int sb_cat(struct sg_str *s, const char *p)
{
    return sb_put(s, p, strlen(p));
}

static int sb_int(struct sg_str *s, long long v)
{
    char b[32];
    snprintf(b, sizeof(b), "%lld", v);
    return sb_cat(s, b);
}

void sg_str_free(struct sg_str *s)
{
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
}

/* binding.cpulist of the set bits: "0-2,5" ("" when none) */
static int sb_cpulist(struct sg_str *s, const unsigned char *bits, int nbits)
{
    int i = 0, first = 1;
    while (i < nbits) {
        int j;
        if (!(bits[i / 8] >> (i % 8) & 1)) {
            i++;
            continue;
        }
        j = i;
        while (j + 1 < nbits && (bits[(j + 1) / 8] >> ((j + 1) % 8) & 1))
            j++;
        if ((!first && sb_cat(s, ",")) || sb_int(s, i))
            return -1;
        if (j > i && (sb_cat(s, "-") || sb_int(s, j)))
            return -1;
        first = 0;
        i = j + 1;
    }
    return 0;
}

/* binding._ints: "3,1,1" in the given order */
static int sb_ints(struct sg_str *s, const long long *v, int n)
{
    int i;
    for (i = 0; i < n; i++)
        if ((i && sb_cat(s, ",")) || sb_int(s, v[i]))
            return -1;
    return 0;
}

#define BIT_SET(b, i) ((b)[(i) / 8] |= (unsigned char) (1u << ((i) % 8)))
#define BIT_ON(b, i) ((b)[(i) / 8] >> ((i) % 8) & 1)
#define NBYTES SG_BIND_NBYTES

/* ---- the table ---- */

void sg_table_free(struct sg_table *t)
{
    free(t->ranges);
    free(t->gpus);
    memset(t, 0, sizeof(*t));
}

/* One list "0-3,8" (sorted, ascending, as binding.cpulist writes it) or
 * "-" (empty) into t->ranges, kept as ranges (a table of a few hundred bytes
 * can name 65536 CPUs per GPU); -1 on anything else. */
static int parse_ids(struct sg_table *t, const char *p, int *off, int *n)
{
    long prev = -1;
    *off = t->nranges;
    *n = 0;
    if (strcmp(p, "-") == 0)
        return 0;
    while (*p) {
        long lo = 0, hi;
        int d = 0;
        while (*p >= '0' && *p <= '9' && d < 6) {
            lo = lo * 10 + (*p++ - '0');
            d++;
        }
        if (!d)
            return -1;
        hi = lo;
        if (*p == '-') {
            p++;
            hi = 0;
            d = 0;
            while (*p >= '0' && *p <= '9' && d < 6) {
                hi = hi * 10 + (*p++ - '0');
                d++;
            }
            if (!d || hi < lo)
                return -1;
        }
        if (*p == ',' && p[1])
            p++;
        else if (*p)
            return -1;              /* another character, or a trailing comma */
        if (lo <= prev || hi > SG_BIND_MAXID || t->nranges >= t->maxranges)
            return -1;
        t->ranges[t->nranges].lo = (int) lo;
        t->ranges[t->nranges++].hi = (int) hi;
        prev = hi;
    }
    *n = t->nranges - *off;
    return 0;
}

/* Digits only, at most 19 (no strtoull: glibc >= 2.38 binds it to a
 * symbol older glibcs lack, and a plugin built in a newer Debian root must
 * still load, and say which Slurm it is for, on an older host). */
static int parse_u64(const char *p, unsigned long long *v)
{
    int n = 0;
    *v = 0;
    for (; *p; p++, n++) {
        if (*p < '0' || *p > '9' || n >= 19)
            return -1;
        *v = *v * 10 + (unsigned long long) (*p - '0');
    }
    return n ? 0 : -1;
}

/* "stamp <mtime_ns> <size> <ino> <path>": the input is as it was stamped
 * (nodefacts.stamp: stat() following links; "-": it did not exist). */
static int stamp_holds(char *rest)
{
    char *f[3], *path = rest;
    unsigned long long v[3];
    struct stat st;
    int i, absent;
    for (i = 0; i < 3; i++) {
        char *sp = strchr(path, ' ');
        if (!sp)
            return 0;
        *sp = 0;
        f[i] = path;
        path = sp + 1;
    }
    if (!*path || path[0] == ' ')
        return 0;
    absent = strcmp(f[0], "-") == 0;
    if (absent)
        return strcmp(f[1], "-") == 0 && strcmp(f[2], "-") == 0 && stat(path, &st) != 0;
    for (i = 0; i < 3; i++)
        if (parse_u64(f[i], &v[i]))
            return 0;
    if (stat(path, &st) != 0)
        return 0;
    return (unsigned long long) st.st_mtim.tv_sec * 1000000000ULL
               + (unsigned long long) st.st_mtim.tv_nsec == v[0]
        && (unsigned long long) st.st_size == v[1] && (unsigned long long) st.st_ino == v[2];
}

static int read_boot_id(char *out, size_t size)
{
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    ssize_t n;
    if (fd < 0)
        return -1;
    n = read(fd, out, size - 1);
    close(fd);
    if (n <= 0)
        return -1;
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' ' || out[n - 1] == '\t'))
        n--;
    out[n] = 0;
    return n > 0 ? 0 : -1;
}

/* Read the whole file (bounded), checked as nodefacts.load checks the entry. */
static char *read_trusted(const char *dir, const char *name, size_t *size)
{
    struct stat st;
    char *buf = NULL;
    size_t got = 0;
    int dfd, fd = -1;
    uid_t me = geteuid();
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return NULL;
    if (fstat(dfd, &st) || st.st_uid != me || (st.st_mode & 022))
        goto out;
    fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != me
        || (st.st_mode & 022) || st.st_size <= 0 || st.st_size > SG_BIND_MAX)
        goto out;
    if (!(buf = malloc((size_t) st.st_size + 1)))
        goto out;
    while (got < (size_t) st.st_size + 1) {
        ssize_t n = read(fd, buf + got, (size_t) st.st_size + 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t) n;
    }
    if (got != (size_t) st.st_size) {       /* changed under us */
        free(buf);
        buf = NULL;
        goto out;
    }
    buf[got] = 0;
    *size = got;
out:
    if (fd >= 0)
        close(fd);
    close(dfd);
    return buf;
}

/* The table's text (cut up in place).  key NULL: its rows only (map, gpu,
 * missing, end), as the Python path hands them over (sg_table_rows). */
static int parse_table(struct sg_table *t, char *buf, size_t size, const char *key,
                       const char *boot)
{
    char *line, *next;
    int state = key ? 0 : 3, ended = 0, ok = 0;
    memset(t, 0, sizeof(*t));
    if (strlen(buf) != size)
        goto out;                    /* a NUL inside */
    /* Sized from the file, not its limits: every range takes at least two
     * of its bytes (a digit and what ends it), every GPU a line. */
    {
        size_t lines = 0, k;
        for (k = 0; k < size; k++)
            lines += buf[k] == '\n';
        t->maxgpus = lines < SG_BIND_MAXGPUS ? (int) lines : SG_BIND_MAXGPUS;
        t->maxranges = (int) (size / 2 + 1);
    }
    t->ranges = malloc(sizeof(*t->ranges) * (size_t) t->maxranges);
    t->gpus = calloc((size_t) t->maxgpus + 1, sizeof(*t->gpus));
    if (!t->ranges || !t->gpus)
        goto out;
    for (line = buf; line && *line; line = next) {
        char *nl = strchr(line, '\n');
        if (!nl || ended)
            goto out;                /* every line ends; nothing after "end" */
        *nl = 0;
        next = nl + 1;
        if (state == 0) {
            if (strcmp(line, SG_BIND_HEADER))
                goto out;
            state = 1;
        } else if (state == 1) {
            if (strncmp(line, "key ", 4) || strcmp(line + 4, key))
                goto out;
            state = 2;
        } else if (state == 2) {
            if (strncmp(line, "boot ", 5) || strcmp(line + 5, boot))
                goto out;
            state = 3;
        } else if (strncmp(line, "stamp ", 6) == 0 && state == 3 && key) {
            if (!stamp_holds(line + 6))
                goto out;
        } else if (strncmp(line, "map ", 4) == 0 && state <= 4) {
            unsigned long long m, h;
            char *sp = strchr(line + 4, ' ');
            if (!sp || t->nmap >= SG_BIND_MAXMAP)
                goto out;
            *sp = 0;
            if (parse_u64(line + 4, &m) || parse_u64(sp + 1, &h) || m > SG_BIND_MAXID
                || h > SG_BIND_MAXID || (t->nmap && (int) m <= t->map_from[t->nmap - 1]))
                goto out;
            t->map_from[t->nmap] = (int) m;
            t->map_to[t->nmap++] = (int) h;
            state = 4;
        } else if (strcmp(line, "missing") == 0 || strncmp(line, "gpu ", 4) == 0) {
            struct sg_gpu *g;
            if (t->ngpus >= t->maxgpus)
                goto out;
            g = &t->gpus[t->ngpus++];
            state = 5;
            if (line[0] == 'm') {
                g->missing = 1;
                continue;
            } else {
                char *f[4], *p = line + 4;
                unsigned long long idx;
                int i;
                for (i = 0; i < 4; i++) {
                    char *sp = strchr(p, ' ');
                    f[i] = p;
                    if (i < 3) {
                        if (!sp)
                            goto out;
                        *sp = 0;
                        p = sp + 1;
                    } else if (sp) {
                        goto out;
                    }
                }
                if (parse_u64(f[0], &idx) || idx > 0x7fffffff || strlen(f[1]) >= sizeof(g->uuid)
                    || !*f[1] || parse_ids(t, f[2], &g->cpus, &g->ncpus)
                    || parse_ids(t, f[3], &g->mems, &g->nmems))
                    goto out;
                g->index = (long long) idx;
                if (strcmp(f[1], "-"))
                    strcpy(g->uuid, f[1]);
            }
        } else if (strcmp(line, "end") == 0 && state >= 3) {
            ended = 1;
        } else {
            goto out;
        }
    }
    ok = ended;
out:
    if (!ok) {
        sg_table_free(t);
        return -1;
    }
    return 0;
}

int sg_table_load(struct sg_table *t, const char *dir, const char *name, const char *key)
{
    char *buf, boot[64];
    size_t size = 0;
    int rc;
    memset(t, 0, sizeof(*t));
    if (read_boot_id(boot, sizeof(boot)))
        return -1;                   /* an unknown boot id could be any boot */
    if (!(buf = read_trusted(dir, name, &size)))
        return -1;
    rc = parse_table(t, buf, size, key, boot);
    free(buf);
    return rc;
}

int sg_table_rows(struct sg_table *t, const char *text)
{
    size_t size = strlen(text);
    char *buf = malloc(size + 1);
    int rc;
    memset(t, 0, sizeof(*t));
    if (!buf)
        return -1;
    memcpy(buf, text, size + 1);
    rc = parse_table(t, buf, size, NULL, NULL);
    free(buf);
    return rc;
}

/* ---- the planner: which GPUs a task gets and where it is bound ----
 *
 * The one implementation of the rules in slurm_gpu/binding.py's docstring;
 * the Python path calls it through cffi (the plugin's inner half).  A task's
 * variables are read as whatever bytes the job's environment holds (UTF-8
 * where they are text), of any length: lists are cut at ',', each entry
 * stripped of Unicode white space (the set of Python's str.strip(), which
 * these rules were first written with), and a number is ASCII digits of any
 * size. */

#define SG_MAX_GPU_IDS 4096      /* a longer number list is not a GPU list */
#define SG_HUGE LLONG_MAX        /* 19 digits or more: above any GPU index */

/* The length of the white space character that starts at p, else 0 */
static int space_at(const unsigned char *p, const unsigned char *end)
{
    size_t n = (size_t) (end - p);
    if (n >= 1 && ((*p >= '\t' && *p <= '\r') || (*p >= 0x1c && *p <= 0x20)))
        return 1;
    if (n >= 2 && p[0] == 0xc2 && (p[1] == 0x85 || p[1] == 0xa0))
        return 2;                                   /* U+0085, U+00A0 */
    if (n >= 3 && ((p[0] == 0xe1 && p[1] == 0x9a && p[2] == 0x80)            /* U+1680 */
                   || (p[0] == 0xe2 && p[1] == 0x80
                       && ((p[2] >= 0x80 && p[2] <= 0x8a) || p[2] == 0xa8 || p[2] == 0xa9 || p[2] == 0xaf))
                   || (p[0] == 0xe2 && p[1] == 0x81 && p[2] == 0x9f)         /* U+205F */
                   || (p[0] == 0xe3 && p[1] == 0x80 && p[2] == 0x80)))       /* U+3000 */
        return 3;                                   /* and U+2000-200A, 2028, 2029, 202F */
    return 0;
}

/* [*a, *b) without white space at either end.  A character's bytes never
 * occur inside another's (UTF-8), so matching from the end is exact. */
static void strip(const char **a, const char **b)
{
    const unsigned char *p = (const unsigned char *) *a, *q = (const unsigned char *) *b;
    int k;
    while (p < q && (k = space_at(p, q)))
        p += k;
    for (k = 1; k <= 3 && q > p;)
        if (q - p >= k && space_at(q - k, q) == k) {
            q -= k;
            k = 1;
        } else {
            k++;
        }
    *a = (const char *) p;
    *b = (const char *) q;
}

static int all_digits(const char *a, const char *b)
{
    if (a >= b)
        return 0;
    for (; a < b; a++)
        if (*a < '0' || *a > '9')
            return 0;
    return 1;
}

/* Digits [a, b) without leading zeros (one "0" stays) */
static const char *significant(const char *a, const char *b)
{
    while (b - a > 1 && *a == '0')
        a++;
    return a;
}

/* The number the digits [a, b) write; SG_HUGE from 19 digits on.  Only
 * equality among such numbers is lost, and it decides nothing: every one of
 * them is dropped as no GPU of the node, whichever list it is in. */
static long long number(const char *a, const char *b)
{
    long long v = 0;
    a = significant(a, b);
    if (b - a > 18)
        return SG_HUGE;
    for (; a < b; a++)
        v = v * 10 + (*a - '0');
    return v;
}

/* last - first of two digit strings: -1 when negative, else the difference
 * up to SG_MAX_GPU_IDS (which stands for that much or more) */
static long long span(const char *fa, const char *fb, const char *la, const char *lb)
{
    long long d, low = 0, mul = 1;
    size_t nf, nl, i;
    int borrow = 0, high = 0, c;
    fa = significant(fa, fb);
    la = significant(la, lb);
    nf = (size_t) (fb - fa);
    nl = (size_t) (lb - la);
    if (nf <= 18 && nl <= 18) {
        d = number(la, lb) - number(fa, fb);
        return d < 0 ? -1 : d < SG_MAX_GPU_IDS ? d : SG_MAX_GPU_IDS;
    }
    c = nl != nf ? (nl < nf ? -1 : 1) : memcmp(la, fa, nl);
    if (c <= 0)
        return c < 0 ? -1 : 0;
    for (i = 0; i < nl; i++) {          /* subtract, from the last digit */
        int d1 = la[nl - 1 - i] - '0', d2 = i < nf ? fa[nf - 1 - i] - '0' : 0;
        int dd = d1 - d2 - borrow;
        borrow = dd < 0;
        dd += borrow ? 10 : 0;
        if (i < 4) {
            low += dd * mul;
            mul *= 10;
        } else if (dd) {
            high = 1;
        }
    }
    return high || low >= SG_MAX_GPU_IDS ? SG_MAX_GPU_IDS : low;
}

/* A GPU number list "0,1,3" or "0-2,5": its numbers in order into out
 * (room for SG_MAX_GPU_IDS), and how many; 0 when text is none (empty,
 * another character, a range too long) */
static int int_list(const char *text, long long *out)
{
    int n = 0;
    const char *p = text;
    if (!text || !*text)
        return 0;
    for (;;) {
        const char *end = strchr(p, ','), *a = p, *b, *dash;
        long long first, d, k;
        if (!end)
            end = p + strlen(p);
        b = end;
        strip(&a, &b);
        dash = memchr(a, '-', (size_t) (b - a));
        if (!all_digits(a, dash ? dash : b) || (dash && !all_digits(dash + 1, b)))
            return 0;
        first = number(a, dash ? dash : b);
        d = dash ? span(a, dash, dash + 1, b) : 0;
        if (d + n >= SG_MAX_GPU_IDS)
            return 0;
        for (k = 0; k <= d; k++)
            out[n++] = first == SG_HUGE ? SG_HUGE : first + k;
        if (!*end)
            break;
        p = end + 1;
    }
    return n;
}

/* SLURM_GPUS_PER_TASK "2" or "h100:2" (its first entry): N, 0 for none.
 * Capped: only min(N, len) and N mod len (*mod) matter. */
static long long per_task(const char *text, int len, long long *mod)
{
    const char *a, *b, *colon;
    long long v = 0, m = 0;
    if (!text || !*text)
        return 0;
    b = strchr(text, ',');
    if (!b)
        b = text + strlen(text);
    a = text;
    for (colon = a; colon < b; colon++)
        if (*colon == ':')
            a = colon + 1;
    strip(&a, &b);
    if (!all_digits(a, b))
        return 0;
    for (; a < b; a++) {
        v = v > 1000000000LL ? v : v * 10 + (*a - '0');
        m = (m * 10 + (*a - '0')) % len;
    }
    if (v == 0)
        return 0;
    *mod = m;
    return v;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *) a, y = *(const long long *) b;
    return (x > y) - (x < y);
}

/* sorted(a) == sorted(b); -1 out of memory */
static int same_multiset(const long long *a, int na, const long long *b, int nb)
{
    long long *x, *y;
    int eq;
    if (na != nb)
        return 0;
    if (!na)
        return 1;
    x = malloc(sizeof(*x) * na);
    y = malloc(sizeof(*y) * nb);
    if (!x || !y) {
        free(x);
        free(y);
        return -1;
    }
    memcpy(x, a, sizeof(*x) * na);
    memcpy(y, b, sizeof(*y) * nb);
    qsort(x, na, sizeof(*x), cmp_ll);
    qsort(y, nb, sizeof(*y), cmp_ll);
    eq = memcmp(x, y, sizeof(*x) * na) == 0;
    free(x);
    free(y);
    return eq;
}

static int in_list(long long v, const long long *l, int n)
{
    int i;
    for (i = 0; i < n; i++)
        if (l[i] == v)
            return 1;
    return 0;
}

/* The step's GPUs (the step's variable; a user's CUDA_VISIBLE_DEVICES alone
 * binds nothing) narrowed by the task's CUDA_VISIBLE_DEVICES (uuids, global
 * or step-local indices), handed out per task like --gpu-bind=per_task:N
 * when every task sees them all: the task's GPUs as Slurm indices (table
 * positions) into *ids, and how many; -1 out of memory. */
static int task_gpus(const struct sg_table *t, const struct sg_task_in *in, long long **ids_out)
{
    int nstep, ncvd = 0, n = 0, i, k, full, entries = 1;
    const char *cvd_text = in->cvd ? in->cvd : "", *c;
    long long *step, *cvd, *ids;
    for (c = cvd_text; *c && entries <= SG_MAX_GPU_IDS; c++)
        entries += *c == ',';
    step = malloc(sizeof(*step) * SG_MAX_GPU_IDS);
    cvd = malloc(sizeof(*cvd) * SG_MAX_GPU_IDS);
    ids = *ids_out = malloc(sizeof(*ids) * SG_MAX_GPU_IDS);
    if (!step || !cvd || !ids) {
        n = -1;
        goto out;
    }
    nstep = int_list(in->step_gpus, step);
    if (nstep == 0)
        goto out;
    if (*cvd_text)
        ncvd = int_list(cvd_text, cvd);
    if (ncvd == 0 && *cvd_text && strncmp(cvd_text, "MIG-", 4) != 0
        && entries <= SG_MAX_GPU_IDS) {
        /* uuids: each entry as it is, the last GPU of a uuid wins (a dict);
         * a uuid of a GPU outside the step counts as unknown, as a number
         * outside it does (or the task would be bound to another GPU's CPUs
         * and memory, and SLURM_GPU_BINDING name it); a list of
         * more than SG_MAX_GPU_IDS entries is no GPU list, as a number list is
         * not (each entry is matched against the whole table) */
        const char *p = cvd_text;
        for (;;) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t) (end - p) : strlen(p);
            int found = -1;
            for (k = 0; k < t->ngpus; k++)
                if (!t->gpus[k].missing && t->gpus[k].uuid[0]
                    && strlen(t->gpus[k].uuid) == len && strncmp(t->gpus[k].uuid, p, len) == 0)
                    found = k;
            if (found >= 0 && in_list(found, step, nstep))
                ids[n++] = found;
            if (!end)
                break;
            p = end + 1;
        }
        if (n)
            goto out;
    }
    if (ncvd == 0) {
        memcpy(ids, step, sizeof(*ids) * nstep);
        n = nstep;
    } else {
        int subset = 1, local = 1;
        for (i = 0; i < ncvd; i++) {
            subset &= in_list(cvd[i], step, nstep);
            local &= cvd[i] < nstep;
        }
        n = 0;
        for (i = 0; i < ncvd; i++) {
            if (subset)
                ids[n++] = cvd[i];                  /* global indices (no device cgroup) */
            else if (local)
                ids[n++] = step[cvd[i]];            /* local to the step (ConstrainDevices) */
            else if (in_list(cvd[i], step, nstep))
                ids[n++] = cvd[i];
        }
    }
    for (i = k = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->ngpus)
            ids[k++] = ids[i];
    n = k;
    full = same_multiset(ids, n, step, nstep);
    if (full < 0) {
        n = -1;
    } else if (full && in->ntasks > 1 && n > 1) {
        long long mod = 0, per = per_task(in->per_task, n, &mod), take, first;
        memcpy(cvd, ids, sizeof(*ids) * n);         /* n <= SG_MAX_GPU_IDS here */
        if (per == 0) {
            per = n / (long long) in->ntasks;
            if (per < 1)
                per = 1;
            mod = per % n;
        }
        take = per < n ? per : n;
        /* task i takes the N starting at i*N, wrapping (never negative) */
        first = (((long long) in->task % n) + n) % n;
        for (k = 0; k < take; k++)
            ids[k] = cvd[(first * mod + k) % n];
        n = (int) take;
    }
out:
    free(step);
    free(cvd);
    return n;
}

static int map_node(const struct sg_table *t, int m)
{
    int i;
    for (i = 0; i < t->nmap; i++)
        if (t->map_from[i] == m)
            return t->map_to[i];
    return m;
}

static void bits_of(const struct sg_table *t, const long long *ids, int n, int which,
                    unsigned char *bits)
{
    int i, k;
    memset(bits, 0, NBYTES);
    for (i = 0; i < n; i++) {
        const struct sg_gpu *g = &t->gpus[ids[i]];
        int off = which ? g->mems : g->cpus, cnt = which ? g->nmems : g->ncpus;
        if (g->missing)
            continue;
        for (k = 0; k < cnt; k++) {
            int m;
            for (m = t->ranges[off + k].lo; m <= t->ranges[off + k].hi; m++)
                BIT_SET(bits, m);
        }
    }
}

static int any_bit(const unsigned char *b)
{
    int i;
    for (i = 0; i < NBYTES; i++)
        if (b[i])
            return 1;
    return 0;
}

/* One plan's scratch, on the heap: nothing of a call outlives it. */
struct sg_work {
    unsigned char local[NBYTES], mems[NBYTES], cpus[NBYTES], bound[NBYTES], host[NBYTES];
};

static const char *mode_name(int mode)
{
    return mode == SG_MODE_STRICT ? "strict" : mode == SG_MODE_PREFER ? "prefer" : "off";
}

int sg_plan(const struct sg_table *t, const struct sg_task_in *in, struct sg_plan *out)
{
    struct sg_work *w = calloc(1, sizeof(*w));
    long long *ids = NULL, *model = NULL, *missing = NULL;
    unsigned char *local, *mems, *cpus, *bound;
    int n, i, nmodel = 0, nmissing = 0, m;
    struct sg_str problem = { 0 };
    memset(out, 0, sizeof(*out));
    if (!w || in->mode < SG_MODE_OFF || in->mode > SG_MODE_STRICT)
        goto oom;
    local = w->local, mems = w->mems, cpus = w->cpus, bound = w->bound;
    n = task_gpus(t, in, &ids);
    if (n < 0)
        goto oom;
    model = malloc(sizeof(*model) * (size_t) (n + 1));
    missing = malloc(sizeof(*missing) * (size_t) (n + 1));
    if (!model || !missing)
        goto oom;
    for (i = 0; i < n; i++) {
        if ((i && sb_cat(&out->slots, ",")) || sb_int(&out->slots, ids[i]))
            goto oom;
        if (t->gpus[ids[i]].missing)
            missing[nmissing++] = ids[i];
        else
            model[nmodel++] = t->gpus[ids[i]].index;
    }
    if (n > 0 && in->mode != SG_MODE_OFF) {
        bits_of(t, ids, n, 0, local);
        bits_of(t, ids, n, 1, mems);
        if (nmissing) {
            /* gres.conf names a device NVML does not have: its locality is
             * unknown, and borrowing a neighbour's would bind to another GPU */
            if (sb_cat(&problem, "Slurm GPU ") || sb_ints(&problem, missing, nmissing)
                || sb_cat(&problem, " is not a GPU of this node (gres.conf and NVML disagree)"))
                goto oom;
        } else if (!any_bit(local) || !any_bit(mems)) {
            if (sb_cat(&problem, "GPU ") || sb_ints(&problem, model, nmodel)
                || sb_cat(&problem, " has no known NUMA node in the node model"))
                goto oom;
        } else {
            int any = 0;
            for (i = 0; i < NBYTES; i++) {      /* Slurm's binding is only narrowed */
                cpus[i] = local[i] & in->allowed[i];
                any |= cpus[i];
            }
            if (!any) {
                if (sb_cat(&problem, "GPU ") || sb_ints(&problem, model, nmodel)
                    || sb_cat(&problem, " is local to CPUs ")
                    || sb_cpulist(&problem, local, SG_BIND_MAXID + 1)
                    || sb_cat(&problem, " (NUMA ") || sb_cpulist(&problem, mems, SG_BIND_MAXID + 1)
                    || sb_cat(&problem, ") but task ") || sb_int(&problem, in->task)
                    || sb_cat(&problem, " may only use CPUs ")
                    || (any_bit(in->allowed) ? sb_cpulist(&problem, in->allowed, SG_BIND_MAXID + 1)
                                             : sb_cat(&problem, "none")))
                    goto oom;
            } else if (in->bound_host) {
                /* --mem-bind put an MPOL_BIND policy in place: the model nodes
                 * of every GPU of the node whose host node it holds; our
                 * policy narrows it, never replaces it with other nodes */
                int hit = 0;
                for (i = 0; i < t->ngpus; i++) {
                    const struct sg_gpu *g = &t->gpus[i];
                    int k;
                    if (g->missing)
                        continue;
                    for (k = 0; k < g->nmems; k++) {
                        int mm;
                        for (mm = t->ranges[g->mems + k].lo; mm <= t->ranges[g->mems + k].hi;
                             mm++) {
                            int h = map_node(t, mm);
                            if (h < SG_BIND_HOSTBITS && BIT_ON(in->bound_host, h))
                                BIT_SET(bound, mm);
                        }
                    }
                }
                for (i = 0; i < NBYTES; i++)
                    hit |= bound[i] & mems[i];
                if (!hit) {
                    if (sb_cat(&problem, "GPU ") || sb_ints(&problem, model, nmodel)
                        || sb_cat(&problem, " is local to NUMA ")
                        || sb_cpulist(&problem, mems, SG_BIND_MAXID + 1)
                        || sb_cat(&problem, " but Slurm bound the memory of task ")
                        || sb_int(&problem, in->task) || sb_cat(&problem, " to NUMA ")
                        || (any_bit(bound) ? sb_cpulist(&problem, bound, SG_BIND_MAXID + 1)
                                           : sb_cat(&problem, "none")))
                        goto oom;
                } else {
                    for (i = 0; i < NBYTES; i++)
                        mems[i] &= bound[i];
                }
            }
        }
        out->applied = problem.buf == NULL;
    }
    /* SLURM_GPU_BINDING: "strict;gpus=0;cpus=0-3;mems=0", or "...;none" */
    if (sb_cat(&out->env, mode_name(in->mode)) || sb_cat(&out->env, ";gpus=")
        || sb_ints(&out->env, model, nmodel))
        goto oom;
    if (!out->applied) {
        if (sb_cat(&out->env, ";none"))
            goto oom;
    } else {
        memcpy(out->cpus, cpus, NBYTES);
        for (m = 0; m <= SG_BIND_MAXID; m++)
            if (BIT_ON(mems, m))
                BIT_SET(w->host, map_node(t, m));  /* [spank] numa_node_map */
        /* MPOL_PREFERRED honours one node: the first host node */
        for (out->host_node = 0; !BIT_ON(w->host, out->host_node); out->host_node++)
            ;
        if (sb_cat(&out->env, ";cpus=") || sb_cpulist(&out->env, cpus, SG_BIND_MAXID + 1)
            || sb_cat(&out->env, ";mems=") || sb_cpulist(&out->env, mems, SG_BIND_MAXID + 1)
            || sb_cpulist(&out->cpus_text, cpus, SG_BIND_MAXID + 1)
            || sb_cpulist(&out->mems_text, mems, SG_BIND_MAXID + 1)
            || sb_cpulist(&out->host_text, w->host, SG_BIND_MAXID + 1))
            goto oom;
    }
    if (problem.buf) {
        out->failed = in->mode == SG_MODE_STRICT;
        if (sb_cat(&out->message, out->failed ? "gpu-numa-bind=strict impossible: "
                                              : "gpu-numa-bind=prefer not applied: ")
            || sb_cat(&out->message, problem.buf))
            goto oom;
    }
    sg_str_free(&problem);
    free(w);
    free(ids);
    free(model);
    free(missing);
    return 0;
oom:
    free(w);
    free(ids);
    free(model);
    free(missing);
    sg_str_free(&problem);
    sg_plan_free(out);
    return -1;
}

void sg_plan_free(struct sg_plan *p)
{
    sg_str_free(&p->env);
    sg_str_free(&p->message);
    sg_str_free(&p->slots);
    sg_str_free(&p->cpus_text);
    sg_str_free(&p->mems_text);
    sg_str_free(&p->host_text);
}

/* ---- the table's name: nodefacts.cache_file + ".bind" ---- */

static uint32_t crc32_of(const char *s)
{
    uint32_t c = 0xffffffffu;
    int k;
    for (; *s; s++) {
        c ^= (unsigned char) *s;
        for (k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

int sg_table_name(const char *prefix, const char *node, const char *config, const char *gres,
                  char *key, size_t keysize, char *name, size_t namesize)
{
    size_t i, n = strlen(node);
    const char *c;
    if (!*node)
        return -1;
    for (c = node; *c; c++)
        if ((unsigned char) *c < 0x20 || (unsigned char) *c > 0x7e)
            return -1;                 /* Python names those by code point */
    if ((size_t) snprintf(key, keysize, "%s:%s:%s:%s", prefix, node, config, gres) >= keysize
        || n + 1 + 8 + sizeof(".bind") > namesize)
        return -1;
    for (i = 0; i < n; i++) {
        char ch = node[i];
        int ok = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
                 || ch == '-' || ch == '_' || ch == '.';
        name[i] = ok ? ch : '_';
    }
    snprintf(name + n, namesize - n, "-%08x.bind", crc32_of(key));
    return 0;
}

/* ---- applying it, for the C path (the Python path applies with effects.py) ---- */

#define SG_MPOL_PREFERRED 1
#define SG_MPOL_BIND      2

static void say_warning(const struct sg_ops *ops, const char *warning, int task)
{
    struct sg_str s = { 0 };
    if (sb_cat(&s, "slurm-gpu: warning: ") || sb_cat(&s, warning) || sb_cat(&s, " (task ")
        || sb_int(&s, task) || sb_cat(&s, ")\n"))
        ops->say("slurm-gpu: warning: out of memory\n");
    else
        ops->say(s.buf);
    sg_str_free(&s);
}

/* A task the C half does not bind still gets SLURM_GPU_BINDING, saying so:
 * an inherited value (a bound batch step running srun) must never claim a
 * binding this task does not have.  Python always sets it too. */
static void refuse_task(const struct sg_ops *ops, const char *warning, int task)
{
    ops->setenv(ops->ctx, "SLURM_GPU_BINDING", "prefer;gpus=;none");
    say_warning(ops, warning, task);
}

/* SlurmGpuError.line(): line breaks shown escaped */
static void say_error(const struct sg_ops *ops, const char *text)
{
    struct sg_str s = { 0 };
    const char *p;
    for (p = text; *p; p++) {
        const char *r = *p == '\n' ? "\\n" : *p == '\r' ? "\\r" : NULL;
        if (r ? sb_cat(&s, r) : sb_put(&s, p, 1)) {
            sg_str_free(&s);
            ops->error("slurm-gpu: out of memory");
            return;
        }
    }
    ops->error(s.buf);
    sg_str_free(&s);
}

int sg_bind_task(const struct sg_table *t, struct sg_task_in *in, const struct sg_ops *ops)
{
    unsigned char allowed[SG_BIND_NBYTES], host[SG_BIND_HOSTBITS / 8];
    struct sg_plan plan;
    struct sg_str warning = { 0 }, msg = { 0 };
    int mode, err, rc = -1;

    /* effects.allowed_cpus and the policy remote.task_init reads */
    memset(allowed, 0, sizeof(allowed));
    if (ops->getaffinity(allowed)) {
        refuse_task(ops, "gpu-numa-bind=prefer not applied: cannot read the task's CPUs",
                    in->task);
        return 0;
    }
    in->allowed = allowed;
    in->mode = SG_MODE_PREFER;
    memset(host, 0, sizeof(host));
    in->bound_host = (ops->get_mempolicy(&mode, host) == 0 && (mode & 0xff) == SG_MPOL_BIND)
        ? host : NULL;
    if (sg_plan(t, in, &plan)) {
        refuse_task(ops, "gpu-numa-bind=prefer not applied: out of memory", in->task);
        return 0;
    }
    if (plan.message.buf && sb_cat(&warning, plan.message.buf))
        goto oom;
    if (plan.applied) {
        if ((err = ops->setaffinity(plan.cpus))) {
            if (sb_cat(&msg, "slurm-gpu: sched_setaffinity to CPUs ")
                || sb_cat(&msg, plan.cpus_text.buf) || sb_cat(&msg, " failed: ")
                || sb_cat(&msg, strerror(err)))
                goto oom;
            say_error(ops, msg.buf);
            goto out;
        }
        {
            /* effects.nodemask: one bit per node, maxnode = words * bits + 1 */
            const int bits = (int) (sizeof(unsigned long) * 8);
            int words = plan.host_node / bits + 1;
            unsigned long mask[SG_BIND_MAXID / (sizeof(unsigned long) * 8) + 1];
            memset(mask, 0, sizeof(mask));
            mask[plan.host_node / bits] |= 1UL << (plan.host_node % bits);
            if ((err = ops->set_mempolicy(SG_MPOL_PREFERRED, mask,
                                          (unsigned long) words * bits + 1))) {
                sg_str_free(&warning);
                if (sb_cat(&warning, "gpu-numa-bind=prefer: memory policy not set: "
                                     "set_mempolicy to NUMA node(s) ")
                    || sb_int(&warning, plan.host_node) || sb_cat(&warning, " failed: ")
                    || sb_cat(&warning, strerror(err)))
                    goto oom;
            }
        }
    }
    if (ops->setenv(ops->ctx, "SLURM_GPU_BINDING", plan.env.buf)) {
        if (sb_cat(&msg, "slurm-gpu: spank_setenv SLURM_GPU_BINDING failed: ")
            || sb_cat(&msg, ops->setenv_error(ops->ctx)))
            goto oom;
        say_error(ops, msg.buf);
        goto out;
    }
    if (warning.buf)
        say_warning(ops, warning.buf, in->task);
    rc = 0;
    goto out;
oom:
    ops->error("slurm-gpu: out of memory binding the task");
out:
    sg_str_free(&warning);
    sg_str_free(&msg);
    sg_plan_free(&plan);
    return rc;
}
