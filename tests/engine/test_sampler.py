"""SamplingParams.validate: out-of-range, NaN and infinite options are refused with the option's name."""

from __future__ import annotations

import math

import pytest

from pc_cpu.engine.llama.sampler import SamplingParams
from pc_cpu.errors import PromptCacheError


TOP_P_RANGE = r"must be a number in \(0, 1\]"
TOP_K_RANGE = r"must be an integer in 0\.\.2147483647 \(0 turns it off\)"
SEED_RANGE = r"must be an integer in 0\.\.4294967294"


@pytest.mark.parametrize("options, message", [
    pytest.param({"temperature": -1}, "temperature=-1: must be a finite number >= 0", id="negative-temperature"),
    pytest.param({"temperature": math.nan}, "temperature=nan: must be a finite number", id="nan-temperature"),
    pytest.param({"temperature": math.inf}, "temperature=inf: must be a finite number", id="inf-temperature"),
    pytest.param({"top_p": 0}, "top_p=0: " + TOP_P_RANGE, id="zero-top_p"),
    pytest.param({"top_p": math.nan}, "top_p=nan: " + TOP_P_RANGE, id="nan-top_p"),
    pytest.param({"top_p": -math.inf}, "top_p=-inf: " + TOP_P_RANGE, id="inf-top_p"),
    pytest.param({"top_k": -2}, "top_k=-2: " + TOP_K_RANGE, id="negative-top_k"),
    # llama.cpp's top_k is an int32_t: ctypes keeps the low 32 bits, so 2**32 + 1 would act as 1.
    pytest.param({"top_k": 2**32 + 1}, "top_k=4294967297: " + TOP_K_RANGE, id="top_k-beyond-int32"),
    pytest.param({"top_k": 2**31}, "top_k=2147483648: " + TOP_K_RANGE, id="top_k-just-beyond-int32"),
    pytest.param({"top_k": 1.5}, "top_k=1.5: " + TOP_K_RANGE, id="fractional-top_k"),
    pytest.param({"top_k": True}, "top_k=True: " + TOP_K_RANGE, id="bool-top_k"),
    # The seed is a uint32_t, and 0xFFFFFFFF is llama.cpp's "pick a random seed": neither may happen silently.
    pytest.param({"seed": -1}, "seed=-1: " + SEED_RANGE, id="negative-seed"),
    pytest.param({"seed": 2**32 - 1}, "seed=4294967295: " + SEED_RANGE, id="random-seed"),
    pytest.param({"seed": 2**32 + 3}, "seed=4294967299: " + SEED_RANGE, id="seed-beyond-uint32"),
    pytest.param({"seed": "3"}, "seed='3': " + SEED_RANGE, id="string-seed"),
    # llama.cpp takes a C float: beyond its range a temperature becomes infinity.
    pytest.param({"temperature": 1e39}, r"temperature=1e\+39: must be a finite number >= 0",
                 id="temperature-beyond-float"),
])
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(PromptCacheError, match=message):
        SamplingParams(**options).validate()


@pytest.mark.parametrize("options", [{}, {"temperature": 1e6, "top_p": 1.0, "top_k": 40}, {"top_p": 1e-9},
                                     {"top_k": 2**31 - 1, "seed": 2**32 - 2, "temperature": 3e38}])
def test_finite_options_in_range_are_accepted(options):
    assert SamplingParams(**options).validate() is None
