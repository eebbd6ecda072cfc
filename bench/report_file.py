"""Gives the bench scripts' JSON report: its header (date, commit, machine, command) and how it is written and judged."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from chat_turns import git_commit, machine


def new_report(script: str, argv) -> dict:
    """Returns a report's header for `script` run with `argv` (None: this process's arguments)."""
    return {"date": datetime.date.today().isoformat(), "commit": git_commit(), "machine": machine(),
            "command": f"python bench/{script} " + " ".join(argv if argv is not None else sys.argv[1:]),
            "models": {}}


def write_report(report: dict, out: Path, missed: list[str]) -> None:
    """Writes `report` to `out`; exits 1 after naming the goals `missed`, if any."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}", flush=True)
    if missed:
        print("missed: " + "; ".join(missed), flush=True)
        raise SystemExit(1)
