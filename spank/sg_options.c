/*
 * slurm-gpu SPANK plugin, outer half: the job options.
 *
 * srun, sbatch, salloc and slurmstepd all register them (slurmstepd gets
 * their values through the same callback).  The table comes from
 * slurm_gpu/joboptions.py through sg_build.h; values are stored here and
 * read by the context's file.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "sg_plugin.h"

char *sg_values[SG_NOPTS];

static int sg_opt_cb(int val, const char *optarg, int remote);

static struct spank_option sg_options[SG_NOPTS] = SG_OPTION_TABLE;

int sg_options_register(spank_t sp)
{
    int i;
    for (i = 0; i < SG_NOPTS; i++) {
        spank_err_t rc = spank_option_register(sp, &sg_options[i]);
        if (rc != ESPANK_SUCCESS) {
            slurm_error("slurm-gpu: cannot register --%s: %s",
                        sg_options[i].name, spank_strerror(rc));
            return -1;
        }
    }
    return 0;
}

int sg_any_option(void)
{
    int i;
    for (i = 0; i < SG_NOPTS; i++)
        if (sg_values[i])
            return 1;
    return 0;
}

/* A value Python would pass on unchanged, of an option the prolog has no
 * work for (slurm_gpu/joboptions.py c_canonical_values): srun, sbatch and
 * salloc need no interpreter for it.  Anything else goes to Python, which
 * normalises it or refuses it with its one line. */
static int sg_canonical(int opt, const char *v)
{
    const char *const *canon[SG_NOPTS] = SG_CANONICAL;
    const char *const *c = canon[opt];
    for (; c && *c; c++)
        if (strcmp(*c, v) == 0)
            return 1;
    return 0;
}

int sg_all_canonical(void)
{
    int i;
    for (i = 0; i < SG_NOPTS; i++)
        if (sg_values[i] && !sg_canonical(i, sg_values[i]))
            return 0;
    return 1;
}

static int sg_opt_cb(int val, const char *optarg, int remote)
{
    if (val < 0 || val >= SG_NOPTS)
        return -1;
    free(sg_values[val]);
    /* --gpu-mps without a value means the site default percentage */
    sg_values[val] = strdup(optarg ? optarg : "default");
    if (!sg_values[val])
        return -1;
    /* slurmstepd calls this too (twice); values were checked at submit time */
    if (remote)
        return 0;
    if (sg_canonical(val, sg_values[val]))
        return 0;
    return sg_forward_option(val, remote);
}
