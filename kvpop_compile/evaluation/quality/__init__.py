"""``kvpop-compile eval``: how much of full attention's text quality each bounded cache keeps.

- :mod:`.measure`: every method over the sequences, per-sequence sums of three protocols
  (teacher-forced, greedy continuation, prompt compression);
- :mod:`.long_range`: the positions where the next bytes complete an identifier last seen long
  ago;
- :mod:`.run`: :func:`evaluate` / :func:`evaluate_sequences`, and :func:`write_report`
  (``quality.json``, ``quality.md``, the plots);
- :mod:`.report`: the summaries, paired differences, tables and targets; :mod:`.plots`: the PNGs;
- :mod:`.answers`: a user's own questions (``eval --data records.jsonl``), exact match per
  method.
"""

from .answers import evaluate_answers
from .measure import PROTOCOLS, EvalSettings, run_eval
from .run import evaluate, evaluate_sequences, write_report

__all__ = [
    "PROTOCOLS",
    "EvalSettings",
    "evaluate",
    "evaluate_answers",
    "evaluate_sequences",
    "run_eval",
    "write_report",
]
