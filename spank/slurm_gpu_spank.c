/*
 * slurm-gpu SPANK shim: the C half of the plugin.
 *
 * cffi's embedding API compiles this file together with the Python
 * dispatcher (slurm_gpu.spank.dispatch).  The shim only
 *   - registers the options (so srun, sbatch and salloc all see them),
 *   - stores option values in C,
 *   - decides cheaply whether Python is needed at all, and
 *   - starts an isolated interpreter itself and forwards the hook to ONE
 *     Python entry point (sg_py_hook / sg_py_option).
 * Python never starts in slurmd, never in srun/sbatch/salloc unless one of
 * our options was given, and in slurmstepd only for steps that need it.
 *
 * The build script (spank/build_plugin.py) defines before this file:
 *   SG_PYTHON   absolute path of the venv interpreter whose prefix, stdlib
 *               and site-packages the embedded interpreter uses.
 */
#include <slurm/spank.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* exports plugin_name, plugin_type, plugin_version, spank_plugin_version */
SPANK_PLUGIN(slurm_gpu, 1)

/* Keep in sync with slurm_gpu/spank/options.py (OPTION_IDS). */
#define SG_OPT_NUMA_BIND 0
#define SG_OPT_PROFILE   1
#define SG_OPT_MPS       2
#define SG_OPT_MIG       3
#define SG_NOPTS         4

/* Keep in sync with slurm_gpu/spank/dispatch.py (HOOKS). */
#define SG_HOOK_INIT_POST_OPT 1
#define SG_HOOK_USER_INIT     2
#define SG_HOOK_TASK_PRIV     3
#define SG_HOOK_TASK_INIT     4

/* Plugstack argument keys; anything else is a configuration error. */
static const char *sg_arg_keys[] = { "config", "numa_bind", NULL };

/* Provided by cffi's generated code (embedding API, see build_plugin.py). */
int sg_py_hook(int hook, spank_t sp, int ac, char **av);
int sg_py_option(int which, int remote);

static char *sg_values[SG_NOPTS];   /* option values; NULL = not given */
static int sg_py_state;             /* 0 = not started, 1 = ok, -1 = failed */
static int sg_py_wanted;            /* remote: this step runs Python hooks */

static int sg_opt_cb(int val, const char *optarg, int remote);

static struct spank_option sg_options[SG_NOPTS] = {
    { "gpu-numa-bind", "strict|prefer|off[,verbose]",
      "[slurm-gpu] Bind each task's CPUs and memory to its GPU's NUMA node(s): "
      "strict (MPOL_BIND, fail if impossible), prefer (MPOL_PREFERRED, warn if "
      "impossible) or off; add ',verbose' to print the binding of each task.",
      1, SG_OPT_NUMA_BIND, sg_opt_cb },
    { "gpu-profile", "training|inference|none",
      "[slurm-gpu] Per-task OS tuning for GPU work: inference turns transparent "
      "huge pages off, training keeps them; both raise the locked-memory limit "
      "for pinned host memory.",
      1, SG_OPT_PROFILE, sg_opt_cb },
    { "gpu-mps", "PERCENT",
      "[slurm-gpu] Start a private CUDA MPS daemon for this job on each node, "
      "optionally with a default active-thread percentage (1-100).",
      2, SG_OPT_MPS, sg_opt_cb },
    { "gpu-mig", "LAYOUT",
      "[slurm-gpu] Partition each of the job's whole GPUs into MIG instances, "
      "e.g. 3g.40gb,2g.20gb,2g.20gb; each task gets its own instance(s).",
      1, SG_OPT_MIG, sg_opt_cb },
};

/* ---- accessors for the Python side (declared in the cffi cdef) ---- */

const char *sg_option_value(int which)
{
    if (which < 0 || which >= SG_NOPTS)
        return NULL;
    return sg_values[which];
}

const char *sg_option_name(int which)
{
    if (which < 0 || which >= SG_NOPTS)
        return NULL;
    return sg_options[which].name;
}

/* ---- interpreter start ---- */

/*
 * Slurm dlopen()s plugins RTLD_LAZY|RTLD_LOCAL, so libpython's symbols are
 * invisible to extension modules (_cffi_backend, _json, ...) and importing
 * them fails with "undefined symbol: PyExc_SystemError".  Promote libpython
 * to the global namespace before anything runs.
 */
__attribute__((constructor)) static void sg_promote_libpython(void)
{
    Dl_info info;
    if (dladdr((void *) &Py_InitializeFromConfig, &info) && info.dli_fname)
        dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
}

/*
 * Start Python ourselves with an isolated configuration: the job user's
 * PYTHONPATH, PYTHONHOME, PYTHONSTARTUP... and user site are ignored, and
 * the prefix is pinned to the venv the plugin was built from (its
 * pyvenv.cfg makes sys.prefix the venv, exactly like `venv/bin/python -I`).
 * A failure is an error returned to Slurm, never an exit() of the host
 * process and never cffi's silent "returns 0".
 */
