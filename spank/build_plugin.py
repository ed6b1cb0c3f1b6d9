"""Build the slurm-gpu SPANK plugin: two shared objects, on the node.

Run by ``slurm-gpu spank build`` with the venv's interpreter, against the
node's own ``slurm/spank.h`` (Slurm refuses plugins built for another
major.minor, so the plugin is never shipped prebuilt):

* ``slurm_gpu_spank.so`` (outer, plain C, the file plugstack.conf names,
  built from :data:`OUTER_SOURCES`): options, the decision whether Python is
  needed, plain prefer binding, nothing else.  It is not
  linked to libpython, so slurmd and steps without our options never map it.
* ``slurm_gpu_spank_py.so`` (inner, cffi embedding + libpython), loaded by the
  outer half next to itself only when needed.

Both hold ``sg_bind.c``, the binding planner: the outer half calls it for a
plain prefer step, the Python path through cffi (:data:`PLANNER_CDEF`,
:mod:`slurm_gpu.binding`).  :func:`build_planner` compiles it alone into a
cffi module, for the tests and tools that plan outside the plugin.

The outer half's option table, ``SG_OPT_*`` ids and the facts about the
Slurm it is built for come from a header generated here (``sg_build.h``,
:func:`generate_header`) from the one declaration in
``slurm_gpu/joboptions.py`` and the node's ``slurm/*.h``.

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
from typing import Any

HERE = Path(__file__).resolve().parent
OUTER = "slurm_gpu_spank"
INNER = "slurm_gpu_spank_py"
# The outer half, one file per context (spank/sg_plugin.h says which is which).
OUTER_SOURCES = ("sg_dispatch.c", "sg_args.c", "sg_options.c", "sg_local.c", "sg_remote.c",
                 "sg_cbind.c", "sg_python.c", "sg_bind.c")

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
struct sg_args { const char *config; const char *numa_mode; int numa_verbose; ...; };
const struct sg_args *sg_plugstack_args(void);
int sg_set_mempolicy(int mode, const unsigned long *nodemask, unsigned long maxnode);
int sg_get_mempolicy(int *mode, unsigned long *nodemask, unsigned long maxnode);
int sg_thp_disable(void);
"""

# The planner (spank/sg_bind.h) as the Python path calls it.
PLANNER_CDEF = r"""
#define SG_BIND_NBYTES ...
#define SG_BIND_HOSTBITS ...
#define SG_MODE_OFF ...
#define SG_MODE_PREFER ...
#define SG_MODE_STRICT ...
struct sg_table { ...; };
struct sg_str { char *buf; ...; };
struct sg_task_in {
    const char *step_gpus;
    const char *cvd;
    const char *per_task;
    int mode;
    int task;
    unsigned ntasks;
    const unsigned char *allowed;
    const unsigned char *bound_host;
    ...;
};
struct sg_plan {
    int applied;
    int failed;
    struct sg_str message;
    struct sg_str env;
    struct sg_str slots;
    struct sg_str cpus_text;
    struct sg_str mems_text;
    struct sg_str host_text;
    ...;
};
int sg_table_rows(struct sg_table *t, const char *text);
void sg_table_free(struct sg_table *t);
int sg_plan(const struct sg_table *t, const struct sg_task_in *in, struct sg_plan *out);
void sg_plan_free(struct sg_plan *p);
"""
PLANNER_SOURCE = "sg_bind.c"
PLANNER_MODULE = "_sg_planner"

