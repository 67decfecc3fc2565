"""``dreamshard report``: print (and plot) an observer's report of a running job."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  dreamshard report report.json
  dreamshard report report.json --plot report.png

REPORT.json: what `observer.report()` returned, saved with json.dump (see docs/feedback.md):
{"ranks": [{"rank": 0, "predicted_ms": ..., "measured_ms": ..., "error": ...,
            "predicted": {...}, "measured": {...}, "tables": [...]}, ...],
 "bound_rank": 0, "predicted_bound_rank": 0, "steps_observed": 8, "model": "checkpoint",
 "memory": {"ranks": [{"rank": 0, "predicted": ..., "measured": ..., "peak": ..., "cap": ...,
            "off": [...], "tables": [...]}, ...], "near_cap": [...]}}
With "memory", it also prints each rank's memory (the plan's storage estimate against what
the rank held), the tables and parts that were off and a warning for a rank near its cap,
and --plot draws it beside the time.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="show a running job's report: each rank's predicted against measured cost and memory",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", metavar="REPORT.json", help="a saved observer.report()")
    p.add_argument("--plot", metavar="REPORT.png", help="per-rank bars: measured and predicted")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.feedback.observed_job_report import (
        check_report,
        plot_report,
        report_lines,
    )
    from torchrec_dreamshard.io import check_writable, read_json

    if args.plot:
        check_writable(args.plot, "--plot file")
    report = check_report(read_json(args.report, "report file"), args.report)
    print("\n".join(report_lines(report)))
    if args.plot:
        plot_report(report, args.plot)
        print(f"wrote {args.plot}")
    return 0
