"""`toolfence eval`: labelled cases run as durable turns on a real fleet, scored as five
figures kept apart: the model's half (tool selection, argument validation) and the
executor's (violations caught, side effects exact by the downstream's own records,
final answers that agree with the results). See docs/eval.md.

- `fixtures`: the JSONL format and its loader (one clear error per bad line);
- `drivers`: the recorded-response and perturbing drivers (scripts per turn);
- `runner`: the run directory, its manifest, turns started N at a time, resumable;
- `scoring` and `report`: the figures, the report (JSON, Markdown, HTML), comparison;
- `declared` and `bfcl`: tools a fixtures file declares (BFCL's), and BFCL's import.
"""
