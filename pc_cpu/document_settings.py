"""Gives the named settings of a question over documents, per model, with what each loses against a full prefill.

Documents are encoded apart, so a cached question over a new combination of them answers worse
than a full prefill of the same tokens, by an amount that depends on the model. Asked again over
the same documents in the same order, a question restores their exact prefix and answers as the
full prefill does (PromptCache.ask, `prefix`). Two settings have names, so that a user can pick
one without knowing the recompute policies:

    "fast"      the default: every document restored and moved, only the question computed; the
                exact prefix computed in the background, for the next question. Its encoding
                (what each document after the first was computed after) is the model's default
                too: "library" (after the documents added before it) unless measured otherwise
    "accurate"  the full prefill's answers, token for token: the first question over a combination
                computes the exact prefix (as slow as a full prefill), every later one restores it

Every figure below was measured with `pc-cpu bench documents accuracy` on the odd lines of the
NQ file (5 passages in a random order, paired with the full prefill; bench/RESULTS.md, "Accuracy: questions over documents", and
bench/history/2026-12-04-documents-on-qwen.md). A model not in the table (a GGUF of the user's) gets the
same two settings, without figures: "accurate" is exact on any model by construction.

Pure data and lookups: pc_cpu.cache applies a setting, the CLI prints `advice`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pc_cpu.errors import PromptCacheError

SETTINGS = ("fast", "accurate")  # the names ask(setting=...) and `pc-cpu ask --setting` take
CLOSE_PTS = 2.5  # a loss this small is noise at the n we measure (the goal of `pc-cpu bench documents accuracy`)


@dataclass(frozen=True)
class DocumentSetting:
    """A recompute policy and an order for `ask`, with its measured cost to answers (None: not measured)."""

    recompute: str
    order: str = "given"
    prefix: str = "background"  # when the exact prefix is computed (PromptCache.ask)
    encoding: str = "library"  # what each document is encoded after besides the preamble (PromptCache.ask)
    vs_full_pts: float | None = None  # cached - full prefill, paired, points
    interval: tuple[float, float] | None = None  # its 95% interval
    speedup: float | None = None  # full prefill TTFT / this setting's, median per question
    n: int = 0  # questions paired

    def describe(self) -> str:
        """Returns e.g. 'relevant:1: -5.3 points [-9.0, -1.7] against a full prefill, 4.2x its speed (n = 300)'."""
        if self.prefix == "first":
            later = f", every later one {self.speedup:.1f}x its speed" if self.speedup else ""
            checked = f" (n = {self.n})" if self.n else ""
            return ("prefix first: the full prefill's answers, token for token" + checked + "; the first question "
                    "over a combination of documents as slow as the full prefill" + later)
        what = self.recompute + ("" if self.order == "given" else f", order {self.order}") + \
            ("" if self.prefix == "background" else f", prefix {self.prefix}") + \
            ("" if self.encoding == "library" else f", encoding {self.encoding}")
        if self.vs_full_pts is None:
            return f"{what} (not measured on this model)"
        low, high = self.interval or (self.vs_full_pts, self.vs_full_pts)
        return (f"{what}: {self.vs_full_pts:+.1f} points [{low:+.1f}, {high:+.1f}] against a full prefill, "
                f"{self.speedup:.1f}x its speed (n = {self.n})")


@dataclass(frozen=True)
class ModelDocuments:
    fast: DocumentSetting
    accurate: DocumentSetting


EXACT = DocumentSetting("0", prefix="first", vs_full_pts=0.0, interval=(0.0, 0.0))  # exact by construction
FALLBACK = ModelDocuments(fast=DocumentSetting("0"), accurate=EXACT)

# Filled from bench/RESULTS.md ("Documents against the full prefill"); keys are pc_cpu.models names.
# Measured before documents had a stand-in encoding: these two keep the encoding their figures are of.
_GEMMA_FAST = DocumentSetting("0", encoding="preamble", vs_full_pts=+5.7, interval=(1.3, 10.0), speedup=20.6, n=300)
_SMOLLM2_FAST = DocumentSetting("0", encoding="preamble", vs_full_pts=-1.3, interval=(-5.3, 3.0), speedup=24.6, n=300)

TABLE: dict[str, ModelDocuments] = {
    # pc-cpu bench documents accuracy --model smollm2-135m --threads 1 --n 300 --split odd
    #     --policy 0 --policy relevant:1   (full prefill 16.7%; relevant:1 -6.0 [-10.0, -2.0], 4.7x: worse than
    #     the default; measured 2026-12-03)
    "smollm2-135m": ModelDocuments(fast=_SMOLLM2_FAST, accurate=EXACT),
    # pc-cpu bench documents accuracy --model gemma3-270m --threads 1 --n 300 --split odd
    #     --policy 0 --policy relevant:1   (full prefill 8.7%: a base model; relevant:1 +4.7 [+0.7, +8.7], 4.0x;
    #     measured 2026-12-03)
    "gemma3-270m": ModelDocuments(fast=_GEMMA_FAST, accurate=EXACT),
    # pc-cpu bench documents accuracy --model qwen2.5-coder-0.5b --task nq --split odd --n 300 --threads 1
    #     --policy 0 --policy relevant:1 --encoding library --encoding preamble   (full prefill 56.3%; relevant:1
    #     -0.3 [-4.0, +3.7] at 4.4x; the preamble encoding -17.7 [-23.7, -11.7]; measured 2026-12-04/05 at
    #     commit 0b1d6d6, the library of every item's documents in a random order;
    #     KV retrieval, the same command with --task kv (all 250 odd items), 2026-12-04 at commit
    #     30e9d9e: -6.8 [-11.2, -2.4] at 6.3x, relevant:1 +2.8 [-0.8, +6.0] at 3.0x; with --per-document 6
    #     (30 pairs) --n 60 at commit bb69b0f: -3.3 [-15.0, +8.3] at 18.8x, relevant:1 -5.0 [-16.7, +6.7])
    # With flash attention off (the default since 2026-12-05; forced off on the code of cfbea9d), the NQ
    #     command above with --encoding library --block 25: -2.0 [-6.3, +2.3] at 25.6x, relevant:1 +0.3
    #     [-3.3, +4.0] at 4.7x (full prefill 55.3%); KV (n = 250): -9.2 [-14.0, -4.4] at 7.9x,
    #     relevant:1 +2.8 [-0.8, +6.4] at 3.4x. The figures below are the default's.
    "qwen2.5-coder-0.5b": ModelDocuments(
        fast=DocumentSetting("0", vs_full_pts=-2.0, interval=(-6.3, 2.3), speedup=25.6, n=300),
        # pc-cpu bench documents accuracy --model qwen2.5-coder-0.5b --threads 1 --n 100 --split odd --task nq
        #     --policy 0 --policy exact-ram   (every answer the full prefill's, text for text; measured 2026-12-04)
        accurate=replace(EXACT, speedup=20.0, n=100)),
    # pc-cpu bench documents accuracy --model qwen2.5-coder-1.5b --task nq --split odd --n 150 --threads 1
    #     --policy 0 --policy relevant:1 --encoding library --block 25   (full prefill 72.0%; relevant:1
    #     +2.0 [-1.3, +5.3] at 4.4x; measured 2026-12-04/05 at commit 1b901fa;
    #     KV retrieval, the same command with --task kv: -4.0 [-7.3, -1.3] at 7.0x, relevant:1 +0.0 at 3.1x;
    #     with flash attention off, the default since 2026-12-05: -3.3 [-6.7, -0.7] at 6.9x, relevant:1 +0.0 at 3.0x)
    "qwen2.5-coder-1.5b": ModelDocuments(
        fast=DocumentSetting("0", vs_full_pts=+2.7, interval=(-2.0, 8.0), speedup=21.5, n=150),
        # pc-cpu bench documents accuracy --model qwen2.5-coder-1.5b --threads 1 --task nq --split odd --n 150
        #     --policy 0 --policy exact-ram   (stopped after 24 items, every answer the full prefill's, text for
        #     text; measured 2026-12-04 at commit 4f6d924)
        accurate=replace(EXACT, speedup=24.3, n=24)),
}


def settings_for(model: str | None) -> ModelDocuments:
    """Returns the model's measured settings (a packaged model's name or GGUF file name), else FALLBACK."""
    from pc_cpu.models import MODELS

    if model in TABLE:
        return TABLE[model]
    by_file = {m.file_name: name for name, m in MODELS.items()}
    return TABLE.get(by_file.get(model or "", ""), FALLBACK)


def setting(model: str | None, name: str) -> DocumentSetting:
    """Returns the setting called `name` for `model`; raises naming the settings there are."""
    if name not in SETTINGS:
        raise PromptCacheError(f"setting={name!r} is not a setting for documents; use one of {', '.join(SETTINGS)}")
    return getattr(settings_for(model), name)


def advice(model: str | None) -> str | None:
    """Returns one sentence offering the accurate setting when the fast one loses more than CLOSE_PTS, else None."""
    measured = settings_for(model)
    fast, accurate = measured.fast, measured.accurate
    if fast.vs_full_pts is None or fast.vs_full_pts >= -CLOSE_PTS:
        return None
    return (f"on this model, cached documents answer {-fast.vs_full_pts:.1f} points below a full prefill "
            f"(n = {fast.n}, bench/RESULTS.md); the 'accurate' setting is {accurate.describe()}")
