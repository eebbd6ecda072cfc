"""Engine tests run on every model: the tiny random one and each installed packaged model.

`make_cache` here defaults to `engine_model`, so every engine test that builds its caches with it
runs once per model (ids `tiny`, `smollm2-135m`, ...). A packaged model that is not installed is
skipped with the extra that installs it. A test that pins one model takes a factory of its own
(`make_smollm2_cache`), so it runs once.
A test marked `tiny_only` rests on the random model's behaviour (it never ends a text early) and
runs on it alone.

`pytest tests/engine -m tiny` runs only the fast tiny-model pass: the collection below marks `tiny`
each engine test run that loads no packaged model (its `engine_model` is `tiny`, or it has none and
takes no real-model fixture and is not `slow`, as test_gemma.py is).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pc_cpu.models import MODELS
from tests.conftest import cache_factory, packaged_model_path
from tests.engine.machinery import Engine


# Fixtures that load a packaged model: a test that takes one is not part of the tiny-model pass.
REAL_MODEL_FIXTURES = {"smollm2_cache", "packaged_cache", "make_smollm2_cache"}
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    """Deselects the packaged-model runs of tests marked tiny_only; marks `tiny` the engine tests' tiny-model runs."""
    keep, drop = [], []
    for item in items:
        param = getattr(item, "callspec", None) and item.callspec.params.get("engine_model")
        only_tiny = item.get_closest_marker("tiny_only") is not None
        (drop if only_tiny and param not in (None, "tiny") else keep).append(item)
        if HERE in item.path.parents and _loads_no_packaged_model(item, param):
            item.add_marker(pytest.mark.tiny)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _loads_no_packaged_model(item, param) -> bool:
    """Returns True for a run on the tiny model: its engine_model is `tiny`, or it has none and no real-model fixture."""
    if param is not None:
        return param == "tiny"
    return not REAL_MODEL_FIXTURES & set(item.fixturenames) and item.get_closest_marker("slow") is None


# The 1.5B model takes ~3x the 0.5B's time (the 0.5B's pass of this suite: ~6-11 min on 2 cores), so
# only the exactness tests run on it by default (test_exactness.py: EVERY_MODEL); -m slow runs the rest.
EVERY_MODEL = ["tiny", *MODELS]
ENGINE_MODELS = ["tiny", *(pytest.param(name, marks=pytest.mark.slow) if name == "qwen2.5-coder-1.5b" else name
                           for name in MODELS)]


def model_path(name: str, tiny_model_path):
    """Returns the path of the tiny model or of a packaged one; skips, naming its extra, when it is not installed."""
    return tiny_model_path if name == "tiny" else packaged_model_path(name)


@pytest.fixture(scope="session", params=ENGINE_MODELS)
def engine_model(request, tiny_model_path):
    """Returns the path of the model an engine test runs on."""
    return model_path(request.param, tiny_model_path)


@pytest.fixture
def make_cache(engine_model):
    """Returns a factory of PromptCache objects (default: on `engine_model`); closes them after the test."""
    yield from cache_factory(engine_model)


@pytest.fixture
def make_engine(engine_model):
    """Returns a factory of Engines: a cache's machinery, built from the same constructors (tests/engine/machinery.py).

    Default: on `engine_model`, with make_cache's small defaults (n_ctx 1024, 2 threads, 16 sequences);
    closes them after the test.
    """
    yield from cache_factory(engine_model, Engine)


@pytest.fixture
def engine(make_engine):
    """Returns the machinery of a cache on `engine_model`, RAM tier only (store=False)."""
    return make_engine(store=False)
