"""k_rows: where each layer's K rows lie in a blob, for code that reads or changes K in place."""

import numpy as np
import pytest

from pc_cpu.kvstate.state_blob import k_rows, layer_kv
from tests.native.conftest import GGML_F16, BlobSpec, make_blob


@pytest.mark.parametrize("n_section", [1, 2])
def test_each_region_holds_the_layer_s_k_as_layer_kv_reads_it(n_section):
    spec = BlobSpec(positions=(3, 4, 5, 9), n_layer=3, v_trans=True, n_section=n_section)
    blob = make_blob(spec)
    regions = k_rows(blob)
    assert [(r.section, r.layer) for r in regions] == [(s, i) for s in range(n_section) for i in range(3)]
    for r in regions:
        assert r.type == GGML_F16 and r.n_cell == 4 and r.size == 4 * spec.n_head_kv * spec.head_dim * 2
        rows = np.frombuffer(blob, "<f2", r.size // 2, r.offset).reshape(r.n_cell, -1).astype(np.float32)
        _, k, _ = layer_kv(blob, r.layer, section=r.section)
        np.testing.assert_array_equal(rows, k)


def test_regions_do_not_overlap_and_lie_inside_the_blob():
    blob = make_blob(BlobSpec(positions=(0, 1, 2), n_layer=4))
    spans = sorted((r.offset, r.offset + r.size) for r in k_rows(blob))
    assert all(a_end <= b for (_, a_end), (b, _) in zip(spans, spans[1:]))
    assert spans[0][0] > 0 and spans[-1][1] <= len(blob)
