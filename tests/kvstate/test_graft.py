"""graft_cells: a blob with some layers' K/V, at some positions, taken from another computation of the same cells."""

import numpy as np
import pytest

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate.state_blob import graft_cells, layer_kv
from tests.native.conftest import BlobSpec, make_blob


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("parts", ["k", "v", "kv"])
def test_only_the_chosen_layers_parts_and_positions_come_from_the_donor(v_trans, parts):
    spec = BlobSpec(positions=(0, 1, 2, 3), n_layer=3, v_trans=v_trans)
    base, donor = make_blob(spec), make_blob(BlobSpec(**{**spec.__dict__, "seed": 1}))
    out = graft_cells(base, donor, layers=[1], positions=[1, 3], parts=parts)
    for layer in range(3):
        _, kb, vb = layer_kv(base, layer)
        _, kd, vd = layer_kv(donor, layer)
        _, ko, vo = layer_kv(out, layer)
        for name, b, d, o in (("k", kb, kd, ko), ("v", vb, vd, vo)):
            grafted = layer == 1 and name in parts
            np.testing.assert_array_equal(o[[0, 2]], b[[0, 2]])  # other positions: never touched
            np.testing.assert_array_equal(o[[1, 3]], d[[1, 3]] if grafted else b[[1, 3]])
    assert len(out) == len(base)


def test_blobs_of_other_cells_or_a_missing_layer_are_refused():
    base = make_blob(BlobSpec(positions=(0, 1, 2)))
    with pytest.raises(StateBlobError, match="different cells"):
        graft_cells(base, make_blob(BlobSpec(positions=(0, 1, 3))), [0], [1])
    with pytest.raises(StateBlobError, match="layer 5"):
        graft_cells(base, make_blob(BlobSpec(positions=(0, 1, 2), seed=2)), [5], [1])
    with pytest.raises(StateBlobError, match="parts"):
        graft_cells(base, base, [0], [1], parts="q")
