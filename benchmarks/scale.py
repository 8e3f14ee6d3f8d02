"""Scale: the launcher against 8, 64, 256 hosts, every scale question in one run per size, for the growth table.

Each question is its own script, with its steps and what they measure in its docstring: scale_doctor.py (doctor's
time and its checks that are not PASS), scale_up.py (up / status / down against the floor), scale_failfast.py (a
rank's exit to none left), scale_hostloss.py (a frozen host named), scale_logs.py (lines lost or out of order). This
runs them one after the other on the same cluster of each size, with the floors before and after them
(`harness.sizes`: the method, the targets and the tables), so that their figures share one run.

Run (root, dockerd up):
  .venv/bin/python benchmarks/scale.py --hosts 8,64,256 [--engines E] [--lines 20000] [--keep] [--json FILE]
  .venv/bin/python benchmarks/scale.py --hosts 64 --steps up_status_down      # some questions only (floors always)
  .venv/bin/python benchmarks/scale.py --config FILE --cluster NAME            # a cluster that is already up
"""

from __future__ import annotations

import sys

import scale_logs
from harness import sizes
from scale_doctor import step_doctor
from scale_failfast import step_failfast
from scale_hostloss import step_hostloss
from scale_up import step_up_status_down

STEPS = [("doctor", step_doctor), sizes.FLOOR_BEFORE, ("up_status_down", step_up_status_down),
         ("failfast", step_failfast), ("hostloss", step_hostloss), ("logs", scale_logs.step_logs), sizes.FLOOR_AFTER]

if __name__ == "__main__":
    parser = sizes.arguments(__doc__)
    parser.add_argument("--steps",
                        help="only these steps (doctor,up_status_down,failfast,hostloss,logs); floors always")
    scale_logs.add_arguments(parser)
    sys.exit(sizes.main(parser.parse_args(), STEPS))