static int sg_python(const char *where)
{
    if (sg_py_state != 0)
        return sg_py_state == 1 ? 0 : -1;
    sg_py_state = -1;
    if (!Py_IsInitialized()) {
        PyConfig cfg;
        PyStatus st;
        PyConfig_InitIsolatedConfig(&cfg);
        cfg.install_signal_handlers = 0;  /* signals belong to srun/slurmstepd */
        cfg.parse_argv = 0;
        cfg.write_bytecode = 0;           /* job users cannot write the venv */
        st = PyConfig_SetBytesString(&cfg, &cfg.program_name, SG_PYTHON);
        if (!PyStatus_Exception(st))
            st = PyConfig_SetBytesString(&cfg, &cfg.executable, SG_PYTHON);
        if (!PyStatus_Exception(st))
            st = Py_InitializeFromConfig(&cfg);
        PyConfig_Clear(&cfg);
        if (PyStatus_Exception(st)) {
            slurm_error("slurm-gpu: cannot start Python (%s) in %s: %s: %s",
                        SG_PYTHON, where, st.func ? st.func : "?",
                        st.err_msg ? st.err_msg : "?");
            return -1;
        }
        PyEval_SaveThread();              /* cffi expects the GIL released */
    }
    if (cffi_start_python() != 0) {       /* runs the embedding init code */
        slurm_error("slurm-gpu: cannot load the Python side of the plugin "
                    "in %s (is slurm-gpu installed in the venv of %s?)",
                    where, SG_PYTHON);
        return -1;
    }
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
                        "(known: config=PATH numa_bind=strict|prefer|off)",
                        av[i]);
            return -1;
        }
    }
    return 0;
}

/* Does the comma-separated list contain exactly this token? */
static int sg_has_token(const char *list, const char *tok)
{
    size_t n = strlen(tok);
    const char *p = list;
    while (p && *p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t) (end - p) : strlen(p);
        if (len == n && strncmp(p, tok, n) == 0)
            return 1;
        p = end ? end + 1 : NULL;
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

/* Only steps that asked for GPU work, or that hold GPUs while binding is
 * on, pay for the interpreter. */
static int sg_step_needs_python(spank_t sp, int ac, char **av)
{
    const char *prof = sg_values[SG_OPT_PROFILE];
    if (sg_values[SG_OPT_MPS] || sg_values[SG_OPT_MIG])
        return 1;
    if (prof && strcmp(prof, "none") != 0)
        return 1;
    if (sg_numa_active(ac, av))
        return sg_env_nonempty(sp, "SLURM_STEP_GPUS")
            || sg_env_nonempty(sp, "SLURM_JOB_GPUS")
            || sg_env_nonempty(sp, "CUDA_VISIBLE_DEVICES");
    return 0;
}

/* Tasks see the options they were started with, without Python. */
static int sg_export_options(spank_t sp)
{
    static const char *names[SG_NOPTS] = {
        "SLURM_GPU_NUMA_BIND", "SLURM_GPU_PROFILE", "SLURM_GPU_MPS", "SLURM_GPU_MIG" };
    int i;
    for (i = 0; i < SG_NOPTS; i++)
        if (sg_values[i] && spank_setenv(sp, names[i], sg_values[i], 1) != ESPANK_SUCCESS) {
            slurm_error("slurm-gpu: cannot set %s in the job environment", names[i]);
            return -1;
        }
    return 0;
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
    if (sg_python("option parsing") != 0)
        return -1;
    return sg_py_option(val, remote);
}

/* ---- SPANK hooks (the only exported functions besides plugin_*) ---- */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();
    int i;
    if (sg_check_args(ac, av) != 0)
        return -1;
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
    if ((ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR) || !sg_any_option())
        return 0;
    if (sg_python("init_post_opt") != 0)
        return -1;
    return sg_py_hook(SG_HOOK_INIT_POST_OPT, sp, ac, av);
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    if (spank_context() != S_CTX_REMOTE)
        return 0;
    if (sg_export_options(sp) != 0)
        return -1;
    sg_py_wanted = sg_step_needs_python(sp, ac, av);
    if (!sg_py_wanted)
        return 0;
    if (sg_python("user_init") != 0)
        return -1;
    return sg_py_hook(SG_HOOK_USER_INIT, sp, ac, av);
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    if (!sg_py_wanted || spank_context() != S_CTX_REMOTE)
        return 0;
    if (sg_python("task_init_privileged") != 0)
        return -1;
    return sg_py_hook(SG_HOOK_TASK_PRIV, sp, ac, av);
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    if (!sg_py_wanted || spank_context() != S_CTX_REMOTE)
        return 0;
    if (sg_python("task_init") != 0)
        return -1;
    return sg_py_hook(SG_HOOK_TASK_INIT, sp, ac, av);
}