EMBEDDING_API = r"""
int sg_py_hook(int hook, spank_t sp);
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


GENERATED = "sg_build.h"
MARKER = "slurm-gpu-spank built-for-slurm="   # doctor reads the version after it
# doctor reads the interpreter the inner half starts, and the slurm-gpu that
# built it, after this (a copy outside the venv names a tree an upgrade removes)
INNER_MARKER = "slurm-gpu-spank-py python="


def _c(s: str) -> str:
    """A C string literal (ASCII only; JSON's escapes for quote and backslash are C's)."""
    import json
    if not s.isascii() or not s.isprintable():
        raise ValueError(f"unsupported character in {s!r}")
    return json.dumps(s)


def slurm_facts(include_dir: str | None = None) -> dict[str, object]:
    """The Slurm the plugin is compiled against: version, libslurm API, init failure mode."""
    from slurm_gpu import slurmversion
    inc = Path(include_dir or "/usr/include")
    version = slurmversion.from_header(inc)
    if version is None:
        raise RuntimeError(f"no SLURM_VERSION_NUMBER in {inc}/slurm/slurm_version.h")
    api = slurmversion.api_of(version)
    spank_h = (inc / "slurm" / "spank.h").read_text()
    return {"version": version, "api": api or 0,
            # Slurm >= 25.05: spank.h declares it (CHANGELOG/slurm-25.05.md)
            "init_failure_mode": "slurm_spank_init_failure_mode" in spank_h}


def generate_header(include_dir: str | None = None) -> str:
    """``sg_build.h``: the option table from ``slurm_gpu.joboptions.OPTIONS``, the
    plugstack keys, and the Slurm this build is for."""
    from slurm_gpu import slurmversion
    from slurm_gpu import joboptions as o
    facts = slurm_facts(include_dir)
    lines = ["/* generated by spank/build_plugin.py from slurm_gpu/joboptions.py and the",
             " * node's slurm headers: do not edit */"]
    ids = sorted(opt.id for opt in o.OPTIONS)
    if ids != list(range(len(ids))):
        raise ValueError(f"option ids must be 0..{len(ids) - 1}, got {ids}")
    for opt in o.OPTIONS:
        lines.append(f"#define {opt.c_name} {opt.id}")
    lines.append(f"#define SG_NOPTS {len(o.OPTIONS)}")
    rows = [f"    {{ {_c(opt.name)}, {_c(opt.arginfo)}, {_c(opt.help)}, {opt.has_arg}, "
            f"{opt.c_name}, sg_opt_cb }}" for opt in sorted(o.OPTIONS, key=lambda x: x.id)]
    lines.append("#define SG_OPTION_TABLE { \\\n" + ", \\\n".join(rows) + " }")
    envs = [_c(opt.env) for opt in sorted(o.OPTIONS, key=lambda x: x.id)]
    lines.append(f"#define SG_ENV_NAMES {{ {', '.join(envs)} }}")
    # Per option, the values C passes on without Python (joboptions.c_canonical_values).
    canon = []
    for opt in sorted(o.OPTIONS, key=lambda x: x.id):
        vals = o.c_canonical_values(opt.id)
        canon.append("(const char *const[]) { " + "".join(_c(v) + ", " for v in vals) + "NULL }"
                     if vals else "NULL")
    lines.append(f"#define SG_CANONICAL {{ {', '.join(canon)} }}")
    lines.append(f"#define SG_ARG_KEYS {{ {', '.join(_c(k) for k in o.PLUGSTACK_KEYS)}, NULL }}")
    lines.append(f"#define SG_ARG_HELP {_c('config=PATH numa_bind=' + '|'.join(o.NUMA_MODES))}")
    lines.append(f"#define SG_NUMA_MODES {{ {', '.join(_c(m) for m in o.NUMA_MODES)}, NULL }}")
    lines.append(f"#define SG_BUILT_FOR {_c(str(facts['version']))}")
    lines.append(f"#define SG_BUILT_API {int(facts['api'])}")   # type: ignore[call-overload]
    lines.append(f"#define SG_MARKER {_c(MARKER)}")
    # where the binding table lies and the node-fact key it names (sg_bind.c)
    from slurm_gpu import __version__, nodefacts
    lines.append(f"#define SG_FACTS_DIR {_c(nodefacts.CACHE_DIR)}")
    lines.append(f"#define SG_FACTS_KEY_PREFIX {_c(f'{__version__}:{nodefacts.FORMAT}')}")
    rel = ", ".join(f"{{ {api}, {_c(r)} }}" for api, r in sorted(slurmversion.API_RELEASES.items()))
    lines.append(f"#define SG_API_RELEASES {{ {rel}, {{ 0, NULL }} }}")
    if facts["init_failure_mode"]:
        lines.append("#define SG_HAVE_INIT_FAILURE_MODE 1")
    return "\n".join(lines) + "\n"


def build_outer(output: Path, *, include_dir: str | None = None,
                gen_dir: Path | None = None) -> Path:
    """Compile the plain-C outer half with gcc (through the command runner)."""
    from slurm_gpu.runner import run
    gen = gen_dir or output.parent
    (gen / GENERATED).write_text(generate_header(include_dir))
    argv = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{gen}",
            f"-Wl,--version-script={HERE / 'exports.map'}", "-Wl,-z,now",
            "-o", str(output), *(str(HERE / c) for c in OUTER_SOURCES), "-ldl"]
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
    ffi.cdef(CDEF + PLANNER_CDEF)
    ffi.embedding_api(EMBEDDING_API)
    paths, prefixes = isolated_config(python)
    if sys_path is not None:
        paths = sys_path
    from slurm_gpu import __version__
    source = (f"#define SG_PYTHON {_c_string(python)}\n"
              f"#define SG_INNER_MARKER {_c_string(INNER_MARKER)}\n"
              f"#define SG_VERSION {_c_string(__version__)}\n"
              f"#define SG_PATHS {{ {', '.join(_c_string(p) for p in paths)}, NULL }}\n"
              + "".join(f"#define SG_{k.upper()} {_c_string(v)}\n" for k, v in prefixes.items())
              + (HERE / "slurm_gpu_spank_py.c").read_text())
    ffi.set_source(
        INNER, source,
        sources=[str(HERE / PLANNER_SOURCE)],
        include_dirs=([include_dir] if include_dir else []) + [str(HERE)],
        extra_compile_args=["-O2"],
        extra_link_args=[f"-Wl,--version-script={HERE / 'exports_py.map'}", "-Wl,-z,now",
                         "-Wl,-rpath," + (sysconfig.get_config_var("LIBDIR") or "")],
    )
    ffi.embedding_init_code(INIT_CODE.format(module=INNER, cffi_version=cffi.__version__))
    built = Path(ffi.compile(tmpdir=str(tmpdir), target=INNER + ".so", verbose=verbose))
    os.replace(built, output)
    return output


def build_planner(tmpdir: str | os.PathLike[str], verbose: bool = False) -> tuple[Any, Any]:
    """Compile the planner alone into a cffi module in *tmpdir*; its ``(ffi, lib)``.

    The same source and declarations as the plugin's inner half, for code
    that plans outside slurmstepd (the tests): hand them to
    :func:`slurm_gpu.binding.use_planner`.
    """
    import cffi
    import importlib.util
    ffi = cffi.FFI()
    ffi.cdef(PLANNER_CDEF)
    ffi.set_source(PLANNER_MODULE, '#include "sg_bind.h"\n', sources=[str(HERE / PLANNER_SOURCE)],
                   include_dirs=[str(HERE)], extra_compile_args=["-O2"])
    built = ffi.compile(tmpdir=str(tmpdir), verbose=verbose)
    spec = importlib.util.spec_from_file_location(PLANNER_MODULE, built)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ffi, mod.lib


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
    tmp_outer = build_outer(tmp / (OUTER + ".so.new"), include_dir=include_dir, gen_dir=tmp)
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
