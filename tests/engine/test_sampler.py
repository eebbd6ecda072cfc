"""SamplingParams.validate: out-of-range, NaN and infinite options are refused with the option's name."""

from __future__ import annotations

import math

import pytest

from pc_cpu.engine.sampler import SamplingParams
from pc_cpu.errors import PromptCacheError


TOP_P_RANGE = r"must be a number in \(0, 1\]"


@pytest.mark.parametrize("options, message", [
    pytest.param({"temperature": -1}, "temperature=-1: must be a finite number >= 0", id="negative-temperature"),
    pytest.param({"temperature": math.nan}, "temperature=nan: must be a finite number", id="nan-temperature"),
    pytest.param({"temperature": math.inf}, "temperature=inf: must be a finite number", id="inf-temperature"),
    pytest.param({"top_p": 0}, "top_p=0: " + TOP_P_RANGE, id="zero-top_p"),
    pytest.param({"top_p": math.nan}, "top_p=nan: " + TOP_P_RANGE, id="nan-top_p"),
    pytest.param({"top_p": -math.inf}, "top_p=-inf: " + TOP_P_RANGE, id="inf-top_p"),
    pytest.param({"top_k": -2}, "top_k=-2: must be >= 0", id="negative-top_k"),
])
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(PromptCacheError, match=message):
        SamplingParams(**options).validate()


@pytest.mark.parametrize("options", [{}, {"temperature": 1e6, "top_p": 1.0, "top_k": 40}, {"top_p": 1e-9}])
def test_finite_options_in_range_are_accepted(options):
    assert SamplingParams(**options).validate() is None
