"""TTFT per step of an agent loop: a long system prompt and 12 tools, 8 steps each adding a tool's result.

The agent (issue 54, "Measure"): one system message of ~2,000 tokens (instructions and reference
notes: NQ-open gold paragraphs read in place from $PC_CPU_EVALDATA, default ../shared/evaldata),
12 function tools (~1,000 tokens as Qwen2.5's template renders them), one user task; each step
then appends the assistant's call and the tool's result (~60-90 tokens of JSON), as an agent
framework sends them back. --calls generated (the default): each step's call is the one pc_cpu's
answer made (tool_choice "required", one call, greedy), sent back with a canned result for that
tool; Llama is held to the same grammar, so it answers the same call from the same tokens, and its
context then holds it as the agent's next step finds it. --calls scripted: the calls in the
history are scripted and every answer is one token, so each step computes the call too (pc_cpu as
a decode call of its own, the layout that keeps an answer's cells the full prefill's).

Systems, on the same tokens, model, threads and context:
- "pc_cpu": PromptCache.chat(messages, tools=...), Result.ttft_ms. It reuses the conversation's
  cells (the step before: the call and the result are new) and, across agents, the system
  message and tools (a call of their own);
- "full prefill": the same with use_cache=False;
- "Llama": llama_cpp.Llama (one instance, loaded as pc_cpu loads models) given the token ids
  pc_cpu's chat template makes (create_completion on a token list, max_tokens=1): it reuses the
  longest prefix its last call left in its context. Its wall time is the TTFT.
llama.cpp's own server: not run here (llama-cpp-python ships no llama-server binary, and no bench
of this repository builds one).

Scenarios: "single" (one agent's 8 steps); "interleaved" (--agents agents, steps round-robin:
each agent's step 1, then each one's step 2, ...; one PromptCache with a prompt slot per agent,
one Llama). Between steps everything is idle (the tool runs), untimed. Each repeat opens a fresh
PromptCache on an empty store and a fresh Llama; medians over repeats.

Goals printed at the end (exit 1 on a miss): each step after the first computes only what is new
(pc_cpu's computed tokens <= the tokens its call and result added); pc_cpu <= 1.05x Llama on the
single loop (median over steps 2..8); >= 5x faster than Llama with 4 agents interleaved (total TTFT
of steps 2..8). What bounds the last: Llama, whose context holds the agent before, computes the
agent's task and its whole history at each step (u + (k-1)d tokens at step k, d a step's call and
result), pc_cpu d; over steps 2..8 that is 4 + u/d times the tokens.

    python bench/agent_loop.py [--model qwen2.5-coder-0.5b ...] [--threads 2] [--steps 8] [--agents 4]
        [--repeats 3] [--out bench/results/agent_loop.json] [--quick]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from pc_cpu import PromptCache

sys.path.insert(0, str(Path(__file__).parent))
from report_file import new_report, write_report  # noqa: E402  (bench scripts share these helpers)

REPO = Path(__file__).resolve().parent.parent
EVALDATA = Path(os.environ.get("PC_CPU_EVALDATA", REPO.parent / "shared" / "evaldata"))
DEFAULT_MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def _tool(name: str, description: str, **properties) -> dict:
    required = [key for key in properties if not key.startswith("opt_")]
    props = {key.removeprefix("opt_"): value for key, value in properties.items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": [key.removeprefix("opt_") for key in required]}}}


S, N = {"type": "string"}, {"type": "number"}
TOOLS = [
    _tool("search_flights", "Search flights between two airports on a date; returns up to five offers.",
          origin={**S, "description": "IATA code of the departure airport"},
          destination={**S, "description": "IATA code of the arrival airport"},
          date={**S, "description": "Departure date, YYYY-MM-DD"}, opt_cabin={"enum": ["economy", "business"]}),
    _tool("book_flight", "Book a flight offer for the traveller; returns a booking reference.",
          offer_id={**S, "description": "The id of an offer search_flights returned"},
          traveller={**S, "description": "Full name as on the passport"}),
    _tool("search_hotels", "Search hotels in a city for a stay; returns up to five offers with prices.",
          city=S, check_in={**S, "description": "YYYY-MM-DD"}, nights={"type": "integer", "minimum": 1},
          opt_max_price={**N, "description": "Most per night, in EUR"}),
    _tool("book_hotel", "Book a hotel offer; returns a booking reference.", offer_id=S, traveller=S),
    _tool("get_weather", "The weather forecast for a city on a date.", city=S, date=S),
    _tool("convert_currency", "Convert an amount between currencies at today's rate.", amount=N,
          from_currency={**S, "description": "ISO 4217 code"}, to_currency={**S, "description": "ISO 4217 code"}),
    _tool("get_visa_rules", "Entry and visa rules for a citizenship and a destination country.",
          citizenship={**S, "description": "ISO country code"}, destination={**S, "description": "ISO country code"}),
    _tool("find_restaurants", "Restaurants near an address, with cuisine and price level.", address=S,
          opt_cuisine=S, opt_price_level={"type": "integer", "minimum": 1, "maximum": 4}),
    _tool("get_local_time", "The local time and time zone of a city.", city=S),
    _tool("rent_car", "Reserve a rental car at an airport for a number of days.", airport=S, pick_up=S,
          days={"type": "integer", "minimum": 1}, opt_category={"enum": ["small", "medium", "large", "van"]}),
    _tool("send_itinerary", "Email the traveller the itinerary with every booking made so far.",
          email={**S, "description": "The traveller's email address"}, opt_note=S),
    _tool("cancel_booking", "Cancel a booking by its reference; returns the refund due.", reference=S),
]

INSTRUCTIONS = """You are Atlas, the travel desk assistant of Meridian Consulting. You plan and book business trips
for employees, using only the tools you are given. Follow these rules on every request:
1. Confirm the traveller's dates, origin and destination before booking anything; search before you book.
2. Book economy for flights under six hours and business for longer ones, unless the traveller says otherwise.
3. Hotels must cost at most 180 EUR per night in Europe and 250 USD per night elsewhere.
4. Check visa rules for every international trip before booking, and say what the traveller must do.
5. Never invent prices, references or times: report what the tools return.
6. After every booking, send the itinerary to the traveller's email.
7. Answer briefly; lists of options in a short table. If a tool fails, say so and try another way.
The reference notes below are background about destinations our travellers ask about; use them when relevant.
"""


def reference_notes(target_tokens: int, tokenize) -> str:
    """Returns NQ-open gold paragraphs (title: text) until about `target_tokens` tokens."""
    notes, size = [], 0
    with gzip.open(EVALDATA / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as lines:
        for line in lines:
            ctx = json.loads(line)["ctxs"][0]
            note = f"- {ctx['title']}: {ctx['text']}"
            notes.append(note)
            size += len(tokenize(note))
            if size >= target_tokens:
                break
    return "\n".join(notes)


TASKS = ["Book me a trip from Amsterdam to Tokyo for the Osaka client meeting, leaving on 2027-03-08 for five "
         "nights. I am Dana Reyes, dana.reyes@meridian.example, Dutch citizen.",
         "I need to be in Boston on 2027-04-12 for three nights, flying from Madrid. Pedro Alves, "
         "pedro.alves@meridian.example, Portuguese passport.",
         "Plan a trip from Berlin to Nairobi on 2027-02-20 for a week of site visits. Jonas Weber, "
         "jonas.weber@meridian.example, German citizen.",
         "Get me from Paris to Singapore on 2027-05-03 for four nights for the APAC review. Claire Martin, "
         "claire.martin@meridian.example, French passport."]


def scripted_steps(agent: int, steps: int) -> list[tuple[dict, str]]:
    """Returns each step's (call, tool result) of an agent: the calls an agent would make, the results a tool gives."""
    script = [
        ("get_visa_rules", {"citizenship": "NL", "destination": "JP"},
         {"visa_required": False, "max_stay_days": 90, "passport_valid_months": 3, "notes": "Business visits allowed "
          "without a visa; carry the invitation letter and the return ticket."}),
        ("search_flights", {"origin": "AMS", "destination": "KIX", "date": "2027-03-08"},
         {"offers": [{"id": f"F{agent}1", "carrier": "KL", "depart": "10:25", "arrive": "07:10+1", "price_eur": 1840,
                      "cabin": "business"}, {"id": f"F{agent}2", "carrier": "AF", "depart": "13:40", "arrive":
                      "11:05+1", "price_eur": 1655, "cabin": "business"}]}),
        ("book_flight", {"offer_id": f"F{agent}2", "traveller": "Dana Reyes"},
         {"reference": f"MRD{agent}Q7", "status": "confirmed", "seat": "4A", "price_eur": 1655}),
        ("search_hotels", {"city": "Osaka", "check_in": "2027-03-09", "nights": 5, "max_price": 250},
         {"offers": [{"id": f"H{agent}1", "name": "Umeda Garden Hotel", "price_usd": 212, "rating": 4.4},
                     {"id": f"H{agent}2", "name": "Namba Riverside", "price_usd": 189, "rating": 4.1}]}),
        ("book_hotel", {"offer_id": f"H{agent}1", "traveller": "Dana Reyes"},
         {"reference": f"HTL{agent}K2", "status": "confirmed", "check_in": "2027-03-09", "nights": 5}),
        ("get_weather", {"city": "Osaka", "date": "2027-03-09"},
         {"forecast": "light rain", "high_c": 13, "low_c": 6, "wind_kmh": 14}),
        ("send_itinerary", {"email": "dana.reyes@meridian.example"},
         {"sent": True, "bookings": [f"MRD{agent}Q7", f"HTL{agent}K2"]}),
        ("get_local_time", {"city": "Osaka"}, {"local_time": "2027-03-01T18:42", "time_zone": "Asia/Tokyo"}),
    ]
    steps_out = []
    for i in range(steps):
        name, arguments, result = script[i % len(script)]
        call = {"id": f"call_{agent}_{i}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}
        steps_out.append((call, json.dumps(result)))
    return steps_out


def canned_result(agent: int, name: str) -> str:
    """Returns what a tool gives back to a call of `name` (the script's result for that tool; a generic one else)."""
    for call, result in scripted_steps(agent, 8):
        if call["function"]["name"] == name:
            return result
    return json.dumps({"ok": True, "note": f"{name} done", "reference": f"REF{agent}{len(name)}"})


class Agent:
    """One agent's conversation: the system message, its task, then a call and a result per step."""

    def __init__(self, system: str, index: int, steps: int):
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": TASKS[index % len(TASKS)]}]
        self.script = scripted_steps(index, steps)
        self.index = index

    def advance(self, step: int, call: dict | None = None) -> None:
        """Appends step `step`'s call and its result: `call` as the model made it, else the script's."""
        if call is None:
            call, result = self.script[step]
        else:
            result = canned_result(self.index, call["function"]["name"])
        self.messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": call["id"], "content": result}]


def llama_peer(pc: PromptCache, threads: int):
    from pc_cpu.engine.llama.extra_buffers import llama_peer as load  # loaded as pc_cpu loads models

    return load(str(pc.model.path), n_ctx=pc.n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                flash_attn=pc.flash_attn, verbose=False)


def llama_step(peer, tokens: list[int], grammar, max_tokens: int) -> dict:
    """Returns Llama's TTFT on `tokens` (to its first streamed piece; with `grammar`, the answer held to a call)."""
    import time

    before = peer._input_ids.tolist()
    t0 = time.perf_counter()
    first = None
    for _ in peer.create_completion(prompt=tokens, max_tokens=max_tokens, temperature=0.0, grammar=grammar,
                                    stream=True):
        first = first or time.perf_counter()
    ms = ((first or time.perf_counter()) - t0) * 1000
    reused = 0
    while reused < min(len(before), len(tokens) - 1) and before[reused] == tokens[reused]:
        reused += 1
    return {"ttft_ms": round(ms, 1), "cached_tokens": reused, "computed_tokens": len(tokens) - reused}


def pc_step(pc: PromptCache, messages: list[dict], *, use_cache: bool, max_tokens: int) -> tuple[dict, dict | None]:
    """Returns pc_cpu's record of a step and the call it answered with (None for a one-token answer)."""
    r = pc.chat(messages, tools=TOOLS, tool_choice="required" if max_tokens > 1 else "auto",
                parallel_tool_calls=False, max_tokens=max_tokens, use_cache=use_cache)
    record = {"ttft_ms": round(r.ttft_ms, 1), "cached_tokens": r.cached_tokens, "computed_tokens": r.uncached_tokens,
              "tier": str(r.tiers.get("#conversation", "-"))}
    return record, (r.tool_calls[0] if r.tool_calls else None)


def run_scenario(model: str, args, system: str, agents: int) -> list[dict]:
    """Returns one record per (agent, step, system) of one repeat of a scenario, on a fresh cache and Llama."""
    store = Path(tempfile.mkdtemp(prefix="pc_cpu_agent_loop_"))
    pc = PromptCache(model, threads=args.threads, parallel=max(4, agents + 1), store=store, n_ctx=args.n_ctx)
    peer = llama_peer(pc, args.threads)
    generated = args.calls == "generated"
    grammar = None
    if generated:  # Llama held to the same calls as pc_cpu ("required", one call): the same answers, greedy
        from llama_cpp.llama_grammar import LlamaGrammar

        from pc_cpu.engine.llama.grammar import tool_call_grammar
        from pc_cpu.pml.tools import ToolChoice, check_tools

        grammar = LlamaGrammar.from_string(tool_call_grammar(check_tools(TOOLS), ToolChoice("required"),
                                                             parallel=False), verbose=False)
    answer_tokens = args.call_tokens if generated else 1
    try:
        warm = [{"role": "user", "content": "Say hi."}]  # first-call allocations, page faults: untimed
        pc.chat(warm, max_tokens=1)
        peer.create_completion(prompt=list(pc.conversations.prompt(warm).tokens), max_tokens=1)
        peer.reset()
        crew = [Agent(system, i, args.steps) for i in range(agents)]
        records = []
        before = {agent.index: 0 for agent in crew}  # each agent's prompt at its step before
        for step in range(args.steps):
            for agent in crew:
                tokens = list(pc.conversations.prompt(agent.messages, tools=TOOLS).tokens)
                row = {"agent": agent.index, "step": step + 1, "prompt_tokens": len(tokens),
                       "new_tokens": len(tokens) - before[agent.index]}
                before[agent.index] = len(tokens)
                record, call = pc_step(pc, agent.messages, use_cache=True, max_tokens=answer_tokens)
                records.append(row | {"system": "pc_cpu", **record})
                pc.wait_idle()  # the tool runs: pc_cpu repairs the answer's cells meanwhile
                records.append(row | {"system": "Llama", **llama_step(peer, tokens, grammar, answer_tokens)})
                if agents == 1 or not args.no_full_interleaved:
                    record, _ = pc_step(pc, agent.messages, use_cache=False, max_tokens=1)
                    records.append(row | {"system": "full prefill", **record})
                    pc.wait_idle()
                agent.advance(step, call if generated else None)
                print(f"  agent {agent.index} step {step + 1}: " + ", ".join(
                    f"{r['system']} {r['ttft_ms']:.0f} ms ({r['computed_tokens']} computed)"
                    for r in records[-3:] if r["step"] == step + 1 and r["agent"] == agent.index),
                    file=sys.stderr, flush=True)
        return records
    finally:
        pc.close()
        del peer


def summarize(records: list[dict], steps: int) -> dict:
    """Returns per step the median TTFT and computed tokens of each system, and the goals' ratios."""
    by = {}
    for r in records:
        by.setdefault((r["system"], r["step"]), []).append(r)
    systems = sorted({r["system"] for r in records})
    table = {s: [{"step": k, "ttft_ms": statistics.median(x["ttft_ms"] for x in by[(s, k)]),
                  "computed_tokens": statistics.median(x["computed_tokens"] for x in by[(s, k)]),
                  "prompt_tokens": statistics.median(x["prompt_tokens"] for x in by[(s, k)])}
                 for k in range(1, steps + 1) if (s, k) in by] for s in systems}
    later = lambda s: [row["ttft_ms"] for row in table[s] if row["step"] > 1]
    ratios = {"pc_cpu_over_llama_median_steps_2_on": statistics.median(
        a / b for a, b in zip(later("pc_cpu"), later("Llama"))),
        "llama_over_pc_cpu_total_steps_2_on": sum(later("Llama")) / sum(later("pc_cpu"))}
    if "full prefill" in table:
        ratios["full_over_pc_cpu_total_steps_2_on"] = sum(later("full prefill")) / sum(later("pc_cpu"))
    return {"per_step": table, "ratios": ratios}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--system-tokens", type=int, default=2000, help="tokens of the system message (tools add ~1,000)")
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--no-full-interleaved", action="store_true", help="skip the full prefill when interleaved")
    parser.add_argument("--calls", choices=("generated", "scripted"), default="generated",
                        help="generated: each step's call is pc_cpu's answer (tool_choice required, one call; "
                             "Llama held to the same grammar), sent back with a canned result; scripted: the same "
                             "calls for every system, each answer one token")
    parser.add_argument("--call-tokens", type=int, default=64, help="max_tokens of a generated call")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/agent_loop.json")
    parser.add_argument("--quick", action="store_true", help="qwen2.5-coder-0.5b, 3 steps, 2 agents, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.steps, args.agents, args.repeats = ["qwen2.5-coder-0.5b"], 3, 2, 1
    report = new_report("agent_loop.py", argv)
    missed = []
    for model in args.model or DEFAULT_MODELS:
        probe = PromptCache(model, threads=args.threads, n_ctx=args.n_ctx, store=False)
        tokenize = lambda t: probe.model.tokenize(t, special=False)
        system = INSTRUCTIONS + "\nReference notes:\n" + reference_notes(args.system_tokens, tokenize)
        prompt_tokens = len(probe.conversations.prompt(Agent(system, 0, 1).messages, tools=TOOLS).tokens)
        probe.close()
        print(f"{model}: step 1 is {prompt_tokens} tokens", file=sys.stderr, flush=True)
        entry = {"step1_prompt_tokens": prompt_tokens, "scenarios": {}}
        for scenario, agents in (("single", 1), ("interleaved", args.agents)):
            records = []
            for repeat in range(args.repeats):
                print(f"{model}: {scenario}, repeat {repeat + 1}", file=sys.stderr, flush=True)
                records += [r | {"repeat": repeat} for r in run_scenario(model, args, system, agents)]
            entry["scenarios"][scenario] = {"agents": agents, **summarize(records, args.steps), "records": records}
        single = entry["scenarios"]["single"]["ratios"]["pc_cpu_over_llama_median_steps_2_on"]
        inter = entry["scenarios"]["interleaved"]["ratios"]["llama_over_pc_cpu_total_steps_2_on"]
        # Only what is new: every step after the first computes the tokens its call and result added, no more
        # (the last step's token of the answer before is computed again: it is one token).
        only_new = all(r["computed_tokens"] <= r["new_tokens"] for scenario in entry["scenarios"].values()
                       for r in scenario["records"] if r["system"] == "pc_cpu" and r["step"] > 1)
        computed = [row["computed_tokens"] for row in entry["scenarios"]["single"]["per_step"]["pc_cpu"][1:]]
        entry["goals"] = {"only_new_tokens_computed": only_new, "single_within_1.05x_llama": single <= 1.05,
                          "interleaved_5x_faster_than_llama": inter >= 5}
        missed += [f"{model}: {goal}" for goal, ok in entry["goals"].items() if not ok]
        report["models"][model] = entry
        print(f"{model}: single pc_cpu/Llama {single:.2f}x (median, steps 2+); interleaved Llama/pc_cpu "
              f"{inter:.1f}x (total, steps 2+); pc_cpu computed per step {computed}", flush=True)
    write_report(report, args.out, missed)


if __name__ == "__main__":
    main()
