/*
 * slurm-gpu SPANK plugin, outer half: the plugstack.conf arguments.
 *
 * Parsed once, in slurm_spank_init, into sg_args; every later hook reads
 * the struct, and so does the Python side (sg_api.h: it gets no argv).  Unknown keys are fatal, like pyxis: a typo must not be
 * ignored.  The rules are slurm_gpu/joboptions.py's (parse_plugstack_args),
 * so that a mistake stops every context here instead of only the steps
 * that start Python.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "sg_plugin.h"

/* Its strings point into the argv Slurm keeps for the plugin's whole life
 * and hands every hook (struct spank_plugin's argv, freed at spank_fini). */
struct sg_args sg_args;

/* Plugstack argument keys; anything else is a configuration error. */
static const char *sg_arg_keys[] = SG_ARG_KEYS;

/* Does the comma-separated list contain exactly this token?  Blanks around
 * a token do not count, as in joboptions.parse_numa_bind, which accepted
 * "--gpu-numa-bind= prefer" in srun while this saw no mode: the step ran
 * unbound. */
int sg_has_token(const char *list, const char *tok)
{
    size_t n = strlen(tok);
    const char *p = list;
    while (p && *p) {
        const char *end = strchr(p, ',');
        const char *a = p, *b = end ? end : p + strlen(p);
        while (a < b && isspace((unsigned char) *a))
            a++;
        while (b > a && isspace((unsigned char) b[-1]))
            b--;
        if ((size_t) (b - a) == n && strncmp(a, tok, n) == 0)
            return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

/* Every token is a mode or "verbose", with exactly one mode: 0 with the
 * mode (a static string) and whether "verbose" was there, or -1. */
static int sg_numa_value(const char *v, const char **mode, int *verbose)
{
    static const char *modes[] = SG_NUMA_MODES;
    const char *p = v;
    int nmodes = 0, k;
    *verbose = 0;
    while (p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t) (end - p) : strlen(p);
        int known = 0;
        if (len == 7 && strncmp(p, "verbose", 7) == 0)
            known = *verbose = 1;
        for (k = 0; modes[k]; k++)
            if (len == strlen(modes[k]) && strncmp(p, modes[k], len) == 0) {
                known = 1;
                nmodes++;
                *mode = modes[k];
            }
        if (!known)
            return -1;
        p = end ? end + 1 : NULL;
    }
    return nmodes == 1 ? 0 : -1;
}

int sg_args_parse(int ac, char **av, struct sg_args *out)
{
    int i, k;
    memset(out, 0, sizeof(*out));
    out->numa_mode = "off";             /* numa_bind not given */
    for (i = 0; i < ac; i++) {
        const char *eq = strchr(av[i], '=');
        int ok = 0;
        for (k = 0; eq && sg_arg_keys[k]; k++)
            if ((size_t) (eq - av[i]) == strlen(sg_arg_keys[k])
                && strncmp(av[i], sg_arg_keys[k], eq - av[i]) == 0)
                ok = 1;
        if (!ok) {
            slurm_error("slurm-gpu: unknown plugstack argument '%s' "
                        "(known: " SG_ARG_HELP ")", av[i]);
            return -1;
        }
        for (k = 0; k < i; k++)
            if (strncmp(av[k], av[i], eq - av[i] + 1) == 0) {
                slurm_error("slurm-gpu: plugstack argument %.*s given twice",
                            (int) (eq - av[i]), av[i]);
                return -1;
            }
        if (strncmp(av[i], "numa_bind=", 10) == 0) {
            if (sg_numa_value(av[i] + 10, &out->numa_mode, &out->numa_verbose) != 0) {
                slurm_error("slurm-gpu: bad plugstack argument '%s' "
                            "(numa_bind=strict|prefer|off[,verbose])", av[i]);
                return -1;
            }
        } else if (strncmp(av[i], "config=", 7) == 0) {
            if (av[i][7] != '/') {
                slurm_error("slurm-gpu: plugstack argument %s must be an absolute path", av[i]);
                return -1;
            }
            out->config = av[i] + 7;
        }
    }
    return 0;
}
