"""The README and docs/ agree with each other and with the code.

Each headline figure and each status line (what was measured or tested, on which machine) has one
source, and the other documents point to it with a link instead of repeating it:

| what | the one source |
|---|---|
| ringtree against MPI's own allreduce | docs/performance.md, "What the numbers say" |
| the other collectives against MPI's own | docs/collectives.md, "Where MPI's own stays ahead" |
| DDP, FSDP2 and torch's collectives against gloo | docs/training.md, "Measured against gloo" |
| what has run on which GPU, and what it measured there | docs/gpu.md, "Status" (and its "Measured") |

So the README states no measured ratio or bandwidth, figures against gloo appear in training.md
alone, GPU figures and GPU test status in gpu.md alone (a GPU named elsewhere must be one its Status
names, beside a link to it), and every link between the documents leads to a file and heading that
exist. The error texts the docs quote are the ones the code raises.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import ringtree

ROOT = pathlib.Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *DOCS]
# Written by scripts/article-claims.py from the reference article's cost model ("do not edit by hand"):
# its figures are the model's, of no machine, and stay out of the one-source rules.
WRITTEN = [p for p in DOCUMENTS if p.name != "article-claims.md"]

# A measured ratio ("3×", "2.5x", "1.2–3.7×"), not a layout ("2×2 block"), and a bandwidth.
RATIO = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s?[–-]\s?\d+(?:\.\d+)?)?\s?(?:×|x(?!\w))(?!\s?\d)")
BANDWIDTH = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?[GM]B/s")
GPU_MODEL = re.compile(r"\b(?:[ABHLV]\d{2,3}|GH200|GB200|RTX ?\d{4})\b")
GPU_TOPIC = re.compile(r"\bGPUs?\b|\bCUDA\b|\bCuPy\b|" + GPU_MODEL.pattern)
TEST_STATUS = re.compile(r"(?i)\buntested\b|\btested on\b|\bpassed on\b|\bha(?:s|ve) not (?:yet )?run\b|"
                         r"\bnot yet\b|\bno GPU\b|\bat hand\b")

SOURCES = {  # what the README points to for each headline figure, and status
    "ringtree against MPI's own allreduce": "docs/performance.md#what-the-numbers-say",
    "the other collectives against MPI's own": "docs/collectives.md#where-mpis-own-stays-ahead",
    "DDP and FSDP2 against gloo": "docs/training.md#measured-against-gloo",
    "what has run on which GPU": "docs/gpu.md#status",
}


def prose(path: pathlib.Path) -> str:
    """The document without its fenced code blocks and inline code: what it says, not what it runs."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def paragraphs(path: pathlib.Path) -> list[str]:
    """Paragraphs and list items (a list item is a claim of its own), fenced code left out."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    pieces = re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", text)
    return [piece.strip() for piece in pieces if piece.strip()]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(title) for title in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def links(path: pathlib.Path) -> list[str]:
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose(path))


def section(path: pathlib.Path, anchor: str) -> str:
    """The text under the heading whose anchor is `anchor`, up to the next heading of its level or above."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        found = re.match(r"^(#{1,6}) (.+)$", line)
        if found and slug(found.group(2)) == anchor:
            level = len(found.group(1))
            end = next((j for j in range(i + 1, len(lines))
                        if re.match(rf"^#{{1,{level}}} ", lines[j])), len(lines))
            return "\n".join(lines[i + 1:end])
    raise AssertionError(f"{path.name} has no heading with the anchor #{anchor}")


def name(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_link_between_the_documents_leads_to_a_file_and_heading_that_exist(path):
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: {linked.name} has no heading with that anchor")
    assert not broken, f"{name(path)}: " + "; ".join(broken)


def test_each_source_the_readme_points_to_exists_and_the_readme_links_it():
    readme_links = set(links(README))
    for what, target in SOURCES.items():
        assert target in readme_links, f"the README does not link {target} ({what})"
        file, _, anchor = target.partition("#")
        assert section(ROOT / file, anchor).strip(), f"{target} is empty"


def test_the_readme_states_no_measured_ratio_or_bandwidth_but_points_to_where_they_are():
    found = [(match.group(), line.strip()[:80]) for line in prose(README).splitlines()
             for match in [*RATIO.finditer(line), *BANDWIDTH.finditer(line)]]
    assert not found, ("the README repeats measured figures; say what they show and link their one source "
                       f"({', '.join(SOURCES.values())}) instead: {found}")


@pytest.mark.parametrize("path", [p for p in WRITTEN if p.name != "training.md"], ids=name)
def test_figures_against_gloo_are_only_in_training_md(path):
    repeated = [piece[:100] for piece in paragraphs(path)
                if re.search(r"\bgloo\b", piece) and RATIO.search(re.sub(r"`[^`\n]*`", "", piece))]
    assert not repeated, (f"{name(path)} gives figures against gloo, whose one source is "
                          f"docs/training.md#measured-against-gloo: link it instead: {repeated}")


@pytest.mark.parametrize("path", [p for p in WRITTEN if p.name != "gpu.md"], ids=name)
def test_gpu_figures_and_test_status_are_only_in_gpu_md(path):
    status = section(ROOT / "docs" / "gpu.md", "status")
    problems = []
    for piece in paragraphs(path):
        text = re.sub(r"`[^`\n]*`", "", piece)
        if not GPU_TOPIC.search(text):
            continue
        figures = [m.group() for m in [*RATIO.finditer(text), *BANDWIDTH.finditer(text)]]
        if figures:
            problems.append(f"GPU figures {figures} in {piece[:80]!r}")
        points_to_status = re.search(r"\]\((?:docs/)?gpu\.md#status\)", piece)
        if TEST_STATUS.search(text) and not points_to_status:
            problems.append(f"a GPU test status without a link to gpu.md#status: {piece[:100]!r}")
        for model in set(GPU_MODEL.findall(text)):
            if model not in status:
                problems.append(f"{model}, which docs/gpu.md's Status does not name: {piece[:80]!r}")
            elif not points_to_status:
                problems.append(f"{model} named without a link to gpu.md#status: {piece[:80]!r}")
    assert not problems, f"{name(path)}: " + "; ".join(problems)


def test_the_readme_says_which_choices_the_demo_runs():
    demo = (ROOT / "examples" / "allreduce_demo.py").read_text()
    choices = re.findall(r'"(\w+)"', re.search(r"for choice in \(([^)]*)\)", demo).group(1))
    sentence = next(s for s in re.split(r"(?<=\.)\s", README.read_text()) if "allreduce_demo.py` allreduces" in s)
    assert choices and all(f"`{choice}`" in sentence for choice in choices), (choices, sentence)
    assert "each algorithm" not in sentence, sentence


def test_help_of_allreduce_says_what_it_takes():
    doc = ringtree.allreduce.__doc__
    assert "C-contiguous" not in doc and "Fortran" in doc
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    result = ringtree.allreduce(fortran, comm=MPI.COMM_SELF)
    assert result.flags.f_contiguous and np.array_equal(result, fortran)


def _clean_environment(**variables) -> dict:
    """This process's environment without an enclosing mpiexec's and without RINGTREE_* settings."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALNRANKS", "RINGTREE_"))}
    cache = {"RINGTREE_CACHE_DIR": os.environ["RINGTREE_CACHE_DIR"]} if "RINGTREE_CACHE_DIR" in os.environ else {}
    return {**keep, **cache, **variables}


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="runs processes of its own")
def test_the_setting_error_in_configuration_md_is_what_the_code_prints():
    block = re.search(r"^```\n(.*?)^```", (ROOT / "docs" / "configuration.md").read_text(), flags=re.S | re.M)
    documented = block.group(1).strip()
    variable, value = re.search(r"(RINGTREE_\w+)='([^']*)'", documented).groups()
    run = subprocess.run([sys.executable, "-c", "import numpy, ringtree; ringtree.allreduce(numpy.ones(3))"],
                         capture_output=True, text=True, timeout=120, env=_clean_environment(**{variable: value}))
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == documented


_DIFFERENT_TABLES = """
import json, sys
from mpi4py import MPI
import numpy as np
import ringtree
try:
    ringtree.allreduce(np.ones(3))
    caught = None
except ringtree.MismatchError as error:
    caught = f"{type(error).__module__}.{type(error).__name__}: {error}"
everyone = MPI.COMM_WORLD.gather(caught)
if MPI.COMM_WORLD.Get_rank() == 0:
    print(json.dumps(everyone))
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="runs processes of its own")
def test_the_settings_differ_example_is_what_the_code_raises_and_configuration_md_names_what_is_compared(tmp_path):
    algorithms = (ROOT / "docs" / "algorithms.md").read_text()
    block = re.search(r"^```\n(ringtree\.errors\.MismatchError: .*?)^```", algorithms, flags=re.S | re.M).group(1)
    documented = " ".join(line.strip() for line in block.strip().splitlines())
    tables = re.findall(r"table (\S+\.json) \(", documented)
    assert len(tables) == 2, documented
    packaged = json.loads((pathlib.Path(ringtree.__file__).parent / "tuning" / "default.json").read_text())
    (tmp_path / tables[0]).write_text(json.dumps(packaged))
    (tmp_path / tables[1]).write_text(json.dumps({**packaged, "rules": packaged["rules"][1:]}))
    script = tmp_path / "differ.py"
    script.write_text(_DIFFERENT_TABLES)
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    run = subprocess.run([str(mpiexec), "-n", "1", "-env", "RINGTREE_TUNING_FILE", str(tmp_path / tables[0]),
                          sys.executable, str(script), ":",
                          "-n", "1", "-env", "RINGTREE_TUNING_FILE", str(tmp_path / tables[1]),
                          sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120, env=_clean_environment())
    assert run.returncode == 0, run.stderr
    raised = json.loads(run.stdout)
    rank = int(re.search(r"on rank (\d+)", documented).group(1))

    def digestless(text):
        return re.sub(r"\([0-9a-f]{16}\)", "(digest)", text)

    assert digestless(raised[rank]) == digestless(documented)
    # configuration.md names every variable the ranks compare (the table aside), and no other
    compared = set(re.findall(r"(RINGTREE_\w+)=", raised[rank]))
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    paragraph = next(p for p in configuration.split("\n\n") if "are compared across the ranks" in p)
    assert set(re.findall(r"RINGTREE_\w+", paragraph)) == compared, paragraph
