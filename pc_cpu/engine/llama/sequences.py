"""Gives each sequence id of a PromptCache's two contexts its role, once, instead of by arithmetic at each call.

The library context (one unified KV cache) holds encoded modules and stages prompts; the
prompt context gives each prompt slot a stream of its own, plus two where encodings are
computed. Sequence ids in llama.cpp are only numbers: a wrong one aborts the process or
silently mixes two prompts' cells, so they are handed out here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from pc_cpu.errors import PromptCacheError

# Sequences of the library context beside the prompt slots and the libraries: scratch, pin, hold.
RESERVED = 3


@dataclass(frozen=True)
class SequenceRoles:
    """The sequence ids of one PromptCache's library and prompt contexts, by what each holds."""

    slots: tuple[int, ...]  # one per prompt running at once: its staging sequence (library) and stream (prompts)
    scratch: int  # library: an empty sequence where modules are computed after their context
    pin: int  # library: holds every resident cell as well, so llama.cpp never reuses one (encoder.pin_cells)
    libraries: tuple[int, ...]  # library: where resident modules live (pc_cpu.store.resident)
    hold: int  # library: keeps encodings computed at their home while they are read (Encoder.compute_apart)
    workspace: int  # prompts: the stream where encoders compute, from slot 0 of an empty stream
    adder: int  # prompts: the stream add_document and load_schema compute in, batch by batch between prompts

    @classmethod
    def for_contexts(cls, parallel: int, n_seq_max: int) -> "SequenceRoles":
        """Returns the roles for `parallel` prompt slots in a library context of `n_seq_max` sequence ids.

        Raises:
            PromptCacheError: `parallel` leaves no library sequence.
        """
        if not 1 <= parallel <= n_seq_max - RESERVED - 1:
            raise PromptCacheError(f"parallel={parallel}: must be 1..n_seq_max-4 ({n_seq_max - 4}); three sequences "
                                   "are the scratch, the pin and the hold, and at least one holds modules")
        hold = n_seq_max - 1
        return cls(slots=tuple(range(parallel)), scratch=parallel, pin=parallel + 1,
                   libraries=tuple(range(parallel + 2, hold)), hold=hold, workspace=parallel, adder=parallel + 1)

    @property
    def prompt_streams(self) -> int:
        """Returns the streams the prompt context needs: one per slot, the workspace and the adder's."""
        return len(self.slots) + 2
