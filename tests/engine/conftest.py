"""Engine tests run on every model: the tiny random one and each installed packaged model.

`make_cache` here defaults to `engine_model`, so every engine test that builds its caches with it
runs once per model (ids `tiny`, `smollm2-135m`, ...). A packaged model that is not installed is
skipped with the extra that installs it; `pytest -k tiny` runs only the fast tiny-model pass.
A test marked `tiny_only` rests on the random model's behaviour (it never ends a text early) and
runs on it alone.
"""

from __future__ import annotations

import pytest

from pc_cpu.models import MODELS
from tests.conftest import cache_factory, packaged_model_path


def pytest_collection_modifyitems(config, items):
    """Deselects the packaged-model runs of tests marked tiny_only."""
    keep, drop = [], []
    for item in items:
        param = getattr(item, "callspec", None) and item.callspec.params.get("engine_model")
        only_tiny = item.get_closest_marker("tiny_only") is not None
        (drop if only_tiny and param not in (None, "tiny") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


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

