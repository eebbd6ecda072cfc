"""Typed ids that flow between layers, so a position is never mixed up with a sequence id.

Positions are 0-based token positions in a sequence; every range in pc_cpu is
half-open, [start, end).
"""

from typing import NewType

Pos = NewType("Pos", int)  # a token position inside one sequence
SeqId = NewType("SeqId", int)  # a llama.cpp sequence id, 0 <= id < n_seq_max
TokenId = NewType("TokenId", int)  # a vocabulary id
