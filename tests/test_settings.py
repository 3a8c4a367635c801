"""Every RINGTREE_* variable: read by ringtree.settings, a bad value refused by name, the table in the docs."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from mpi4py import MPI

from ringtree import settings
from ringtree.algorithms import ALGORITHMS

DOCS = pathlib.Path(__file__).parents[1] / "docs" / "configuration.md"


def test_unset_and_empty_variables_give_the_defaults():
    defaults = settings.Settings(cache_dir=os.path.join(os.path.expanduser("~"), ".cache", "ringtree"))
    assert settings.read({}) == defaults
    assert settings.read({variable.name: "" for variable in settings.VARIABLES}) == defaults


def test_the_cache_directory_is_ringtree_cache_dir_else_under_xdg_cache_home_else_home():
    assert settings.read({"RINGTREE_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}).cache_dir == "/c"
    assert settings.read({"XDG_CACHE_HOME": "/x", "HOME": "/h"}).cache_dir == "/x/ringtree"
    assert settings.read({"HOME": "/h"}).cache_dir == "/h/.cache/ringtree"


@pytest.mark.parametrize("name, text, field, value", [
    ("RINGTREE_ALGORITHM", "double_tree", "algorithm", "double_tree"),
    ("RINGTREE_ALGORITHM", "auto", "algorithm", None),
    ("RINGTREE_TUNING_FILE", "tuning.json", "tuning_file", "tuning.json"),
    ("RINGTREE_DEBUG", "1", "debug", True),
    ("RINGTREE_CHECK", "false", "check", False),  # once read as "set, so on"
    ("RINGTREE_CHECK", "No", "check", False),
    ("RINGTREE_CHECK", "on", "check", True),
    ("RINGTREE_TIMEOUT", "2.5", "timeout", 2.5),
    ("RINGTREE_TIMELINE", "trace-{rank}.json", "timeline", "trace-{rank}.json"),
    ("RINGTREE_GPU_HOST_MAX", "0", "gpu_host_max", 0),
    ("RINGTREE_GPU_HOST_MAX", "4096", "gpu_host_max", 4096),
    ("RINGTREE_CUDA_AWARE", "0", "cuda_aware", False),
    ("RINGTREE_CUDA_AWARE", "1", "cuda_aware", True),
    ("RINGTREE_TUNE", "cache", "tune", "cache"),
    ("RINGTREE_TUNE", "off", "tune", "off"),
])
def test_each_variable_sets_its_field(name, text, field, value):
    assert getattr(settings.read({name: text}), field) == value


@pytest.mark.parametrize("name, text", [
    ("RINGTREE_ALGORITHM", "butterfly"), ("RINGTREE_DEBUG", "maybe"), ("RINGTREE_CHECK", "2"),
    ("RINGTREE_TIMEOUT", "abc"), ("RINGTREE_TIMEOUT", "0"), ("RINGTREE_TIMEOUT", "-3"), ("RINGTREE_TIMEOUT", "inf"),
    ("RINGTREE_GPU_HOST_MAX", "1MiB"), ("RINGTREE_GPU_HOST_MAX", "-1"), ("RINGTREE_CUDA_AWARE", "yes"),
    ("RINGTREE_TUNE", "always"),
])
def test_a_bad_value_is_refused_naming_the_variable_and_what_it_takes(name, text):
    variable = next(v for v in settings.VARIABLES if v.name == name)
    with pytest.raises(settings.SettingError) as caught:
        settings.read({name: text})
    assert str(caught.value) == f"{name}={text!r} is not a value ringtree takes; it takes {variable.values}"


def test_a_retired_variable_is_warned_of_by_name_not_silently_ignored():
    with pytest.warns(UserWarning, match="RINGTREE_SHM is no longer read: ringtree's own shared-memory transport"):
        assert settings.read({"RINGTREE_SHM": "on"}) == settings.read({})


def test_every_algorithm_is_a_value_of_ringtree_algorithm():
    assert all(settings.read({"RINGTREE_ALGORITHM": name}).algorithm == name for name in ALGORITHMS)


def test_the_docs_table_lists_every_variable_with_the_values_it_takes():
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `RINGTREE_")]
    documented = {re.match(r"\| `(RINGTREE_\w+)`", row).group(1): row for row in rows}
    assert list(documented) == [variable.name for variable in settings.VARIABLES]
    for variable in settings.VARIABLES:
        assert variable.values in documented[variable.name]


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="runs processes of its own")
@pytest.mark.parametrize("variable, value", [("RINGTREE_TIMEOUT", "abc"), ("RINGTREE_CHECK", "maybe")])
def test_a_bad_value_is_a_clear_error_at_the_first_call_not_at_import(variable, value):
    code = ("import numpy as np, ringtree\n"
            "print('imported', flush=True)\n"
            "try:\n"
            "    ringtree.allreduce(np.ones(3))\n"
            "except ValueError as error:\n"
            "    print(type(error).__name__, error)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, variable: value})
    assert run.returncode == 0, run.stderr
    imported, error = run.stdout.splitlines()
    assert imported == "imported" and f"{variable}={value!r} is not a value ringtree takes" in error
    assert "on rank 0" in error


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="runs processes of its own")
def test_a_command_refuses_a_bad_setting_as_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "ringtree", "simulate", "--algorithm", "ring", "--ranks", "2",
                          "--bytes", "8"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RINGTREE_ALGORITHM": "fastest"})
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "RINGTREE_ALGORITHM='fastest' is not a value ringtree takes" in run.stderr


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="runs processes of its own")
def test_a_bad_value_on_one_rank_alone_is_an_error_on_every_rank_not_a_hang():
    code = ("import json, numpy as np, ringtree\n"
            "from mpi4py import MPI\n"
            "try:\n"
            "    ringtree.allreduce(np.ones(3))\n"
            "    caught = None\n"
            "except (ValueError, ringtree.MismatchError) as error:\n"
            "    caught = f'{type(error).__name__}: {error}'\n"
            "everyone = MPI.COMM_WORLD.gather(caught)\n"
            "if MPI.COMM_WORLD.Get_rank() == 0:\n"
            "    print(json.dumps(everyone))\n")
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALNRANKS"))}
    run = subprocess.run([str(mpiexec), "-n", "1", sys.executable, "-c", code, ":",
                          "-n", "1", "-env", "RINGTREE_TIMEOUT", "abc", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120, env=clean)
    assert run.returncode == 0, run.stderr
    for rank, caught in enumerate(json.loads(run.stdout)):
        assert caught.startswith(f"MismatchError: ringtree on rank {rank}: ranks of MPI_COMM_WORLD")
        assert "ranks [1]: no usable settings (RINGTREE_TIMEOUT='abc' is not a value ringtree takes" in caught


@pytest.mark.parametrize("template, why", [("/nonexistent/dir/t.json", "there is no folder /nonexistent/dir"),
                                           ("/nonexistent/{rank}/t.json", "there is no folder /nonexistent/0")])
def test_a_timeline_that_could_not_be_written_is_refused_at_the_first_call_not_lost_at_exit(template, why):
    with pytest.raises(settings.SettingError, match=f"RINGTREE_TIMELINE={template!r} is not a value ringtree "
                                                    f"takes; it takes a path in a folder that exists.*: {why}"):
        settings.read({"RINGTREE_TIMELINE": template})


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="runs processes of its own")
def test_a_tuning_file_that_is_not_a_table_is_a_setting_error_naming_the_variable(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [], "ranks": 2}))
    code = ("import numpy as np, ringtree\n"
            "try:\n"
            "    ringtree.allreduce(np.ones(3))\n"
            "except ringtree.SettingError as error:\n"
            "    print(error)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RINGTREE_TUNING_FILE": str(bench)})
    assert run.returncode == 0, run.stderr
    assert f"RINGTREE_TUNING_FILE={str(bench)!r}: bench.json: not a ringtree tuning table" in run.stdout
