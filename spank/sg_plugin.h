/*
 * slurm-gpu SPANK plugin, outer half: what its files share.
 *
 * One file per context, as NVIDIA/pyxis does it:
 *   sg_dispatch.c  the exported slurm_spank_* hooks, routing on spank_context()
 *   sg_args.c      plugstack arguments, parsed once at init into sg_args
 *                  (the only parse: Python reads the struct, sg_api.h)
 *   sg_options.c   the job options (srun, sbatch, salloc and slurmstepd)
 *   sg_local.c     srun/sbatch/salloc: options handed to the prolog
 *   sg_remote.c    slurmstepd: the need-Python decision, forwarding to Python
 *   sg_cbind.c     slurmstepd: plain prefer binding in C (sg_bind.c)
 *   sg_python.c    loading the inner half (Python) next to this file
 * Only slurm_spank_* and plugin_* leave the .so (exports.map).
 */
#ifndef SG_PLUGIN_H
#define SG_PLUGIN_H

#include <stddef.h>
#include <slurm/spank.h>

#include "sg_api.h"
#include "sg_build.h"

/* Keep in sync with slurm_gpu/spank/dispatch.py (HOOKS). */
#define SG_HOOK_INIT_POST_OPT 1
#define SG_HOOK_TASK_PRIV     3
#define SG_HOOK_TASK_INIT     4

/* The plugstack.conf arguments (struct in sg_api.h), as parsed once by
 * slurm_spank_init; the inner half gets a pointer to them. */
extern struct sg_args sg_args;

/* sg_args.c: 0, or -1 after one slurm_error line (unknown key, bad value). */
int sg_args_parse(int ac, char **av, struct sg_args *out);
/* Does the comma-separated list contain exactly this token (blanks around
 * a token do not count)? */
int sg_has_token(const char *list, const char *tok);

/* sg_options.c */
extern char *sg_values[SG_NOPTS];   /* option values; NULL = not given */
int sg_options_register(spank_t sp);
int sg_any_option(void);
int sg_all_canonical(void);

/* sg_python.c */
int sg_python(const char *where);   /* start the inner half once: 0 or -1 */
int sg_python_state(void);          /* 0: not tried, 1: running, -1: did not start */
int sg_forward(const char *where, int hook, spank_t sp);
int sg_forward_option(int which, int remote);

/* sg_local.c: srun, sbatch, salloc */
int sg_local_init_post_opt(spank_t sp);

/* sg_remote.c: slurmstepd */
int sg_remote_init_post_opt(spank_t sp);
int sg_remote_user_init(spank_t sp);
int sg_remote_task_init_privileged(spank_t sp);
int sg_remote_task_init(spank_t sp);
const char *sg_gpu_var(spank_t sp);

/* sg_cbind.c: slurmstepd, plain prefer steps */
int sg_cbind_eligible(spank_t sp);
int sg_cbind_load(void);
int sg_cbind_task(spank_t sp);

#endif
