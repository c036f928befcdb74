"""Test setup: 8 simulated CPU devices (sharded code is checked against the single-device result), compiled fast
(``tests/xla_flags.py``)."""

import functools
import os

from tests.xla_flags import xla_flags

os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# log-prob caches of this test session (and its subprocesses) go to a fresh folder: never ~/.cache, never ../shared
os.environ["JAXPPO_CACHE_DIR"] = __import__("tempfile").mkdtemp(prefix="jaxppo_test_cache_")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]
# "ci" (the default) draws the same examples on every run, so a red CI is reproducible and never a coin
# flip; "dev" explores: `JAXPPO_HYPOTHESIS_PROFILE=dev python -m pytest` (random seeds, 10x the examples).
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, suppress_health_check=_QUIET)
settings.register_profile("dev", max_examples=400, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("JAXPPO_HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("JAXPPO_SHARED", REPO.parent / "shared"))
#: the compilation cache's size limit: never reached; setting one turns on JAX's file lock around reads and writes
CACHE_LOCK_SIZE = 64 << 30


@functools.cache
def starts_processes(path: str) -> bool:
    """Whether the test file ``path`` (relative to the repository) marks tests ``processes``: they start several JAX
    processes at once (pyproject.toml)."""
    p = REPO / path
    return p.suffix == ".py" and p.is_file() and "pytest.mark.processes" in p.read_text()


def pytest_collection_modifyitems(config, items):
    """Files that start several processes run first, then the other files holding a ``slow`` test, then the rest,
    each group in collection order (``--no-loadscope-reorder``, pyproject.toml): the heavy work starts first and the
    workers finish together on short files."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        f = item.nodeid.split("::")[0]
        return 0 if starts_processes(f) else 1 if f in slow else 2

    items.sort(key=rank)   # stable: collection order otherwise


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile``, the files that start several processes are one work unit: one worker runs them one
    after the other while the other workers run in-process files, instead of two workers each running 2-4 JAX
    processes on the same cores at once. Every other file is a unit of its own, as in ``loadfile``."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ProcessesOnOneWorker(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "processes" if starts_processes(scope) else scope

    return ProcessesOnOneWorker(config, log)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The project's ``../shared`` assets folder; fails loudly when it is missing."""
    if not SHARED.is_dir():
        pytest.fail(f"../shared assets not found at {SHARED} (set JAXPPO_SHARED to its location)")
    return SHARED


@pytest.fixture(scope="session")
def stories_model(shared_dir) -> Path:
    """``../shared/models/stories260K`` (a real 260K-parameter Llama in HF format)."""
    p = shared_dir / "models" / "stories260K"
    if not p.is_dir():
        pytest.fail(f"stories260K not found at {p}")
    return p


@pytest.fixture(scope="session")
def hh_pairs(shared_dir) -> Path:
    """``../shared/data/hh-rlhf/harmless-base-test.jsonl.gz`` (real Anthropic HH-RLHF preference pairs)."""
    p = shared_dir / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
    if not p.is_file():
        pytest.fail(f"HH-RLHF pairs not found at {p}")
    return p


@pytest.fixture(scope="session", autouse=True)
def subprocess_compile_cache(tmp_path_factory):
    """One persistent XLA compilation cache under this session's pytest tmp folder, for every subprocess the tests
    start (``JAX_COMPILATION_CACHE_DIR`` in the environment they inherit; a test that sets its own keeps it): the
    same smoke model is compiled once for all of them instead of once per process (e.g. the 2-process SIGKILL test
    reuses the 2-process fixture's programs). Under pytest-xdist every worker uses the same folder (the session's
    root, above the workers' own), and a cache size limit turns on JAX's file lock around each read and write, so
    processes that run at once never read an entry still being written. A fresh folder per session, so a clean
    clone behaves the same. The pytest process keeps what it read when it imported jax. Every program is cached (no
    minimum compile time: a toy run compiles ~75 programs of ~0.1 s each)."""
    keys = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_COMPILATION_CACHE_MAX_SIZE")
    saved = {k: os.environ.get(k) for k in keys}
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "subprocess_xla_cache"
    cache.mkdir(exist_ok=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(CACHE_LOCK_SIZE)
    yield Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """After each test module: drop JAX's in-memory caches of traced and compiled programs (jax.clear_caches) and
    collect garbage, so the pytest process does not carry every module's executables to the end of the suite (the
    full suite aborted twice at the same late test while serializing an executable to the persistent cache, a test
    that passes alone: memory growth is the suspect). Programs a later module needs again come back from the
    persistent compilation cache."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
