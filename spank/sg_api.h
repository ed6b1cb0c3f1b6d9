/*
 * slurm-gpu SPANK plugin: what the outer half hands the inner half.
 *
 * Included by both halves (sg_plugin.h, slurm_gpu_spank_py.c); the inner
 * half cannot see the outer half's symbols (Slurm loads the plugin
 * RTLD_LOCAL), so everything goes through struct sg_outer_api.  The Python
 * side reads struct sg_args through the cffi cdef of spank/build_plugin.py
 * (CDEF): keep the three in step, and bump SG_API_VERSION on any change.
 */
#ifndef SG_API_H
#define SG_API_H

/* The plugstack.conf arguments, parsed once by slurm_spank_init (sg_args.c):
 * nobody parses the argv again, Python included. */
struct sg_args {
    const char *config;             /* config=PATH, absolute; NULL: not given */
    const char *numa_mode;          /* numa_bind's mode: "strict", "prefer" or "off"
                                     * ("off" when not given) */
    int numa_verbose;               /* numa_bind had ",verbose" */
    int bad;                        /* slurmstepd before Slurm 25.05: refused, fail the tasks */
};

struct sg_outer_api {
    int version;
    const char *(*option_value)(int which);
    const struct sg_args *args;
};
#define SG_API_VERSION 2

#endif
