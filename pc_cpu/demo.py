"""The built-in demo: a schema with a system message, a union of documents and a param.

The documents describe invented places, so answers can only come from the
prompt (not from what the model memorised).
"""

from __future__ import annotations

DOCS = {
    "observatory": """The Lindqvist Observatory stands on Harrow Ridge, 2,140 metres above the village of Vell.
It was founded in 1931 by the astronomer Maja Lindqvist, who paid for the first dome by selling her
family's timber mill. The original instrument was a 60-centimetre reflecting telescope ground by hand
over four winters. In 1978 a second dome was added for a 1.8-metre telescope, which is still the largest
in the region. The observatory is best known for the Vell Survey, a catalogue of 41,000 variable stars
completed in 1994 after twenty-two years of observations. Because the ridge is often above the clouds,
the staff measured 290 clear nights per year during the survey. Visitors can reach the observatory by a
cable car that runs from Vell every forty minutes between May and October; in winter the road is closed
and staff travel by snow tractor. The current director, Tomas Ekberg, started a programme in 2015 that
lets school classes control the small telescope over the internet. The observatory's library keeps
Lindqvist's notebooks, which record the weather every night from 1931 until her death in 1969.
The Vell Survey data are still used today to calibrate automated sky surveys.""",
    "harbor": """Calder Bay is a fishing town on a sheltered inlet of the northern coast, home to about 6,300 people.
Its harbour was dug out by hand in 1846 after a storm destroyed the older wooden pier, and the granite
breakwater built then still protects the fleet. The town's main catch is mackerel in summer and crab in
autumn; the crab season opens every year on the second Monday of September with the Blessing of the
Boats. The red lighthouse at the end of the breakwater, called the Calder Light, was automated in 1987;
its last keeper, Agnes Moir, kept the light for thirty-one years. A ferry leaves Calder Bay for the
island of Skerra twice a day and takes fifty-five minutes. The town museum, in the old salt store,
displays a 9-metre rowing lifeboat named Endeavour that saved forty-seven sailors between 1880 and
1921. Calder Bay is also known for smoked mackerel pâté, made to a recipe from the Moir family, and for
the Harbour Regatta, a race of traditional sailing boats held on the last Saturday of July. The tide in
the inlet can rise by more than five metres, so boats are moored on long chains.""",
    "railway": """The Meridian Line is a narrow-gauge railway that climbs 38 kilometres from the market town of Oster
to the lakeside resort of Brannholm. Construction began in 1902 and took seven years, because the line
needed eleven tunnels and the stone viaduct at Kessel Gorge, which is 212 metres long and 64 metres high.
Steam locomotives ran the line until 1956, when it was electrified; two of the original engines, numbers
4 and 7, have been restored and pull heritage trains on summer Sundays. A regular train takes one hour
and forty minutes from Oster to Brannholm and stops at nine stations. The steepest section, near the
village of Grauwald, has a gradient of seven percent and uses a rack rail between the running rails.
In 1999 a landslide closed the line for fourteen months; it reopened with a new avalanche gallery above
the Grauwald tunnel. The line carries about 400,000 passengers a year, most of them hikers and skiers.
Season tickets for residents of the valley cost forty euros, and bicycles travel free in the last
carriage. The railway's workshop in Oster still builds replacement parts for the old steam engines.""",
}

QUESTIONS = [
    ("observatory", "How many variable stars are in the Vell Survey?"),
    ("harbor", "When was the Calder Light automated?"),
    ("railway", "How long is the viaduct at Kessel Gorge?"),
]


def demo_schema() -> str:
    """Returns the demo schema's PML: a system message, a union of the documents right after it, a module with a param.

    Each document sits right after the system message, where the full prefill computes it: its
    cached cells are the full prefill's, so a prompt importing one answers as the full prefill
    does, token for token. The style module follows the union, encoded after the system message
    alone: a prompt importing it after a document is the other case, modules encoded apart.
    """
    members = "\n".join(f'      <module name="{name}">{text}</module>' for name, text in DOCS.items())
    return f"""<schema name="demo">
  <system>You are a concise assistant. Answer from the document.</system>
  <user>
    <union name="document">
{members}
    </union>
    <module name="style">Answer in a <param name="tone" len="6"/> tone.</module>
  </user>
</schema>"""


def demo_prompt(doc: str, question: str, tone: str | None = None) -> str:
    """Returns a demo prompt importing one document and asking `question`; with `tone`, the style module too."""
    style = "" if tone is None else f'<style tone="{tone}"/>'
    return f'<prompt schema="demo"><{doc}/>{style}<user>{question}</user></prompt>'


# What `pc-cpu demo` says under its answers: which cached answers are the full prefill's, and which can differ.
EXACT_NOTE = ("Each document above sits right after the system message, so its cached cells are the ones the full "
              "prefill computes, in the same llama.cpp calls: the cached answer is the full prefill's, token for token, "
              "on any CPU. Cached answers can differ where cells were computed apart from the text before them: a "
              "module after another (<harbor/><style tone=\"plain\"/>), recompute= policies, documents asked "
              "together for the first time, chat turns reused after an edit. The same prompt gets the same answer "
              "from every tier.")


LONG_QUESTION = "On which day did the ferry carry the most passengers, and how many?"
_WINDS = ("north", "north-east", "east", "south-east", "south", "south-west", "west", "north-west")


def long_document(days: int = 120) -> str:
    """Returns a long invented document (~4,500 tokens on SmolLM2): the three demo documents and a ferry log.

    The log's busiest day is day 77 (912 passengers); every other day carries fewer than 400.
    """
    log = []
    for day in range(1, days + 1):
        passengers = 912 if day == 77 else 120 + (day * 37) % 270
        wind = _WINDS[(day * 5) % len(_WINDS)]
        log.append(f"Day {day}: the Skerra ferry carried {passengers} passengers; the wind was "
                   f"{8 + (day * 7) % 25} knots from the {wind}.")
    return "\n\n".join(DOCS.values()) + "\n\nFerry log of the summer season.\n" + "\n".join(log)


def agreement(cached_ids: list[int], baseline_ids: list[int]) -> str:
    """Returns how a cached answer compares with the full prefill's: "same tokens", or where they part."""
    if cached_ids == baseline_ids:
        return "same tokens as the full prefill"
    parted = next((i for i, (a, b) in enumerate(zip(cached_ids, baseline_ids)) if a != b),
                  min(len(cached_ids), len(baseline_ids)))
    return f"differs from the full prefill from token {parted + 1}"


def one_line(text: str) -> str:
    """Returns `text` with every run of whitespace (newlines included) made one space: one answer, one line."""
    return " ".join(text.split())


def headline(label: str, cached_tokens: int, cached_ms: float, baseline_ms: float) -> str:
    """Returns the demo's last line: what was cached and how much sooner the first token came.

    e.g. "Long document: 4,485 tokens cached, first token 27x sooner (787 ms vs 21.4 s)."
    """
    ratio = baseline_ms / cached_ms
    if ratio >= 1:
        change = f"{_times(ratio)} sooner"
    else:  # a busy or unusual CPU can make the cached prompt slower: say so rather than print "0.8x sooner"
        change = f"{_times(1 / ratio)} later"
    return (f"{label}: {cached_tokens:,} tokens cached, first token {change} "
            f"({_duration(cached_ms)} vs {_duration(baseline_ms)}).")


def _times(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"  # 38x, 4.9x


def _duration(ms: float) -> str:
    """Returns a duration as people read it: '210 ms', '8.0 s', '2 min 18 s'."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s"
