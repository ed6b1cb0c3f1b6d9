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
 * sg_build.h is generated at build time by spank/build_plugin.py: the option
 * table and SG_OPT_* ids from slurm_gpu/joboptions.py (declared once,
 * there), and the Slurm this build is for.
 */
#define _GNU_SOURCE
#include <slurm/spank.h>
#include <ctype.h>
#include <dlfcn.h>
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

#include "sg_build.h"
#include "sg_bind.h"

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

/* Keep in sync with slurm_gpu/spank/dispatch.py (HOOKS). */
#define SG_HOOK_INIT_POST_OPT 1
#define SG_HOOK_TASK_PRIV     3
#define SG_HOOK_TASK_INIT     4

/* Plugstack argument keys; anything else is a configuration error. */
static const char *sg_arg_keys[] = SG_ARG_KEYS;

#define SG_INNER "slurm_gpu_spank_py.so"

/* What the inner half gets from us (it cannot see our symbols: Slurm loads
 * this plugin RTLD_LOCAL).  Keep in sync with slurm_gpu_spank_py.c. */
struct sg_outer_api {
    int version;
    const char *(*option_value)(int which);
};
#define SG_API_VERSION 1

typedef int (*sg_start_f)(const char *where, const struct sg_outer_api *api);
typedef int (*sg_hook_f)(int hook, spank_t sp, int ac, char **av);
typedef int (*sg_option_f)(int which, int remote);
static sg_hook_f sg_py_hook;
static sg_option_f sg_py_option;

static char *sg_values[SG_NOPTS];   /* option values; NULL = not given */
static int sg_py_state;             /* 0 = not started, 1 = ok, -1 = failed */
static int sg_py_wanted;            /* remote: this step runs Python hooks */
static int sg_c_bind;               /* remote: this step binds in C (sg_bind.c) */
static struct sg_table sg_table;    /* ...from this table, read as root */
static int sg_bad_args;             /* remote: refused plugstack arguments, fail later */

static int sg_opt_cb(int val, const char *optarg, int remote);

static struct spank_option sg_options[SG_NOPTS] = SG_OPTION_TABLE;

/* ---- the inner half ---- */

static const char *sg_option_value(int which)
{
    if (which < 0 || which >= SG_NOPTS)
        return NULL;
    return sg_values[which];
}

static const struct sg_outer_api sg_api = { SG_API_VERSION, sg_option_value };

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
static int sg_python(const char *where)
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

/* ---- helpers ---- */

static int sg_any_option(void)
{
    int i;
    for (i = 0; i < SG_NOPTS; i++)
        if (sg_values[i])
            return 1;
    return 0;
}

static const char *sg_arg(int ac, char **av, const char *key)
{
    size_t n = strlen(key);
    int i;
    for (i = 0; i < ac; i++)
        if (strncmp(av[i], key, n) == 0 && av[i][n] == '=')
            return av[i] + n + 1;
    return NULL;
}

/* Does the comma-separated list contain exactly this token?  Blanks around
 * a token do not count, as in joboptions.parse_numa_bind, which accepted
 * "--gpu-numa-bind= prefer" in srun while this saw no mode: the step ran
 * unbound. */
static int sg_has_token(const char *list, const char *tok)
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

/* Every token is a mode or "verbose", with exactly one mode. */
static int sg_numa_value_ok(const char *v)
{
    static const char *modes[] = SG_NUMA_MODES;
    const char *p = v;
    int nmodes = 0, k;
    while (p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t) (end - p) : strlen(p);
        int known = (len == 7 && strncmp(p, "verbose", 7) == 0);
        for (k = 0; modes[k]; k++)
            if (len == strlen(modes[k]) && strncmp(p, modes[k], len) == 0) {
                known = 1;
                nmodes++;
            }
        if (!known)
            return 0;
        p = end ? end + 1 : NULL;
    }
    return nmodes == 1;
}

/* Unknown plugstack keys are fatal, like pyxis: a typo must not be ignored. */
static int sg_check_args(int ac, char **av)
{
    int i, k;
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
        /* the same rules as slurm_gpu/joboptions.py, so that a mistake
         * stops every context here instead of only the steps that start
         * Python */
        for (k = 0; k < i; k++)
            if (strncmp(av[k], av[i], eq - av[i] + 1) == 0) {
                slurm_error("slurm-gpu: plugstack argument %.*s given twice",
                            (int) (eq - av[i]), av[i]);
                return -1;
            }
        if (strncmp(av[i], "numa_bind=", 10) == 0 && !sg_numa_value_ok(av[i] + 10)) {
            slurm_error("slurm-gpu: bad plugstack argument '%s' "
                        "(numa_bind=strict|prefer|off[,verbose])", av[i]);
            return -1;
        }
        if (strncmp(av[i], "config=", 7) == 0 && av[i][7] != '/') {
            slurm_error("slurm-gpu: plugstack argument %s must be an absolute path", av[i]);
            return -1;
        }
    }
    return 0;
}

