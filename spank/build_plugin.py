"""Build the slurm-gpu SPANK plugin with cffi's embedding API.

Run by ``slurm-gpu spank build`` with the venv's interpreter, on the node,
against the node's own ``slurm/spank.h`` (Slurm refuses plugins built for
another major.minor, so the plugin is never shipped prebuilt).

The cffi that compiles the plugin is the venv's cffi, and the embedded
interpreter imports ``_cffi_backend`` from the same venv (its prefix is
pinned to the venv's python), so the two always match; the Python side also
checks the backend version at start.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
MODULE = "slurm_gpu_spank"

# The part of spank.h the Python side calls.  Enums declared with "..." take
# their values from the real header at compile time.
CDEF = r"""
typedef struct spank_handle * spank_t;
typedef enum { ESPANK_SUCCESS, ESPANK_ERROR, ESPANK_NOSPACE, ESPANK_NOT_AVAIL,
               ... } spank_err_t;
typedef enum { S_CTX_ERROR, S_CTX_LOCAL, S_CTX_REMOTE, S_CTX_ALLOCATOR,
               S_CTX_SLURMD, S_CTX_JOB_SCRIPT, ... } spank_context_t;
typedef enum { S_JOB_UID, S_JOB_GID, S_JOB_ID, S_JOB_STEPID, S_JOB_NNODES,
               S_JOB_NODEID, S_JOB_LOCAL_TASK_COUNT, S_JOB_TOTAL_TASK_COUNT,
               S_TASK_ID, S_TASK_GLOBAL_ID, S_TASK_PID, ... } spank_item_t;

spank_context_t spank_context(void);
const char *spank_strerror(spank_err_t err);
spank_err_t spank_get_item(spank_t spank, spank_item_t item, ...);
spank_err_t spank_getenv(spank_t spank, const char *var, char *buf, int len);
spank_err_t spank_setenv(spank_t spank, const char *var, const char *val, int overwrite);
spank_err_t spank_unsetenv(spank_t spank, const char *var);
spank_err_t spank_job_control_setenv(spank_t sp, const char *name, const char *value,
                                     int overwrite);
void slurm_info(const char *format, ...);
void slurm_error(const char *format, ...);
void slurm_verbose(const char *format, ...);
void slurm_debug(const char *format, ...);

const char *sg_option_value(int which);
const char *sg_option_name(int which);
"""

EMBEDDING_API = r"""
int sg_py_hook(int hook, spank_t sp, int ac, char **av);
int sg_py_option(int which, int remote);
"""

INIT_CODE = r"""
import _cffi_backend
from {module} import ffi, lib
if _cffi_backend.__version__ != {cffi_version!r}:
    raise ImportError("slurm-gpu: plugin built with cffi {cffi_version} but the interpreter "
                      "imports _cffi_backend " + _cffi_backend.__version__ + ": rebuild it")
from slurm_gpu.spank import dispatch
dispatch.attach(ffi, lib)
"""


def build(output: str | os.PathLike[str], *, python: str | None = None,
          include_dir: str | None = None, tmpdir: str | None = None,
          verbose: bool = False) -> Path:
    """Compile the plugin to *output* and return its path.

    *python* is the interpreter whose venv the plugin embeds (default: this
    one).  *include_dir* holds ``slurm/spank.h`` (default: the system's).
    """
    output = Path(output).resolve()
    python = python or sys.executable
    if not os.path.isabs(python):
        raise ValueError(f"interpreter path must be absolute: {python}")
    tmp = Path(tmpdir) if tmpdir else output.parent / f".{MODULE}.build"
    tmp.mkdir(parents=True, exist_ok=True)
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    ffi.embedding_api(EMBEDDING_API)
    glue = (HERE / "slurm_gpu_spank.c").read_text()
    source = f'#define SG_PYTHON "{_c_escape(python)}"\n' + glue
    include_dirs = [include_dir] if include_dir else []
    ffi.set_source(
        MODULE, source,
        include_dirs=include_dirs,
        extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
        extra_link_args=[f"-Wl,--version-script={HERE / 'exports.map'}",
                         "-Wl,-z,now", "-Wl,-rpath," + (sysconfig.get_config_var("LIBDIR") or "")],
    )
    ffi.embedding_init_code(INIT_CODE.format(module=MODULE, cffi_version=cffi.__version__))
    built = Path(ffi.compile(tmpdir=str(tmp), target=MODULE + ".so", verbose=verbose))
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = output.with_name(f".{output.name}.tmp")
    os.replace(built, tmp_out)
    os.chmod(tmp_out, 0o755)
    # rename: processes that have the old plugin mapped keep their copy
    os.replace(tmp_out, output)
    return output


def _c_escape(s: str) -> str:
    if any(c in s for c in '"\\\n'):
        raise ValueError(f"unsupported character in path: {s!r}")
    return s


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    print(build(a.output, python=a.python, verbose=a.verbose))
