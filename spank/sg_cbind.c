/*
 * slurm-gpu SPANK plugin, outer half: --gpu-numa-bind=prefer in slurmstepd
 * without Python.  The glue between Slurm and sg_bind.c (which has no Slurm
 * header, so the test harness can run it): which steps qualify, the table
 * read as root in init_post_opt, and each task's binding with the real
 * system calls.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "sg_plugin.h"
#include "sg_bind.h"

static struct sg_table sg_table;    /* this step's table, read as root */

/* A job variable's value, as the Python side's Spank.getenv reads it
 * (buffers up to 1 MiB); NULL when unset (*unset), too long or out of
 * memory, which that getenv also answers None.  The caller frees it. */
static char *sg_getenv_dup(spank_t sp, const char *name, int *unset)
{
    int size;
    *unset = 0;
    for (size = 4096;; size *= 4) {
        char *buf = malloc(size);
        spank_err_t rc;
        if (!buf)
            return NULL;
        rc = spank_getenv(sp, name, buf, size);
        if (rc == ESPANK_SUCCESS)
            return buf;
        free(buf);
        if (rc != ESPANK_NOSPACE) {
            *unset = 1;
            return NULL;
        }
        if (size >= 1 << 20)
            return NULL;
    }
}

/* A variable the task can read: unset, or a value of at most 1 MiB (a longer
 * one Python's Spank.getenv reads as unset, and its init_post_opt binds
 * nothing at all). */
static int sg_readable_var(spank_t sp, const char *name)
{
    int unset, ok;
    char *v = sg_getenv_dup(sp, name, &unset);
    ok = v != NULL || unset;
    free(v);
    return ok;
}

/* The step's only Python work would be plain prefer binding: mode prefer
 * without verbose (the user's exact "prefer", else the admin's exact
 * default), no other option, a known step id, and its GPU variables
 * readable. */
int sg_cbind_eligible(spank_t sp)
{
    const char *user = sg_values[SG_OPT_NUMA_BIND];
    const char *prof = sg_values[SG_OPT_PROFILE], *var;
    if (sg_values[SG_OPT_MPS] || sg_values[SG_OPT_MIG] || (prof && strcmp(prof, "none")))
        return 0;
    if (user ? strcmp(user, "prefer")
             : (strcmp(sg_args.numa_mode, "prefer") || sg_args.numa_verbose))
        return 0;
    if (!(var = sg_gpu_var(sp)))
        return 0;
    return sg_readable_var(sp, var) && sg_readable_var(sp, "CUDA_VISIBLE_DEVICES")
        && sg_readable_var(sp, "SLURM_GPUS_PER_TASK");
}

/* nodefacts.gres_conf_path of slurmstepd's own environment */
static const char *sg_gres_conf(char *buf, size_t size)
{
    const char *conf = getenv("SLURM_CONF");
    struct stat st;
    if (conf && *conf) {
        /* _join(_dirname(conf), "gres.conf") */
        const char *slash = strrchr(conf, '/');
        size_t head = slash ? (size_t) (slash - conf) + 1 : 0, k;
        int all_slash = 1;
        for (k = 0; k < head; k++)
            all_slash &= conf[k] == '/';
        if (head && !all_slash)
            while (head > 0 && conf[head - 1] == '/')
                head--;
        if (head + sizeof("/gres.conf") > size)
            return NULL;
        memcpy(buf, conf, head);
        strcpy(buf + head, (head == 0 || conf[head - 1] == '/') ? "gres.conf" : "/gres.conf");
        return buf;
    }
    if (stat("/etc/slurm/gres.conf", &st) == 0)
        return "/etc/slurm/gres.conf";
    if (stat("/etc/slurm-llnl/gres.conf", &st) == 0)
        return "/etc/slurm-llnl/gres.conf";
    return "";
}

/* In init_post_opt, as root: read the table nodefacts' entry for this node
 * would name (the Python path keeps it, slurm_gpu/spank/bindtable.py). */
int sg_cbind_load(void)
{
    char node[256], gres[PATH_MAX], key[PATH_MAX * 2 + 512], name[512];
    const char *env = getenv("SLURMD_NODENAME"), *g;
    struct utsname u;
    if (env && *env) {
        if (strlen(env) >= sizeof(node))
            return -1;
        strcpy(node, env);
    } else {
        if (uname(&u))
            return -1;
        snprintf(node, sizeof(node), "%s", u.nodename);
        node[strcspn(node, ".")] = 0;
    }
    if (!(g = sg_gres_conf(gres, sizeof(gres))))
        return -1;
    if (sg_table_name(SG_FACTS_KEY_PREFIX, node, sg_args.config ? sg_args.config : "", g, key,
                      sizeof(key), name, sizeof(name)))
        return -1;
    return sg_table_load(&sg_table, SG_FACTS_DIR, name, key);
}