/* strict/prefer/off from the user's value, else the admin default. */
static int sg_numa_active(int ac, char **av)
{
    const char *srcs[2];
    int i;
    srcs[0] = sg_values[SG_OPT_NUMA_BIND];
    srcs[1] = sg_arg(ac, av, "numa_bind");
    for (i = 0; i < 2; i++) {
        if (!srcs[i])
            continue;
        if (sg_has_token(srcs[i], "strict") || sg_has_token(srcs[i], "prefer"))
            return 1;
        if (sg_has_token(srcs[i], "off"))
            return 0;
    }
    return 0;
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
static const char *sg_gpu_var(spank_t sp)
{
    uint32_t step = 0;
    if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
        return NULL;
    return (step == SG_BATCH_STEP || step == SG_INTERACTIVE_STEP)
        ? "SLURM_JOB_GPUS" : "SLURM_STEP_GPUS";
}

/* Only steps that asked for GPU work, or that hold GPUs while binding is
 * on, pay for the interpreter. */
static int sg_step_needs_python(spank_t sp, int ac, char **av)
{
    const char *prof = sg_values[SG_OPT_PROFILE];
    const char *var;
    if (sg_values[SG_OPT_MPS] || sg_values[SG_OPT_MIG])
        return 1;
    if (prof && strcmp(prof, "none") != 0)
        return 1;
    if (!sg_numa_active(ac, av))
        return 0;
    /* step id unknown: let Python decide (and report) rather than guess */
    var = sg_gpu_var(sp);
    return !var || sg_env_nonempty(sp, var);
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

static int sg_all_canonical(void)
{
    int i;
    for (i = 0; i < SG_NOPTS; i++)
        if (sg_values[i] && !sg_canonical(i, sg_values[i]))
            return 0;
    return 1;
}

/* What slurm_gpu/spank/local.py init_post_opt does, for canonical values
 * only (no prolog gate: none of these options gives the prolog work). */
static int sg_pass_to_prolog(spank_t sp)
{
    static const char *names[SG_NOPTS] = SG_ENV_NAMES;
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

/* Tasks see the options they were started with, without Python. */
static int sg_export_options(spank_t sp)
{
    static const char *names[SG_NOPTS] = SG_ENV_NAMES;
    int i;
    for (i = 0; i < SG_NOPTS; i++)
        if (sg_values[i] && spank_setenv(sp, names[i], sg_values[i], 1) != ESPANK_SUCCESS) {
            slurm_error("slurm-gpu: cannot set %s in the job environment", names[i]);
            return -1;
        }
    return 0;
}

/* ---- prefer binding without Python (sg_bind.c) ---- */

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

/* What sg_plan reads exactly as binding.py does (sg_bind.c sg_plain_env;
 * unset counts as plain; a value too long to read does not: Python's
 * init_post_opt would not bind at all). */
static int sg_plain_var(spank_t sp, const char *name)
{
    int unset, ok;
    char *v = sg_getenv_dup(sp, name, &unset);
    if (!v)
        return unset;
    ok = sg_plain_env(v);
    free(v);
    return ok;
}

/* The step's only Python work would be plain prefer binding: mode prefer
 * without verbose (the user's exact "prefer", else the admin's exact
 * default), no other option, a known step id, and its GPU variables plain. */
static int sg_c_bind_eligible(spank_t sp, int ac, char **av)
{
    const char *user = sg_values[SG_OPT_NUMA_BIND], *admin = sg_arg(ac, av, "numa_bind");
    const char *prof = sg_values[SG_OPT_PROFILE], *var;
    if (sg_values[SG_OPT_MPS] || sg_values[SG_OPT_MIG] || (prof && strcmp(prof, "none")))
        return 0;
    if (user ? strcmp(user, "prefer") : (!admin || strcmp(admin, "prefer")))
        return 0;
    if (!(var = sg_gpu_var(sp)))
        return 0;
    return sg_plain_var(sp, var) && sg_plain_var(sp, "CUDA_VISIBLE_DEVICES")
        && sg_plain_var(sp, "SLURM_GPUS_PER_TASK");
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
static int sg_c_bind_load(int ac, char **av)
{
    char node[256], gres[PATH_MAX], key[PATH_MAX * 2 + 512], name[512];
    const char *env = getenv("SLURMD_NODENAME"), *config = sg_arg(ac, av, "config"), *g;
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
    if (sg_table_name(SG_FACTS_KEY_PREFIX, node, config ? config : "", g, key, sizeof(key),
                      name, sizeof(name)))
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

static spank_err_t sg_setenv_rc;

static int sg_spank_setenv(void *ctx, const char *name, const char *value)
{
    sg_setenv_rc = spank_setenv((spank_t) ctx, name, value, 1);
    return sg_setenv_rc == ESPANK_SUCCESS ? 0 : -1;
}

static const char *sg_spank_setenv_error(void *ctx)
{
    (void) ctx;
    return spank_strerror(sg_setenv_rc);
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
static int sg_c_bind_task(spank_t sp)
{
    struct sg_ops ops = { sg_sys_getaffinity, sg_sys_get_mempolicy, sg_sys_setaffinity,
                          sg_sys_set_mempolicy, sg_spank_setenv, sg_spank_setenv_error,
                          sg_slurm_error, sg_stderr, NULL };
    struct sg_task_in in;
    const char *var = sg_gpu_var(sp);
    char *step = NULL, *cvd = NULL, *per = NULL;
    uint32_t ntasks = 0;
    int task = 0, unset, rc = -1;
    memset(&in, 0, sizeof(in));
    ops.ctx = sp;
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

/* ---- option callback ---- */

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
    if (sg_python("option parsing") != 0)
        return -1;
    return sg_py_option(val, remote);
}

/* Start Python if needed and hand the hook to the dispatcher. */
static int sg_forward(const char *where, int hook, spank_t sp, int ac, char **av)
{
    if (sg_python(where) != 0)
        return -1;
    return sg_py_hook(hook, sp, ac, av);
}

/* In a task of a step whose Python could not start: one line for the user. */
static int sg_py_unavailable(void)
{
    static int said;                 /* per task: each task is its own process */
    if (!said)
        slurm_error("slurm-gpu: the plugin's Python could not start on this node "
                    "(see the node's slurmd log): the step cannot run");
    said = 1;
    return -1;
}

/* ---- SPANK hooks (the only exported functions besides plugin_*) ---- */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();
    int i;
    if (sg_check_args(ac, av) != 0) {
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
            sg_bad_args = 1;
        else
#endif
        return -1;
    }
    if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR && ctx != S_CTX_REMOTE)
        return 0;  /* slurmd, job script: nothing to do, no Python */
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

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();
    if (ctx == S_CTX_REMOTE && sg_bad_args)
        return 0;                   /* no Python; the tasks fail in task_init */
    if (ctx == S_CTX_REMOTE) {
        /*
         * The step's Python work starts here, not in user_init: slurmstepd
         * calls init_post_opt as root in its own working directory, but
         * user_init only after it has switched its effective uid to the job
         * user and chdir()ed into the job's directory.  Reading the node's
         * config and the root-only cache in /run needs root, and nothing
         * of the job user's should be in play while the interpreter starts.
         */
        sg_py_wanted = sg_step_needs_python(sp, ac, av);
        if (!sg_py_wanted)
            return 0;
        /* a plain prefer step binds from the table, without the interpreter;
         * anything the table or sg_bind.c does not cover goes to Python */
        if (sg_c_bind_eligible(sp, ac, av) && sg_c_bind_load(ac, av) == 0) {
            sg_c_bind = 1;
            sg_py_wanted = 0;
            return 0;
        }
        if (sg_forward("init_post_opt", SG_HOOK_INIT_POST_OPT, sp, ac, av) == 0)
            return 0;
        /* The interpreter did not start here (venv removed or unreadable,
         * inner half missing: said why above, in the node's log).  Failing
         * this hook would fail the batch step's launch, and slurmctld would
         * drain the node; the tasks fail instead (sg_py_unavailable). */
        return sg_py_state == -1 ? 0 : -1;
    }
    if ((ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR) || !sg_any_option())
        return 0;
    if (sg_py_state == 0 && sg_all_canonical())
        return sg_pass_to_prolog(sp);
    return sg_forward("init_post_opt", SG_HOOK_INIT_POST_OPT, sp, ac, av);
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void) ac;
    (void) av;
    if (spank_context() != S_CTX_REMOTE)
        return 0;
    return sg_export_options(sp);
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    if (!sg_py_wanted || spank_context() != S_CTX_REMOTE)
        return 0;
    if (sg_py_state == -1)
        return sg_py_unavailable();
    return sg_forward("task_init_privileged", SG_HOOK_TASK_PRIV, sp, ac, av);
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    if (sg_bad_args && spank_context() == S_CTX_REMOTE) {
        slurm_error("slurm-gpu: plugstack.conf has bad slurm-gpu arguments on this node "
                    "(see the node's slurmd log): the step cannot run");
        return -1;
    }
    if (sg_c_bind && spank_context() == S_CTX_REMOTE)
        return sg_c_bind_task(sp);
    if (!sg_py_wanted || spank_context() != S_CTX_REMOTE)
        return 0;
    if (sg_py_state == -1)
        return sg_py_unavailable();
    return sg_forward("task_init", SG_HOOK_TASK_INIT, sp, ac, av);
}
