"""``TrainConfig.parallel.compile_cache``: torch.compile's caches in the run directory, so a restart compiles warm.

The restart is a new process (as a requeued attempt on other nodes is): the second run of the demo in the same
run directory must take its compiled graphs from the cache the first one left there (Inductor's own counters
say so), not compile them again."""

from __future__ import annotations

import os

import pytest

from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir
from hpctrain.train import parallel
from hpctrain.train.config import ParallelConfig
from hpctrain.train.parallel import COMPILE_CACHE_ENV, compile_cache_dir, use_compile_cache
from tests.multiproc import run_world


def test_the_cache_is_the_run_directorys_unless_told_otherwise(tmp_path):
    run = tmp_path / "run"
    assert compile_cache_dir(ParallelConfig(compile=True), run) == RunDir(run).compile_cache
    assert compile_cache_dir(ParallelConfig(compile=True, compile_cache=str(tmp_path / "mine")), run) == (
        tmp_path / "mine"
    )
    assert compile_cache_dir(ParallelConfig(compile=True, compile_cache=None), run) is None  # torch's default
    assert compile_cache_dir(ParallelConfig(compile=False), run) is None  # nothing compiled, nothing set


def test_an_empty_or_non_string_cache_is_refused_naming_the_option():
    with pytest.raises(UsageError, match=r"compile_cache=''"):
        ParallelConfig(compile=True, compile_cache="")
    with pytest.raises(UsageError, match="compile_cache"):
        ParallelConfig(compile=True, compile_cache=3)  # type: ignore[arg-type]


def test_the_jobs_own_environment_wins_and_an_unwritable_directory_is_one_line(tmp_path, monkeypatch):
    mine = tmp_path / "site-cache"
    monkeypatch.setattr(parallel, "_JOB_COMPILE_CACHE", str(mine))  # as set in the job when hpctrain was imported
    monkeypatch.setenv(COMPILE_CACHE_ENV, "/tmp/torchinductor_someone")  # what torch's first ask wrote since
    (mine / "fxgraph").mkdir(parents=True)
    (mine / "fxgraph" / "entry").write_text("x")
    used, files = use_compile_cache(tmp_path / "run" / "cache" / "compile")
    assert used == mine and files == 1 and os.environ[COMPILE_CACHE_ENV] == str(mine)
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(parallel, "_JOB_COMPILE_CACHE", None)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(UsageError, match=r"compile_cache: cannot create .*file/sub.*writable directory"):
        use_compile_cache(tmp_path / "file" / "sub")


def _demo_counting_compiles(rank, world_size, run_dir, args):
    from torch._dynamo.utils import counters

    from hpctrain.launch.runner import Runner

    result = Runner(entry="hpctrain.examples.demo:main", run_dir=run_dir, entry_args=args)()
    return {"result": result, "inductor": dict(counters["inductor"])}


def test_a_restart_in_a_new_process_takes_its_graphs_from_the_run_directorys_cache(tmp_path, monkeypatch):
    # What the suite's earlier compiles left in this process's environment (torch's default, warm from them)
    # is passed down to the children: the run's cache must still be the one used.
    import torch._inductor.config  # noqa: F401  (torch's first ask writes its default into the environment)

    monkeypatch.setenv(COMPILE_CACHE_ENV, parallel._torch_default_compile_cache())
    run = tmp_path / "run"
    common = ["--compile", "--layers", "1", "--hidden", "16", "--dim", "8", "--ckpt-every", "2", "--log-every", "1"]

    def attempt(steps):
        world = run_world(_demo_counting_compiles, 1, str(run), ["--steps", steps, *common], init_pg=False)
        return world.results[0]

    first = attempt("2")
    cache = RunDir(run).compile_cache
    assert first["result"]["steps_run"] == 2
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1, first["inductor"]  # compiled cold, into the run
    assert cache.is_dir() and any(cache.rglob("*")), "nothing was written to the run's compile cache"

    second = attempt("4")
    assert second["result"]["resumed"]["step"] == 2 and second["result"]["steps_run"] == 2
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1, second["inductor"]
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0, second["inductor"]


def test_torchs_default_passed_down_by_a_parent_that_compiled_is_not_the_jobs_choice(tmp_path, monkeypatch):
    # A parent that compiled has torch's default in its environment (torch writes it there on its first ask);
    # a child that reads it at import must still use the run's cache, else it compiles into node-local /tmp.
    monkeypatch.setattr(parallel, "_JOB_COMPILE_CACHE", parallel._torch_default_compile_cache())
    run_cache = tmp_path / "run" / "cache" / "compile"
    used, files = use_compile_cache(run_cache)
    assert used == run_cache and files == 0 and os.environ[COMPILE_CACHE_ENV] == str(run_cache)
