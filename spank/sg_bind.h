/*
 * slurm-gpu SPANK plugin: the binding table and the binding planner
 * (sg_bind.c), the only one: the C path calls it from the outer half, the
 * Python path through cffi (slurm_gpu/binding.py).  See
 * slurm_gpu/spank/bindtable.py for the table's format.
 */
#ifndef SG_BIND_H
#define SG_BIND_H

#include <stddef.h>

#define SG_BIND_MAX      65536        /* bytes of a table (bindtable.MAX_BYTES) */
#define SG_BIND_MAXID    65535        /* CPU and NUMA ids (bindtable.MAX_ID) */
#define SG_BIND_MAXGPUS  1024
#define SG_BIND_MAXMAP   1024
#define SG_BIND_HOSTBITS 1024         /* nodes get_mempolicy reports (effects._MASK_BITS) */
#define SG_BIND_NBYTES   (SG_BIND_MAXID / 8 + 1)
#define SG_MODE_OFF      0
#define SG_MODE_PREFER   1
#define SG_MODE_STRICT   2

struct sg_gpu {
    int missing;                      /* a gres.conf GPU NVML does not have */
    long long index;                  /* NVML index */
    char uuid[128];                   /* "" when unknown */
    int cpus, ncpus, mems, nmems;     /* offsets and lengths in sg_table.ranges */
};

struct sg_table {
    struct sg_gpu *gpus;              /* at Slurm's GPU index */
    int ngpus, maxgpus;               /* maxgpus: sized from the table's lines */
    struct sg_range { int lo, hi; } *ranges;  /* "0-3,8": {0,3},{8,8}, as the table writes them */
    int nranges, maxranges;           /* maxranges: sized from the table's bytes */
    int nmap;                         /* [spank] numa_node_map, by model node */
    int map_from[SG_BIND_MAXMAP], map_to[SG_BIND_MAXMAP];
};

struct sg_str {
    char *buf;
    size_t len, cap;
};

/* One task's inputs. */
struct sg_task_in {
    const char *step_gpus;            /* SLURM_STEP_GPUS or SLURM_JOB_GPUS; NULL: unset */
    const char *cvd;                  /* CUDA_VISIBLE_DEVICES */
    const char *per_task;             /* SLURM_GPUS_PER_TASK */
    int mode;                         /* SG_MODE_* */
    int task;
    unsigned ntasks;
    const unsigned char *allowed;     /* sched_getaffinity, SG_BIND_NBYTES */
    const unsigned char *bound_host;  /* an MPOL_BIND policy's host nodes, or NULL */
};

/* One task's plan.  Lists are written like /proc's ("0-3,8"). */
struct sg_plan {
    int applied;                      /* cpus and mems are set */
    int failed;                       /* strict and impossible: message says why */
    struct sg_str message;            /* NULL buf: none; else prefer's warning or strict's error */
    struct sg_str env;                /* SLURM_GPU_BINDING */
    struct sg_str slots;              /* the task's GPUs, Slurm indices in order: "1,0" */
    struct sg_str cpus_text;          /* what sched_setaffinity gets */
    struct sg_str mems_text;          /* model NUMA nodes */
    struct sg_str host_text;          /* the host nodes set_mempolicy gets ([spank] numa_node_map) */
    unsigned char cpus[SG_BIND_NBYTES];
    int host_node;                    /* the first: all MPOL_PREFERRED honours */
};

/* The system calls and Slurm calls a task's binding makes (the test
 * harness passes fakes).  Each returns 0 or an errno; error() gets one line. */
struct sg_ops {
    int (*getaffinity)(unsigned char *bits);             /* SG_BIND_NBYTES */
    int (*get_mempolicy)(int *mode, unsigned char *bits); /* SG_BIND_HOSTBITS bits */
    int (*setaffinity)(const unsigned char *bits);
    int (*set_mempolicy)(int mode, const unsigned long *mask, unsigned long maxnode);
    int (*setenv)(void *ctx, const char *name, const char *value); /* 0 or -1 */
    const char *(*setenv_error)(void *ctx);               /* why the last setenv failed */
    void (*error)(const char *line);
    void (*say)(const char *line);                        /* the task's stderr */
    void *ctx;
};

/* A plain prefer step's task, planned and applied: 0, or -1 when the task must fail. */
int sg_bind_task(const struct sg_table *t, struct sg_task_in *in, const struct sg_ops *ops);

/* The table beside the node-fact entry, trusted and current (sg_cbind.c): 0 or -1 */
int sg_table_load(struct sg_table *t, const char *dir, const char *name, const char *key);
/* Its rows only ("map", "gpu", "missing" lines, then "end"), from the Python path: 0 or -1 */
int sg_table_rows(struct sg_table *t, const char *text);
void sg_table_free(struct sg_table *t);
int sg_table_name(const char *prefix, const char *node, const char *config, const char *gres,
                  char *key, size_t keysize, char *name, size_t namesize);
/* 0, or -1: out of memory (or a mode out of range) */
int sg_plan(const struct sg_table *t, const struct sg_task_in *in, struct sg_plan *out);
void sg_plan_free(struct sg_plan *p);
void sg_str_free(struct sg_str *s);

#endif
