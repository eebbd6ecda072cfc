# Derived from llama.cpp's tools/server/tests/unit/test_stream.py, as vendored by llama-cpp-python 0.3.36
# (llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f, 2026-10-01), adapted to run against
# `pc-cpu serve` (see README.md in this folder for what was changed and why).
#
# MIT License
#
# Copyright (c) 2023-2026 The ggml authors
#
# Permission is hereby granted, free of charge, to any person obtaining a copy
# of this software and associated documentation files (the "Software"), to deal
# in the Software without restriction, including without limitation the rights
# to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
# copies of the Software, and to permit persons to whom the Software is
# furnished to do so, subject to the following conditions:
#
# The above copyright notice and this permission notice shall be included in all
# copies or substantial portions of the Software.
#
# THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
# IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
# FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
# AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
# LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
# OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
# SOFTWARE.
"""llama.cpp's stream tests: all three are about llama-server's router (several models behind one
server, loaded on demand) and its resumable streams (X-Conversation-Id, GET/DELETE /v1/stream),
none of which is OpenAI's API; they are kept as skipped, to count."""

import pytest

REASON = ("not OpenAI's API: llama-server's router mode (models loaded on demand) and its resumable streams "
          "(X-Conversation-Id header, GET/DELETE /v1/stream)")


@pytest.mark.skip(reason=REASON)
def test_stream_resume_and_stop_with_slashed_model_name():
    pass


@pytest.mark.skip(reason=REASON)
def test_stream_stop_during_model_load():
    pass


@pytest.mark.skip(reason=REASON)
def test_stream_resumes_after_reload_during_model_load():
    pass
