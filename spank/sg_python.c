/*
 * slurm-gpu SPANK plugin, outer half: loading the inner half.
 *
 * slurm_gpu_spank_py.so (cffi embedding + libpython) lies next to this
 * file; it is dlopen()ed only by a context that needs Python, starts an
 * isolated interpreter and forwards hooks to slurm_gpu.spank.dispatch.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sg_plugin.h"

#define SG_INNER "slurm_gpu_spank_py.so"

typedef int (*sg_start_f)(const char *where, const struct sg_outer_api *api);
typedef int (*sg_hook_f)(int hook, spank_t sp);
typedef int (*sg_option_f)(int which, int remote);
static sg_hook_f sg_py_hook;
static sg_option_f sg_py_option;
static int sg_py_state;             /* 0 = not started, 1 = ok, -1 = failed */

static const char *sg_option_value(int which)
{
    if (which < 0 || which >= SG_NOPTS)
        return NULL;
    return sg_values[which];
}

/* What the inner half gets from us (sg_api.h): it cannot see our symbols,
 * Slurm loads this plugin RTLD_LOCAL. */
static const struct sg_outer_api sg_api = { SG_API_VERSION, sg_option_value, &sg_args };

/* One hex number at *p, which is moved past it; 0 when there is none (or it
 * is too long).  By hand, not sscanf/strtoul: under _GNU_SOURCE, glibc 2.38
 * and later map those to __isoc23_* symbols, so a plugin built on a newer
 * distribution would need that glibc wherever it is loaded. */
static int sg_hex(const char **p, unsigned long *out)
{
    unsigned long v = 0;
    size_t n = 0;

    for (;; (*p)++, n++) {
        char c = **p;
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned) (c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned) (c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (unsigned) (c - 'A' + 10);
        else
            break;
        if (n >= sizeof(v) * 2)
            return 0;
        v = v << 4 | d;
    }
    *out = v;
    return n > 0;
}

/* The directory of the file this code runs from, as the kernel names the
 * mapping (/proc/self/maps), with a trailing '/'.  plugstack.conf names the
 * plugin through the venv link (/opt/slurm-gpu/venv -> venv-STAMP), and an
 * upgrade may swap that link between Slurm's dlopen of this half and ours of
 * the inner one: a path through the link (dladdr's) would then pair this
 * half with another tree's inner half and Python.  0, or -1 with why. */
static int sg_own_dir(char *dir, size_t len, const char **why)
{
    char line[PATH_MAX + 256];
    uintptr_t self = (uintptr_t) &sg_own_dir;
    FILE *f = fopen("/proc/self/maps", "re");
    int rc = -1;

    *why = "cannot read /proc/self/maps";
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        const char *p = line;
        char *path, *slash;
        size_t n;
        int field;
        /* "lo-hi perms offset dev inode   path" */
        if (!sg_hex(&p, &lo) || *p++ != '-' || !sg_hex(&p, &hi) || self < lo || self >= hi)
            continue;
        for (field = 0; field < 4; field++) {
            while (*p == ' ')
                p++;
            if (*p == '\0' || *p == '\n')
                break;
            while (*p && *p != ' ' && *p != '\n')
                p++;
        }
        if (field < 4)
            continue;
        while (*p == ' ')
            p++;
        path = line + (p - line);
        path[strcspn(path, "\n")] = '\0';
        n = strlen(path);
        if (n > 10 && strcmp(path + n - 10, " (deleted)") == 0) {
            *why = "its file was removed since it was loaded (venv tree replaced twice?)";
            break;
        }
        if (path[0] != '/' || !(slash = strrchr(path, '/'))
            || (size_t) (slash - path) + 1 + sizeof(SG_INNER) > len) {
            *why = "its mapping names no usable path";
            break;
        }
        memcpy(dir, path, slash - path + 1);
        dir[slash - path + 1] = '\0';
        rc = 0;
        break;
    }
    fclose(f);
    return rc;
}

/* Load the inner half (found next to this file, in the same tree) and start
 * Python there.  Any failure is an error returned to Slurm, never an exit()
 * of the host process and never cffi's silent "returns 0". */
int sg_python(const char *where)
{
    char path[PATH_MAX];
    const char *why;
    void *h;
    sg_start_f start;

    if (sg_py_state != 0)
        return sg_py_state == 1 ? 0 : -1;
    sg_py_state = -1;
    if (sg_own_dir(path, sizeof(path), &why) != 0) {
        slurm_error("slurm-gpu: cannot locate the plugin's own file in %s: %s", where, why);
        return -1;
    }
    strcat(path, SG_INNER);
    /* RTLD_GLOBAL: libpython's symbols must be visible to extension modules */
    h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        slurm_error("slurm-gpu: cannot load %s in %s: %s", path, where, dlerror());
        return -1;
    }
    start = (sg_start_f) dlsym(h, "sg_inner_start");
    sg_py_hook = (sg_hook_f) dlsym(h, "sg_inner_hook");
    sg_py_option = (sg_option_f) dlsym(h, "sg_inner_option");
    if (!start || !sg_py_hook || !sg_py_option) {
        slurm_error("slurm-gpu: %s lacks its entry points (rebuild with "
                    "slurm-gpu spank build)", path);
        return -1;
    }
    if (start(where, &sg_api) != 0)
        return -1;                       /* the inner half said why */
    sg_py_state = 1;
    return 0;
}

int sg_python_state(void)
{
    return sg_py_state;
}

/* Start Python if needed and hand the hook to the dispatcher. */
int sg_forward(const char *where, int hook, spank_t sp)
{
    if (sg_python(where) != 0)
        return -1;
    return sg_py_hook(hook, sp);
}

/* An option value C does not take as it is: Python checks it (srun, sbatch, salloc). */
int sg_forward_option(int which, int remote)
{
    if (sg_python("option parsing") != 0)
        return -1;
    return sg_py_option(which, remote);
}
