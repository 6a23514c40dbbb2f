"""GPU, a bound, not a path: `dflash bench` with the decode graphs' input staging skipped (their outputs are then
wrong; only the timing means anything), to see what staging a step's token id and positions costs a plain step.

  STAGING_SKIP=ids|ids,positions python benchmarks/staging_bound.py <dflash bench arguments>
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine import graphs  # noqa: E402

skip = set(filter(None, os.environ.get("STAGING_SKIP", "").split(",")))
if "ids" in skip:
    graphs.stage = lambda dst, src: None
if "positions" in skip:
    graphs.stage_positions = lambda dst, start: None

from dflash_cli.cli.app import main  # noqa: E402

sys.argv = ["dflash", *sys.argv[1:]]
main()
