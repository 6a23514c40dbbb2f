"""`dflash train` with some of a preset's fields changed, for trying a recipe variant on the GPU before it
becomes the preset (benchmarks/train_variants_gpu.sh runs several side by side). Usage:
    python benchmarks/train_variant.py "dflash_blocks=64;block_sizes=(16,)" train /tmp/demo --preset demo ...
Values are parsed as Python literals; a winning variant is then written into training/presets.py."""

import ast
import os
import sys
from dataclasses import fields, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.training import presets  # noqa: E402

names = {f.name for f in fields(presets.Preset)}
changes = {}
for item in filter(None, sys.argv[1].split(";")):
    key, _, value = item.partition("=")
    if key not in names:
        sys.exit(f"error: the preset has no field '{key}'")
    changes[key] = ast.literal_eval(value)
sys.argv = ["dflash", *sys.argv[2:]]
name = sys.argv[sys.argv.index("--preset") + 1] if "--preset" in sys.argv else presets.DEMO.name
presets.PRESETS[name] = replace(presets.get(name), **changes)
print(f"preset {name} with {changes}", flush=True)
from dflash_cli.cli.app import main  # noqa: E402

main()
