# Sourced by build-wheel.sh, build-deb.sh and build-rpm.sh: a throw-away venv
# with nothing but pip (and the build backend pip fetches for the wheel), made
# from the build host's python3, never from the development venv of
# `make install` (docs/install.md, "Building the packages").
#   build_env DIR        -> sets BPY to DIR's python
#   sg_version           -> prints slurm_gpu.__version__ without importing it
build_env() {
    local py=${SLURM_GPU_BUILD_PYTHON:-python3}
    command -v "$py" >/dev/null || { echo "slurm-gpu: $py not found (the build needs python3 and its venv module)" >&2; exit 1; }
    if ! "$py" -m venv "$1" >"$1.log" 2>&1; then
        echo "slurm-gpu: cannot make a build venv with $py -m venv ($(tail -1 "$1.log"); Debian: apt-get install python3-venv)" >&2
        exit 1
    fi
    BPY=$1/bin/python
}
sg_version() {
    sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' "$1/slurm_gpu/__init__.py"
}
