# Sourced by the other scripts: make .venv with ringtree and its test extras, once.
# Reinstalls when setup.cfg changes. Afterwards .venv/bin is first on PATH.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "Creating $venv with $("$python" --version)" >&2
    "$python" -m venv "$venv"
fi
stamp="$venv/.ringtree-installed"
if [ ! -f "$stamp" ] || [ "$root/setup.cfg" -nt "$stamp" ]; then
    echo "Installing ringtree[test] into .venv (first use takes a minute)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[test]"
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