static int sg_sys_getaffinity(unsigned char *bits)
{
    size_t size = CPU_ALLOC_SIZE(SG_BIND_MAXID + 1);
    cpu_set_t *set = CPU_ALLOC(SG_BIND_MAXID + 1);
    int i;
    if (!set)
        return ENOMEM;
    if (sched_getaffinity(0, size, set)) {
        CPU_FREE(set);
        return errno;
    }
    for (i = 0; i <= SG_BIND_MAXID; i++)
        if (CPU_ISSET_S(i, size, set))
            bits[i / 8] |= (unsigned char) (1u << (i % 8));
    CPU_FREE(set);
    return 0;
}

static int sg_sys_setaffinity(const unsigned char *bits)
{
    size_t size = CPU_ALLOC_SIZE(SG_BIND_MAXID + 1);
    cpu_set_t *set = CPU_ALLOC(SG_BIND_MAXID + 1);
    int i, rc;
    if (!set)
        return ENOMEM;
    CPU_ZERO_S(size, set);
    for (i = 0; i <= SG_BIND_MAXID; i++)
        if (bits[i / 8] >> (i % 8) & 1)
            CPU_SET_S(i, size, set);
    rc = sched_setaffinity(0, size, set) ? errno : 0;
    CPU_FREE(set);
    return rc;
}

static int sg_sys_get_mempolicy(int *mode, unsigned char *bits)
{
    unsigned long mask[SG_BIND_HOSTBITS / (8 * sizeof(unsigned long))];
    const int per = (int) (8 * sizeof(unsigned long));
    int i;
    memset(mask, 0, sizeof(mask));
    if (syscall(SYS_get_mempolicy, mode, mask, (unsigned long) SG_BIND_HOSTBITS + 1, 0UL, 0UL))
        return errno;
    for (i = 0; i < SG_BIND_HOSTBITS; i++)
        if (mask[i / per] >> (i % per) & 1)
            bits[i / 8] |= (unsigned char) (1u << (i % 8));
    return 0;
}

static int sg_sys_set_mempolicy(int mode, const unsigned long *mask, unsigned long maxnode)
{
    return syscall(SYS_set_mempolicy, mode, mask, maxnode) == 0 ? 0 : errno;
}

/* sg_ops.ctx: the task's handle and why its last setenv failed */
struct sg_task_ctx {
    spank_t sp;
    spank_err_t setenv_rc;
};

static int sg_spank_setenv(void *ctx, const char *name, const char *value)
{
    struct sg_task_ctx *c = ctx;
    c->setenv_rc = spank_setenv(c->sp, name, value, 1);
    return c->setenv_rc == ESPANK_SUCCESS ? 0 : -1;
}

static const char *sg_spank_setenv_error(void *ctx)
{
    return spank_strerror(((struct sg_task_ctx *) ctx)->setenv_rc);
}

static void sg_slurm_error(const char *line)
{
    slurm_error("%s", line);
}

static void sg_stderr(const char *line)
{
    size_t n = strlen(line);
    while (n > 0) {
        ssize_t w = write(2, line, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        line += w;
        n -= (size_t) w;
    }
}

/* task_init, as the job user: remote.task_init for a plain prefer step. */
int sg_cbind_task(spank_t sp)
{
    struct sg_task_ctx ctx = { sp, ESPANK_SUCCESS };
    struct sg_ops ops = { sg_sys_getaffinity, sg_sys_get_mempolicy, sg_sys_setaffinity,
                          sg_sys_set_mempolicy, sg_spank_setenv, sg_spank_setenv_error,
                          sg_slurm_error, sg_stderr, NULL };
    struct sg_task_in in;
    const char *var = sg_gpu_var(sp);
    char *step = NULL, *cvd = NULL, *per = NULL;
    uint32_t ntasks = 0;
    int task = 0, unset, rc = -1;
    memset(&in, 0, sizeof(in));
    ops.ctx = &ctx;
    if (!var || spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS
        || spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS) {
        slurm_error("slurm-gpu: cannot read this task's id or the step's task count");
        return -1;
    }
    step = sg_getenv_dup(sp, var, &unset);
    cvd = sg_getenv_dup(sp, "CUDA_VISIBLE_DEVICES", &unset);
    per = sg_getenv_dup(sp, "SLURM_GPUS_PER_TASK", &unset);
    in.step_gpus = step;
    in.cvd = cvd;
    in.per_task = per;
    in.task = task;
    in.ntasks = ntasks;
    rc = sg_bind_task(&sg_table, &in, &ops);
    free(step);
    free(cvd);
    free(per);
    return rc;
}
