/*
 * slurm-gpu SPANK plugin, outer half: plain C, NOT linked to libpython.
 *
 * This is the .so named in plugstack.conf.  It only
 *   - registers the options (so srun, sbatch and salloc all see them),
 *   - stores option values in C,
 *   - decides cheaply whether Python is needed at all, and only then
 *   - dlopen()s the inner half (slurm_gpu_spank_py.so, next to this file:
 *     cffi embedding + libpython), which starts an isolated interpreter and
 *     forwards each hook to ONE Python dispatcher (slurm_gpu.spank.dispatch).
 * Python (even libpython's mapping) never reaches slurmd, srun/sbatch/salloc
 * without our options, or steps that do not need it.
 *
 * This file holds the plugin's identity and its exported hooks, which only
 * route on spank_context() to the file of that context (sg_plugin.h).
 *
 * sg_build.h is generated at build time by spank/build_plugin.py: the option
 * table and SG_OPT_* ids from slurm_gpu/joboptions.py (declared once,
 * there), and the Slurm this build is for.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "sg_plugin.h"

/* exports plugin_name, plugin_type, plugin_version, spank_plugin_version */
SPANK_PLUGIN(slurm_gpu, 1)

#ifdef SG_HAVE_INIT_FAILURE_MODE
/* Slurm >= 25.05: a failing slurm_spank_init drains the node unless the
 * plugin says otherwise.  Everything our init refuses is configuration the
 * job ran into (a bad plugstack argument): fail the job, keep the node. */
int slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE;
#endif

/* What `slurm-gpu doctor` reads back from this file. */
__attribute__((used)) static const char sg_marker[] = SG_MARKER SG_BUILT_FOR;

/* libslurm's API number of the Slurm this process runs (0: unknown). */
static int sg_running_api(void)
{
    long (*api)(void) = (long (*)(void)) dlsym(RTLD_DEFAULT, "slurm_api_version");
    return api ? (int) ((api() >> 16) & 0xff) : 0;
}

static const char *sg_release_of(int api)
{
    static const struct { int api; const char *release; } known[] = SG_API_RELEASES;
    int i;
    for (i = 0; known[i].release; i++)
        if (known[i].api == api)
            return known[i].release;
    return NULL;
}

/* Slurm refuses a plugin of another major.minor with a line that names only
 * the plugin's version; this runs at dlopen, before that check, to say in
 * one line which Slurm the plugin was built for and which one loads it. */
__attribute__((constructor)) static void sg_check_slurm_version(void)
{
    int api = sg_running_api();
    const char *rel;
    if (api == 0 || api == SG_BUILT_API)
        return;
    rel = sg_release_of(api);
    if (rel)
        slurm_error("slurm-gpu: this plugin was built for Slurm " SG_BUILT_FOR
                    " but runs under Slurm %s: rebuild it (slurm-gpu spank build)", rel);
    else
        slurm_error("slurm-gpu: this plugin was built for Slurm " SG_BUILT_FOR
                    " but runs under another Slurm (libslurm API %d): rebuild it "
                    "(slurm-gpu spank build)", api);
}

/* ---- SPANK hooks (the only exported functions besides plugin_*) ---- */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();
    if (sg_args_parse(ac, av, &sg_args) != 0) {
        /* slurmd itself uses none of our options: refusing there would stop
         * the daemon (a node fault) for a mistake that only the jobs which
         * use the plugin must pay for; they fail in srun/sbatch/slurmstepd. */
        if (ctx == S_CTX_SLURMD)
            return 0;
#ifndef SG_HAVE_INIT_FAILURE_MODE
        /* Before Slurm 25.05 a failing init in slurmstepd drains the node
         * ("batch job complete failure"), and so does any hook that fails
         * before the tasks start: fail each task instead (task_init). */
        if (ctx == S_CTX_REMOTE)
            sg_args.bad = 1;
        else
#endif
        return -1;
    }
    switch (ctx) {
    case S_CTX_LOCAL:
    case S_CTX_ALLOCATOR:
    case S_CTX_REMOTE:
        return sg_options_register(sp);
    default:
        return 0;   /* slurmd, job script: nothing to do, no Python */
    }
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void) ac;                      /* parsed once, at init: sg_args */
    (void) av;
    switch (spank_context()) {
    case S_CTX_REMOTE:
        return sg_remote_init_post_opt(sp);
    case S_CTX_LOCAL:
    case S_CTX_ALLOCATOR:
        return sg_local_init_post_opt(sp);
    default:
        return 0;
    }
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void) ac;
    (void) av;
    return spank_context() == S_CTX_REMOTE ? sg_remote_user_init(sp) : 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    (void) ac;
    (void) av;
    return spank_context() == S_CTX_REMOTE ? sg_remote_task_init_privileged(sp) : 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void) ac;
    (void) av;
    return spank_context() == S_CTX_REMOTE ? sg_remote_task_init(sp) : 0;
}
