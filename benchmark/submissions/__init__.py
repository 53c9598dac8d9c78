"""Submissions: ``bt-bench submit`` writes ``submissions/NAME/``, ``bt-bench verify`` re-scores it.

One module per role, lowest first (``a <- b``: b imports a):

* :mod:`~benchmark.submissions.files`: the folder, ``submission.yaml`` (strict), loading;
* :mod:`~benchmark.submissions.compare`: committed vs recomputed results, drift by path;
* :mod:`~benchmark.submissions.panel`: the season panel file (draws, bindings), entry scores,
  the panel score (draws fixed) and the family interval;
* :mod:`~benchmark.submissions.screen`: the screen of candidate draws, the panel's power;
* :mod:`~benchmark.submissions.seasons`: ``bt-bench panel new|show|score|bind|screen``;
* :mod:`~benchmark.submissions.scope`: what one verify run re-scores (bound entries sampled);
* :mod:`~benchmark.submissions.gate`: the fresh-draw gate and the attack controls' checks;
* :mod:`~benchmark.submissions.verify` and :mod:`~benchmark.submissions.submit`: the commands.

files, compare <- panel <- screen <- seasons; panel <- scope, gate <- verify <- submit. The
public names are re-exported here.
"""

from benchmark.submissions.compare import (
    CAUSAL_TOLERANCE,
    FLOAT_TOLERANCE,
    IGNORED_KEYS,
    Drift,
    compare_results,
)
from benchmark.submissions.files import (
    ALLOWED_KEYS,
    ATTACK_CONTROLS_DIR,
    ESTIMATOR_FILE,
    METADATA_FILE,
    REQUIRED_KEYS,
    RESULTS_FILE,
    Submission,
    SubmissionError,
    _dump_metadata,
    check_not_running,
    check_results_text,
    find_not_running,
    find_submissions,
    load_submission,
    validate_metadata,
)
from benchmark.submissions.panel import PANEL_FILE, Panel, PanelError, load_panel
from benchmark.submissions.seasons import new_panel
from benchmark.submissions.submit import submit, submit_command
from benchmark.submissions.verify import (
    VerifyReport,
    _failure_fix,
    verify,
    verify_command,
    verify_submission,
)

__all__ = [
    "ALLOWED_KEYS",
    "ATTACK_CONTROLS_DIR",
    "CAUSAL_TOLERANCE",
    "ESTIMATOR_FILE",
    "FLOAT_TOLERANCE",
    "IGNORED_KEYS",
    "METADATA_FILE",
    "PANEL_FILE",
    "REQUIRED_KEYS",
    "RESULTS_FILE",
    "Drift",
    "Panel",
    "PanelError",
    "Submission",
    "SubmissionError",
    "VerifyReport",
    "_dump_metadata",
    "_failure_fix",
    "check_not_running",
    "check_results_text",
    "compare_results",
    "find_not_running",
    "find_submissions",
    "load_panel",
    "load_submission",
    "new_panel",
    "submit",
    "submit_command",
    "validate_metadata",
    "verify",
    "verify_command",
    "verify_submission",
]
