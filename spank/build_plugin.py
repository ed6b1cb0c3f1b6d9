"""Build the slurm-gpu SPANK plugin: two shared objects, on the node.

Run by ``slurm-gpu spank build`` with the venv's interpreter, against the
node's own ``slurm/spank.h`` (Slurm refuses plugins built for another
major.minor, so the plugin is never shipped prebuilt):

* ``slurm_gpu_spank.so`` (outer, plain C, the file plugstack.conf names):
  options, the decision whether Python is needed, nothing else.  It is not
  linked to libpython, so slurmd and steps without our options never map it.
* ``slurm_gpu_spank_py.so`` (inner, cffi embedding + libpython), loaded by the
  outer half next to itself only when needed.

The cffi that compiles the inner half is the venv's, and the embedded
interpreter imports ``_cffi_backend`` from the same venv (sys.path is pinned
to the venv interpreter's own isolated path at build time); the Python side
also checks the backend version at start.
"""
from __future__ import annotations

import ast
import os
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTER = "slurm_gpu_spank"
INNER = "slurm_gpu_spank_py"

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
int sg_set_mempolicy(int mode, const unsigned long *nodemask, unsigned long maxnode);
int sg_get_mempolicy(int *mode, unsigned long *nodemask, unsigned long maxnode);
int sg_thp_disable(void);
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


def _c_string(s: str) -> str:
    if any(c in s for c in '"\\\n') or not s.isprintable():
        raise ValueError(f"unsupported character in path: {s!r}")
    return f'"{s}"'


PREFIXES = ("prefix", "exec_prefix", "base_prefix", "base_exec_prefix")


def isolated_config(python: str) -> tuple[list[str], dict[str, str]]:
    """``sys.path`` and prefixes of ``python -I``: stdlib, the venv's site-packages."""
    from slurm_gpu.runner import run
    res = run([python, "-I", "-c",
               "import sys; print(repr((sys.path, [getattr(sys, p) for p in %r])))" % (PREFIXES,)],
              timeout=60)
    path, prefixes = ast.literal_eval(res.stdout.strip())
    paths = [p for p in path if p]
    if not any(p.endswith("site-packages") for p in paths):
        raise RuntimeError(f"{python} -I has no site-packages on sys.path: {paths}")
    return paths, dict(zip(PREFIXES, prefixes))


def build_outer(output: Path, *, include_dir: str | None = None) -> Path:
    """Compile the plain-C outer half with gcc (through the command runner)."""
    from slurm_gpu.runner import run
    argv = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror",
            f"-Wl,--version-script={HERE / 'exports.map'}", "-Wl,-z,now",
            "-o", str(output), str(HERE / "slurm_gpu_spank.c"), "-ldl"]
    if include_dir:
        argv.insert(1, f"-I{include_dir}")
    run(argv, timeout=300)
    return output


def build_inner(output: Path, *, python: str, include_dir: str | None = None,
                tmpdir: Path, verbose: bool = False, sys_path: list[str] | None = None) -> Path:
    """Compile the cffi embedding half that hosts the interpreter.

    *sys_path* overrides the interpreter's path (tests use it to build a
    plugin whose interpreter cannot start).
    """
    import cffi
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    ffi.embedding_api(EMBEDDING_API)
    paths, prefixes = isolated_config(python)
    if sys_path is not None:
        paths = sys_path
    source = (f"#define SG_PYTHON {_c_string(python)}\n"
              f"#define SG_PATHS {{ {', '.join(_c_string(p) for p in paths)}, NULL }}\n"
              + "".join(f"#define SG_{k.upper()} {_c_string(v)}\n" for k, v in prefixes.items())
              + (HERE / "slurm_gpu_spank_py.c").read_text())
    ffi.set_source(
        INNER, source,
        include_dirs=[include_dir] if include_dir else [],
        extra_compile_args=["-O2"],
        extra_link_args=[f"-Wl,--version-script={HERE / 'exports_py.map'}", "-Wl,-z,now",
                         "-Wl,-rpath," + (sysconfig.get_config_var("LIBDIR") or "")],
    )
    ffi.embedding_init_code(INIT_CODE.format(module=INNER, cffi_version=cffi.__version__))
    built = Path(ffi.compile(tmpdir=str(tmpdir), target=INNER + ".so", verbose=verbose))
    os.replace(built, output)
    return output


def build(output: str | os.PathLike[str], *, python: str | None = None,
          include_dir: str | None = None, tmpdir: str | None = None,
          verbose: bool = False, sys_path: list[str] | None = None) -> Path:
    """Build both halves; *output* is the outer .so, the inner lands beside it.

    *python* is the venv interpreter the plugin embeds (default: this one).
    Both files are renamed into place, so running steps keep their mapping.
    """
    output = Path(output).resolve()
    python = python or sys.executable
    if not os.path.isabs(python):
        raise ValueError(f"interpreter path must be absolute: {python}")
    tmp = Path(tmpdir) if tmpdir else output.parent / f".{OUTER}.build"
    tmp.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    inner = output.with_name(INNER + ".so")
    tmp_inner = build_inner(tmp / (INNER + ".so.new"), python=python, include_dir=include_dir,
                            tmpdir=tmp, verbose=verbose, sys_path=sys_path)
    tmp_outer = build_outer(tmp / (OUTER + ".so.new"), include_dir=include_dir)
    for src, dst in ((tmp_inner, inner), (tmp_outer, output)):
        os.chmod(src, 0o755)
        staged = dst.with_name(f".{dst.name}.tmp")
        os.replace(src, staged) if src.parent == dst.parent else _copy(src, staged)
        os.replace(staged, dst)
    return output


def _copy(src: Path, dst: Path) -> None:
    import shutil
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755)


if __name__ == "__main__":
    import argparse
    sys.path.insert(0, str(HERE.parent))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    print(build(a.output, python=a.python, verbose=a.verbose))
