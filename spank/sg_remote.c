/*
 * slurm-gpu SPANK plugin, outer half: slurmstepd (S_CTX_REMOTE).
 *
 * Decides once per step, in init_post_opt, whether the step needs Python:
 * only steps that asked for GPU work, or that hold GPUs while binding is
 * on, pay for the interpreter, and a plain prefer step binds in C instead
 * (sg_cbind.c).  Everything else is forwarded to slurm_gpu/spank/remote.py.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "sg_plugin.h"

static int sg_py_wanted;            /* this step runs Python hooks */
static int sg_c_bind;               /* this step binds in C (sg_cbind.c) */

/* strict/prefer/off from the user's value, else the admin default. */
static int sg_numa_active(void)
{
    const char *user = sg_values[SG_OPT_NUMA_BIND];
    if (user) {
        if (sg_has_token(user, "strict") || sg_has_token(user, "prefer"))
            return 1;
        if (sg_has_token(user, "off"))
            return 0;
    }
    return strcmp(sg_args.numa_mode, "off") != 0;
}

static int sg_env_nonempty(spank_t sp, const char *name)
{
    char buf[8];
    spank_err_t rc = spank_getenv(sp, name, buf, sizeof(buf));
    /* ESPANK_NOSPACE: set and longer than the buffer, so not empty */
    return (rc == ESPANK_SUCCESS && buf[0]) || rc == ESPANK_NOSPACE;
}

/* SLURM_BATCH_SCRIPT and SLURM_INTERACTIVE_STEP of <slurm/slurm.h>; keep in
 * sync with slurm_gpu/spank/remote.py (JOB_GPU_STEPS). */
#define SG_BATCH_STEP       0xfffffffbU
#define SG_INTERACTIVE_STEP 0xfffffffaU

/* The variable that holds this step's GPUs.  slurmstepd sets (or unsets)
 * SLURM_JOB_GPUS in the batch and interactive steps and SLURM_STEP_GPUS in
 * every other step; the other one is whatever the user exported. */
const char *sg_gpu_var(spank_t sp)
{
    uint32_t step = 0;
    if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
        return NULL;
    return (step == SG_BATCH_STEP || step == SG_INTERACTIVE_STEP)
        ? "SLURM_JOB_GPUS" : "SLURM_STEP_GPUS";
}

static int sg_step_needs_python(spank_t sp)
{
    const char *prof = sg_values[SG_OPT_PROFILE];
    const char *var;
    if (sg_values[SG_OPT_MPS] || sg_values[SG_OPT_MIG])
        return 1;
    if (prof && strcmp(prof, "none") != 0)
        return 1;
    if (!sg_numa_active())
        return 0;
    /* step id unknown: let Python decide (and report) rather than guess */
    var = sg_gpu_var(sp);
    return !var || sg_env_nonempty(sp, var);
}

int sg_remote_init_post_opt(spank_t sp)
{
    if (sg_args.bad)
        return 0;                   /* no Python; the tasks fail in task_init */
    /*
     * The step's Python work starts here, not in user_init: slurmstepd
     * calls init_post_opt as root in its own working directory, but
     * user_init only after it has switched its effective uid to the job
     * user and chdir()ed into the job's directory.  Reading the node's
     * config and the root-only cache in /run needs root, and nothing
     * of the job user's should be in play while the interpreter starts.
     */
    sg_py_wanted = sg_step_needs_python(sp);
    if (!sg_py_wanted)
        return 0;
    /* a plain prefer step binds from the table, without the interpreter;
     * anything the table or sg_bind.c does not cover goes to Python */
    if (sg_cbind_eligible(sp) && sg_cbind_load() == 0) {
        sg_c_bind = 1;
        sg_py_wanted = 0;
        return 0;
    }
    if (sg_forward("init_post_opt", SG_HOOK_INIT_POST_OPT, sp) == 0)
        return 0;
    /* The interpreter did not start here (venv removed or unreadable,
     * inner half missing: said why above, in the node's log).  Failing
     * this hook would fail the batch step's launch, and slurmctld would
     * drain the node; the tasks fail instead (sg_py_unavailable). */
    return sg_python_state() == -1 ? 0 : -1;
}

/* Tasks see the options they were started with, without Python. */
int sg_remote_user_init(spank_t sp)
{
    static const char *const names[SG_NOPTS] = SG_ENV_NAMES;
    int i;
    for (i = 0; i < SG_NOPTS; i++)
        if (sg_values[i] && spank_setenv(sp, names[i], sg_values[i], 1) != ESPANK_SUCCESS) {
            slurm_error("slurm-gpu: cannot set %s in the job environment", names[i]);
            return -1;
        }
    return 0;
}

/* In a task of a step whose Python could not start: one line for the user,
 * once per task (each task is its own process; two hooks may get here). */
static int sg_py_unavailable(void)
{
    static int said;
    if (!said++)
        slurm_error("slurm-gpu: the plugin's Python could not start on this node "
                    "(see the node's slurmd log): the step cannot run");
    return -1;
}

int sg_remote_task_init_privileged(spank_t sp)
{
    if (!sg_py_wanted)
        return 0;
    if (sg_python_state() == -1)
        return sg_py_unavailable();
    return sg_forward("task_init_privileged", SG_HOOK_TASK_PRIV, sp);
}

int sg_remote_task_init(spank_t sp)
{
    if (sg_args.bad) {
        slurm_error("slurm-gpu: plugstack.conf has bad slurm-gpu arguments on this node "
                    "(see the node's slurmd log): the step cannot run");
        return -1;
    }
    if (sg_c_bind)
        return sg_cbind_task(sp);
    if (!sg_py_wanted)
        return 0;
    if (sg_python_state() == -1)
        return sg_py_unavailable();
    return sg_forward("task_init", SG_HOOK_TASK_INIT, sp);
}
