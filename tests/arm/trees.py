"""Write the recorded Neoverse trees the Arm tier gives cpuperf (tests/hosts.py make_arm_host): DIR/<kind> for
neoverse_v1, neoverse_v2 and neoverse_n1, two CPUs each like the machines the tier runs on.

    python tests/arm/trees.py DIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hosts import ARM_PARTS, make_arm_host  # noqa: E402

if __name__ == "__main__":
    out = Path(sys.argv[1])
    for kind in ARM_PARTS:
        make_arm_host(out / kind, kind)
        print(out / kind)
