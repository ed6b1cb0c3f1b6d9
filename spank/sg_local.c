/*
 * slurm-gpu SPANK plugin, outer half: srun, sbatch and salloc
 * (S_CTX_LOCAL, S_CTX_ALLOCATOR).
 *
 * Canonical option values go to the prolog from here, without Python
 * (slurm_gpu/spank/local.py does the same for the rest).
 */
#define _GNU_SOURCE
#include "sg_plugin.h"

/* What slurm_gpu/spank/local.py init_post_opt does, for canonical values
 * only (no prolog gate: none of these options gives the prolog work). */
static int sg_pass_to_prolog(spank_t sp)
{
    static const char *const names[SG_NOPTS] = SG_ENV_NAMES;
    int i;
    for (i = 0; i < SG_NOPTS; i++) {
        spank_err_t rc;
        if (!sg_values[i])
            continue;
        rc = spank_job_control_setenv(sp, names[i], sg_values[i], 1);
        if (rc != ESPANK_SUCCESS) {
            slurm_error("slurm-gpu: spank_job_control_setenv %s: %s", names[i],
                        spank_strerror(rc));
            return -1;
        }
    }
    return 0;
}

int sg_local_init_post_opt(spank_t sp)
{
    if (!sg_any_option())
        return 0;
    if (sg_python_state() == 0 && sg_all_canonical())
        return sg_pass_to_prolog(sp);
    return sg_forward("init_post_opt", SG_HOOK_INIT_POST_OPT, sp);
}
