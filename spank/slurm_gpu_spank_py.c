/*
 * slurm-gpu SPANK plugin, inner half: cffi embedding + libpython.
 *
 * Loaded by the outer half (sg_python.c) with dlopen(RTLD_GLOBAL) only
 * when a hook needs Python.  cffi's embedding API compiles this file with the
 * generated glue; the Python side is slurm_gpu.spank.dispatch.
 *
 * The build script (spank/build_plugin.py) defines before this file:
 *   SG_PYTHON   absolute path of the venv interpreter (program name: its
 *               pyvenv.cfg makes sys.prefix the venv)
 *   SG_PATHS    NULL-terminated initialiser of sys.path entries: the venv
 *               interpreter's stdlib and site-packages at build time
 *   SG_PREFIX, SG_EXEC_PREFIX, SG_BASE_PREFIX, SG_BASE_EXEC_PREFIX
 *               that interpreter's sys.prefix etc. (pinning sys.path would
 *               otherwise make sys.prefix the base /usr, not the venv)
 *   SG_INNER_MARKER, SG_VERSION
 *               a record of SG_PYTHON and the slurm-gpu version that built
 *               this file, for `slurm-gpu doctor` (slurm_gpu/doctor.py)
 */
#include <slurm/spank.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <wchar.h>

#include "sg_api.h"           /* struct sg_outer_api, struct sg_args (cffi cdef) */
#include "sg_bind.h"          /* the planner, for the Python path (cffi cdef) */

/* Defined by cffi's generated code (ffi.embedding_api in build_plugin.py). */
int sg_py_hook(int hook, spank_t sp);
int sg_py_option(int which, int remote);

static const struct sg_outer_api *sg_outer;
__attribute__((used)) static const char sg_inner_marker[] =
    SG_INNER_MARKER SG_PYTHON " version=" SG_VERSION;
static const char *sg_paths[] = SG_PATHS;

/* Exported to Python through the cffi cdef. */
const char *sg_option_value(int which)
{
    return sg_outer ? sg_outer->option_value(which) : NULL;
}

/* The plugstack arguments as the outer half parsed them at init: Python
 * reads these, never the argv (cffi cdef). */
const struct sg_args *sg_plugstack_args(void)
{
    static const struct sg_args none = { NULL, "off", 0, 0 };
    return sg_outer && sg_outer->args ? sg_outer->args : &none;
}

/*
 * System calls the task setup makes, for the Python side (cffi cdef): glibc
 * wraps neither set_mempolicy nor get_mempolicy, and doing them here spares
 * every bound task the import of ctypes.  They return 0 or an errno.
 */
int sg_set_mempolicy(int mode, const unsigned long *nodemask, unsigned long maxnode)
{
    return syscall(SYS_set_mempolicy, mode, nodemask, maxnode) == 0 ? 0 : errno;
}

int sg_get_mempolicy(int *mode, unsigned long *nodemask, unsigned long maxnode)
{
    return syscall(SYS_get_mempolicy, mode, nodemask, maxnode, 0UL, 0UL) == 0 ? 0 : errno;
}

int sg_thp_disable(void)
{
    return prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 ? 0 : errno;
}

/*
 * The outer half opened us RTLD_GLOBAL, but libpython came in as our
 * dependency: make sure its symbols are global too, or extension modules
 * (_cffi_backend, _json, ...) fail with "undefined symbol: PyExc_SystemError".
 */
__attribute__((constructor)) static void sg_promote_libpython(void)
{
    Dl_info info;
    if (dladdr((void *) &Py_InitializeFromConfig, &info) && info.dli_fname)
        dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
}

static PyStatus sg_config(PyConfig *cfg)
{
    PyStatus st;
    int i;
    /* isolated: PYTHONPATH, PYTHONHOME, PYTHONSTARTUP... and the user site
     * of the job user are ignored */
    PyConfig_InitIsolatedConfig(cfg);
    cfg->install_signal_handlers = 0;   /* signals belong to srun/slurmstepd */
    cfg->parse_argv = 0;
    cfg->write_bytecode = 0;            /* job users cannot write the venv */
    cfg->site_import = 0;               /* sys.path is pinned below: no .pth */
    cfg->user_site_directory = 0;
    st = PyConfig_SetBytesString(cfg, &cfg->program_name, SG_PYTHON);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(cfg, &cfg->executable, SG_PYTHON);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(cfg, &cfg->prefix, SG_PREFIX);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(cfg, &cfg->exec_prefix, SG_EXEC_PREFIX);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(cfg, &cfg->base_prefix, SG_BASE_PREFIX);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(cfg, &cfg->base_exec_prefix, SG_BASE_EXEC_PREFIX);
    cfg->module_search_paths_set = 1;
    for (i = 0; !PyStatus_Exception(st) && sg_paths[i]; i++) {
        wchar_t *w = Py_DecodeLocale(sg_paths[i], NULL);
        if (!w)
            return PyStatus_Error("cannot decode a sys.path entry");
        st = PyWideStringList_Append(&cfg->module_search_paths, w);
        PyMem_RawFree(w);
    }
    return st;
}

/* Start Python (once) and run the embedding init code.  0 or -1. */
int sg_inner_start(const char *where, const struct sg_outer_api *api)
{
    if (!api || api->version != SG_API_VERSION) {
        slurm_error("slurm-gpu: plugin halves do not match (rebuild with slurm-gpu spank build)");
        return -1;
    }
    sg_outer = api;
    if (!Py_IsInitialized()) {
        PyConfig cfg;
        PyStatus st = sg_config(&cfg);
        if (!PyStatus_Exception(st))
            st = Py_InitializeFromConfig(&cfg);
        PyConfig_Clear(&cfg);
        if (PyStatus_Exception(st)) {
            slurm_error("slurm-gpu: cannot start Python (%s) in %s: %s: %s",
                        SG_PYTHON, where, st.func ? st.func : "?",
                        st.err_msg ? st.err_msg : "?");
            return -1;
        }
        PyEval_SaveThread();             /* cffi expects the GIL released */
    }
    if (cffi_start_python() != 0) {      /* runs the embedding init code */
        slurm_error("slurm-gpu: cannot load the Python side of the plugin in %s "
                    "(is slurm-gpu installed in the venv of %s?)", where, SG_PYTHON);
        return -1;
    }
    return 0;
}

int sg_inner_hook(int hook, spank_t sp)
{
    return sg_py_hook(hook, sp);
}

int sg_inner_option(int which, int remote)
{
    return sg_py_option(which, remote);
}
